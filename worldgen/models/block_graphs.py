"""The causal DiT's blocks replayed as CUDA graphs between their self-attentions: few host launches a block.

A warm Fast forward waits on the host, not the GPU: at 320x576 the CPU took 168.8 ms to launch what
the H100 ran in 97.3 ms (docs/benchmarks.md, "Session 23: Fast"), at 480x832 214.7 against 196.8 ms
("Session 15"). `worldgen.models.chunk_graph` captures a whole forward, so it replays only where the
KV cache's window repeats (a rolling window, after the first chunks) and its pool holds a forward's
activations. Here the part of each block whose shapes depend on the cache (its write into the
cache and the attention over the window: `SelfAttention.attention_output`) runs eagerly, and
everything between two of them is one graph:

    G_0 = block 0 up to its attention's inputs (q, k, v; q in e4m3 too for cuDNN's FP8 attention)
    G_b = block b-1's output projection and the rest of it, then block b up to its attention's inputs
    G_n = block n-1's output projection and the rest of it

(The output projection and the query's FP8 quantization sat in the eager part at first: 11 launches a
block the host paid on every replay, docs/benchmarks.md, "Session 24: Fast".)

One capture serves every step and every chunk of a rollout, whatever the window. What crosses a
graph's edge lives in buffers held here (the residual stream, the time modulation, the RoPE tables,
q/k/v, the attention's output, the camera's inputs) and is copied in before a replay (cuDNN's FP8
attention writes its output straight into its buffer); what a graph
allocates inside is temporary, so all of them share one memory pool, the size of the largest.
Every graph runs the kernels of the eager forward on the same shapes, so replays give the eager
forward's numbers (tested bit for bit on the GPU).

The calls of a rollout share a key (token count, the kind of each block's camera input, the text
keys/values of the cache); a key seen on two calls in a row is captured on the second, and the calls
after it replay. A capture that fails (of these or of `chunk_graph`'s) means eager blocks for the rest of the process, said once.
A sequence-parallel rank (`worldgen.models.sequence_parallel`, two GPUs) replays the same graphs over its
rows: its all-to-alls sit in the eager part (`SequenceParallel.attention_output`), so each rank captures on
its own and a rank's eager and replayed forwards make the same collectives.
Should cuDNN decline a later window's shape (the attention then comes back in bf16, not in the FP8
buffer the graphs read), that forward's remaining blocks run eagerly and the graphs are dropped.
On the CPU nothing is captured: the same eager blocks run, and `decisions` keeps the bookkeeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from worldgen.kernels.fp8 import QuantizedTensor
from worldgen.models.chunk_graph import _failed, capture_failed  # one record: a failed capture ends both kinds

if TYPE_CHECKING:
    from worldgen.models.dit import WanCameraDiT
    from worldgen.models.kv_cache import KVCache


def camera_kind(cam) -> str | None:
    """A block's camera input: None, "pair" (its (scale, shift), from a camera cache) or "tokens"."""
    return None if cam is None else "pair" if isinstance(cam, tuple) else "tokens"


class BlockGraphs:
    """`model.block_graphs`: runs the blocks of `WanCameraDiT.forward_tokens` (see the module's docstring).
    One per rollout: its graphs read the rollout's KV cache's text keys/values; `close` drops them."""

    def __init__(self, allowed: bool = True):
        self.allowed = allowed
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.key: tuple | None = None
        self.last_key: tuple | None = None
        self.static: dict[str, torch.Tensor] = {}
        self.fp8 = False  # the captured blocks' attention is cuDNN's FP8 kernel (buffers q8, o8 and their scales)
        self.text: torch.Tensor | None = None  # the captured cache's text keys (held: its id is in the key)
        self.decisions: list[str] = []  # per call: "eager", "capture" or "replay" (on the CPU: what would be)
        self.captures = 0
        self.reserved_bytes = 0  # what the last capture added to the CUDA allocator's reserve (buffers, pool)

    def __call__(
        self,
        model: WanCameraDiT,
        tokens: torch.Tensor,
        e0: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor | None,
        cams: list,
        cache: KVCache,
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """The blocks over `tokens`, as `WanCameraDiT.run_blocks` (`context`: the embedded text, for a cache
        that has no text keys/values yet: such a call runs eagerly)."""
        text = cache.layers[0].cross[0] if cache.has_text else None
        key = (tuple(tokens.shape), tokens.dtype, tuple(camera_kind(c) for c in cams), id(text))
        decision = "eager"
        if text is not None and key == self.key:
            decision = "replay"
        elif text is not None and key == self.last_key and not keys_only:
            decision = "capture"
        self.last_key = key
        if not (tokens.is_cuda and self.allowed and not _failed):
            if not tokens.is_cuda and decision == "capture":
                self.key = key  # on the CPU only the bookkeeping: what would be captured and replayed
            self.decisions.append(decision if not tokens.is_cuda else "eager")
            return model.run_blocks(tokens, e0, rope, context, cams, cache, keys_only)
        if decision == "capture" and not self._capture(model, tokens, e0, rope, cams, cache, key, text):
            decision = "eager"
        self.decisions.append(decision)
        if decision == "eager":
            return model.run_blocks(tokens, e0, rope, context, cams, cache, keys_only)
        return self._replay(model, tokens, e0, rope, cams, cache, keys_only)

    # -- capture and replay -------------------------------------------------------------------------------

    def _statics(self, model: WanCameraDiT, tokens, e0, rope, cams) -> dict[str, torch.Tensor]:
        cfg, dtype = model.cfg, model.compute_dtype
        b, length, _ = tokens.shape
        static = {"x": tokens.clone(), "e0": e0.clone(), "cos": rope[0].clone(), "sin": rope[1].clone()}
        for name in ("q", "k", "v"):
            static[name] = torch.empty(b, length, cfg.num_heads, cfg.head_dim, dtype=dtype, device=tokens.device)
        # a sequence-parallel rank's attention hands back its rows in the compute dtype (its FP8 output dequantized)
        self.fp8 = model.sequence_parallel is None and model.blocks[0].self_attn.takes_fp8_attention(static["q"])
        if self.fp8:  # e4m3 q and output, each with its one scale
            for name in ("q8", "o8"):
                static[name] = torch.empty(static["q"].shape, dtype=torch.float8_e4m3fn, device=tokens.device)
                static[f"{name}_descale"] = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=tokens.device)
        else:  # the attention's output before its projection
            static["attended"] = torch.empty(b, length, cfg.dim, dtype=dtype, device=tokens.device)
        pair = next((c for c in cams if camera_kind(c) == "pair"), None)
        if pair is not None:
            static["cam_scale"], static["cam_shift"] = pair[0].clone(), pair[1].clone()
        camera_tokens = next((c for c in cams if camera_kind(c) == "tokens"), None)
        if camera_tokens is not None:
            static["cam_tokens"] = camera_tokens.clone()
        return static

    def _camera(self, cams: list, i: int):
        kind = camera_kind(cams[i])
        if kind == "pair":
            return self.static["cam_scale"], self.static["cam_shift"]
        return self.static["cam_tokens"] if kind == "tokens" else None

    def _segment(self, model: WanCameraDiT, b: int, cams: list, cache: KVCache) -> None:
        """G_b's work, on the static buffers (see the module's docstring)."""
        s, blocks = self.static, model.blocks
        if b > 0:
            block = blocks[b - 1]
            attended = block.self_attn.project_out(self._attended())
            x = block.after_attention(
                s["x"], block.modulations(s["e0"]), attended, None, self._camera(cams, b - 1), cache.layers[b - 1]
            )
            s["x"].copy_(x)
            del x, attended
        if b < len(blocks):
            values = dict(zip("qkv", blocks[b].attention_inputs(s["x"], s["e0"], (s["cos"], s["sin"])), strict=True))
            if self.fp8:
                q8 = blocks[b].self_attn.fp8_query(values["q"])
                values["q8"], values["q8_descale"] = q8.data, q8.descale
            for name, value in values.items():
                if value.shape != s[name].shape or value.dtype != s[name].dtype:
                    raise RuntimeError(f"block {b}'s {name} is {tuple(value.shape)} {value.dtype}, not {s[name].dtype}")
                s[name].copy_(value)

    def _attended(self) -> torch.Tensor | QuantizedTensor:
        """The buffer(s) that hold a block's attention output between the eager part and the next graph."""
        s = self.static
        return QuantizedTensor(s["o8"], s["o8_descale"]) if self.fp8 else s["attended"]

    def _capture(self, model, tokens, e0, rope, cams, cache, key, text) -> bool:
        """Capture G_0 .. G_n (nothing runs: the replay that follows makes this call's result)."""
        self.close()
        device = tokens.device
        reserved = torch.cuda.memory_reserved(device)
        self.static = self._statics(model, tokens, e0, rope, cams)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        graphs = []
        try:
            with torch.cuda.stream(stream):
                for b in range(len(model.blocks) + 1):
                    graph = torch.cuda.CUDAGraph()
                    graph.capture_begin(pool=pool)
                    try:
                        self._segment(model, b, cams, cache)
                    finally:
                        graph.capture_end()
                    graphs.append(graph)
        except Exception as exc:  # noqa: BLE001  (a kernel that cannot be captured: eager from now on)
            capture_failed("the DiT's blocks as CUDA graphs", "eager blocks", exc)
            del graphs
            self.close()
            torch.cuda.synchronize(device)
            return False
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graphs, self.key, self.text = graphs, key, text
        self.captures += 1
        self.reserved_bytes = torch.cuda.memory_reserved(device) - reserved
        return True

    def _replay(self, model, tokens, e0, rope, cams, cache, keys_only) -> torch.Tensor | None:
        s, blocks = self.static, model.blocks
        for name, value in (("x", tokens), ("e0", e0), ("cos", rope[0]), ("sin", rope[1])):
            s[name].copy_(value)
        if "cam_tokens" in s:
            s["cam_tokens"].copy_(next(c for c in cams if camera_kind(c) == "tokens"))
        last = len(blocks) - 1
        for b, graph in enumerate(self.graphs):
            if b > 0 and camera_kind(cams[b - 1]) == "pair":  # block b-1's (scale, shift), read in G_b
                s["cam_scale"].copy_(cams[b - 1][0])
                s["cam_shift"].copy_(cams[b - 1][1])
            graph.replay()
            if b > last:
                break
            if keys_only and b == last:
                if model.sequence_parallel is not None:  # a rank's keys go to their heads' ranks first
                    model.sequence_parallel.write_keys(cache.layers[b], s["k"], s["v"])
                else:
                    cache.layers[b].write(s["k"], s["v"])
                return None
            q8 = QuantizedTensor(s["q8"], s["q8_descale"]) if self.fp8 else None
            attn = blocks[b].self_attn
            out = attn.attention_output(s["q"], s["k"], s["v"], cache.layers[b], q8, s.get("o8"))
            if self.fp8 and isinstance(out, QuantizedTensor) and out.data is s["o8"]:
                s["o8_descale"].copy_(out.descale)
            elif not self.fp8 and not isinstance(out, QuantizedTensor):
                s["attended"].copy_(out)
            else:  # cuDNN declined this window (bf16 attention came back): the rest of this forward eagerly
                x = blocks[b].after_attention(
                    s["x"], blocks[b].modulations(s["e0"]), attn.project_out(out), None, cams[b], cache.layers[b]
                )
                self.close()
                self.allowed = False
                return model.run_blocks(x, s["e0"], (s["cos"], s["sin"]), None, cams, cache, keys_only, start=b + 1)
        return s["x"]

    def close(self) -> None:
        """Drop the graphs, their pool and the buffers."""
        self.graphs, self.static = [], {}
        self.key = self.text = None
