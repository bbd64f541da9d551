"""Compile a Fast job's kernels beside its first phases, on a one-block copy of the DiT.

In a fresh process the first chunk's forwards compile the fused elementwise kernels
(`worldgen.kernels.fused`, Inductor), the FP8 quantizers and the NF4 -> FP8 weight kernel (Triton),
and build cuDNN's attention graphs: 18-20 s of a 25 s first chunk on the H100, and still ~2.8 s with
the compile cache warm (docs/benchmarks.md, "Session 9: Fast"). None of that depends on the model's
depth or weights, only on its widths, layout and compute and on the job's token counts. So while the
main thread encodes the prompt, loads the DiT and encodes the first chunk's frames, a thread runs a
one-block DiT of the same config (random weights, the checkpoint's layout) through the job's chunk
sequence under the plan the job got (each KV-window length once, `warm_forwards`), and the job's
own forwards find every kernel built. A thread, not a process: compiled code and cuDNN's graphs live
in the process that compiled them; Inductor compiles its Triton kernels in worker processes, so the
thread spends most of its time without the GIL.

It never changes a job's numbers (its model is its own, and the job waits for it before its first
forward, `CompileAhead.join`); a failure in it is said in one warning and the job compiles as it goes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from worldgen.models.dit import DiTConfig, Linear, WanCameraDiT

if TYPE_CHECKING:
    from worldgen.models.kv_cache import KVCache
    from worldgen.pipelines.fast import FastPipeline
    from worldgen.pipelines.fast_plan import FastOptions

JOIN_TIMEOUT_S = 600.0  # far above the slowest compile seen (~35 s); past it the job goes on without it


def warm_forwards(
    forward: Callable,
    model: WanCameraDiT,
    cache: KVCache,
    chunks: int,
    options: FastOptions,
    lat_h: int,
    lat_w: int,
    device: torch.device,
) -> None:
    """The forwards of a job of `chunks` chunks at its shapes, on random inputs: once per chunk (each
    chunk a new KV-window length until the window rolls), the last chunk twice (a CUDA graph captures
    on the second call of a key). `forward` is `model` or a `ChunkGraphs` over it."""
    n = options.chunk_frames
    frame_tokens = (lat_h // 2) * (lat_w // 2)
    generator = torch.Generator("cpu").manual_seed(0)
    text_len = model.cfg.text_len
    context = [torch.zeros(text_len, model.text_embedding[0].in_features, device=device)]
    x = torch.randn(1, 16, n, lat_h, lat_w, generator=generator).to(device)
    y = torch.zeros(1, 20, n, lat_h, lat_w, device=device)
    cam = torch.zeros(1, 384, n, lat_h, lat_w, device=device)
    t = torch.full((1,), 999, dtype=torch.int64, device=device)
    for c in range(chunks):
        if c > 0:
            cache.grow()
        for _ in range(2 if c == chunks - 1 else 1):
            forward(x, t, context, y, cam, cache=cache, current_start=c * n * frame_tokens)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_block_copy(
    cfg: DiTConfig,
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
    compute: str,
    attention: str,
    ffn_chunk: int | None,
) -> WanCameraDiT:
    """A one-block DiT of `cfg` with random weights in the checkpoint's layout (`kind`: "bf16" or
    "nf4"), set up as the loader sets up the real one (`worldgen.pipelines.loader._prepared_expert`)."""
    with torch.device(device), torch.no_grad():
        model = WanCameraDiT(dataclasses.replace(cfg, num_layers=1)).to(dtype)
        if kind == "nf4":
            from worldgen.kernels.nf4 import quantize_weight
            from worldgen.runtime.checkpoint import swap_linears_for_nf4

            dense = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
            for name, nf4 in swap_linears_for_nf4(model, dtype).items():
                nf4.set_quant_state(quantize_weight(dense[name].weight.detach()), name)
                if nf4.bias is not None:
                    nf4.bias.copy_(dense[name].bias)
    model.requires_grad_(False)  # as loaded (`checkpoint._assign`): dynamo's guards see requires_grad
    model.set_ffn_chunk_tokens(ffn_chunk)
    model.set_attention_backend(attention)
    model.set_compute(compute)
    return model.eval()


class CompileAhead:
    """`target` (the one-block forwards) on a daemon thread from construction; `join` before the job's
    first forward. `report()` says how long it ran, how long the job waited for it, and any error."""

    def __init__(self, target: Callable[[], None]):
        self.seconds: float | None = None
        self.waited = 0.0
        self.error: str | None = None
        self.graphs_compiled: int | None = None  # dynamo's count of graphs compiled in this process, at the end
        self._thread = threading.Thread(target=self._run, args=(target,), name="lingbot-compile-ahead", daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            with torch.no_grad():  # grad mode is per thread; the job's forwards run without grad
                target()
        except Exception as exc:  # noqa: BLE001  (said at `join`: the job then compiles as it goes)
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        finally:
            self.seconds = time.perf_counter() - start
            self.graphs_compiled = compiled_graphs()

    def join(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        start = time.perf_counter()
        self._thread.join(timeout)
        self.waited = time.perf_counter() - start
        if self._thread.is_alive():
            warnings.warn(f"compiling ahead took over {timeout:.0f} s; the job goes on beside it", stacklevel=2)
        elif self.error:
            warnings.warn(f"compiling ahead failed ({self.error}); the job compiles as it goes", stacklevel=2)

    def report(self) -> dict:
        seconds = None if self.seconds is None else round(self.seconds, 2)
        return {
            "seconds": seconds,
            "waited": round(self.waited, 2),
            "error": self.error,
            "graphs": self.graphs_compiled,
        }


def compiled_graphs() -> int | None:
    """How many graphs dynamo has compiled in this process (a bench's check that a job compiled none of
    its own after compiling ahead); None where this PyTorch does not count them."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - depends on the PyTorch
        return None
    return int(counters["stats"]["unique_graphs"])


def start_for(pipe: FastPipeline, latent_frames: int, lat_h: int, lat_w: int, options: FastOptions) -> CompileAhead:
    """Compile what `pipe`'s next job (planned: `pipe.plan_job`) runs, on a thread."""
    cfg, device = pipe.dit_config, pipe.device
    frame_tokens = (lat_h // 2) * (lat_w // 2)
    chunks = latent_frames // options.chunk_frames
    attention = pipe.engine.get("attention", "sdpa") if hasattr(pipe, "engine") else "sdpa"
    ffn_chunk, compute = pipe.plan.ffn_chunk_tokens, pipe.compute

    def target() -> None:
        model = one_block_copy(cfg, pipe.dit_kind, device, pipe.dtype, compute, attention, ffn_chunk)
        cache = pipe.new_cache(latent_frames, frame_tokens, options, model.compute_dtype, num_layers=1)
        try:
            warm_forwards(model, model, cache, chunks, options, lat_h, lat_w, device)
        finally:
            cache.close()

    return CompileAhead(target)
