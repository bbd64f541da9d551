"""The causal DiT's chunk forward replayed from a CUDA graph, without per-call launch overhead.

A Fast rollout calls the DiT 4 times per chunk plus a cache refresh, and in a rolling KV cache every
chunk after the first few has the same token count, writes the same slots and reads the same window
(`KVCache.begin`: the eviction is done eagerly first, `KVCache.evict_now`, so the forward itself
only writes). Such a call is captured once as a CUDA graph (`torch.cuda.CUDAGraph`) over static
input buffers (the latent, the timestep, the condition, the camera, the RoPE tables of this chunk's
start frame) and the cache's own buffers, then replayed: the same kernels on the same memory, so the
same numbers as the eager forward. A call whose key (shapes, cache buffers and step) differs from
the captured one runs eagerly; a key seen on two calls in a row is captured on the second (the
first chunks, whose window still grows, run eagerly or get a short-lived graph of their own).

The graph keeps the forward's activations in its own memory pool while it lives (`allowed` is the
memory plan's say: under a VRAM budget the plan counts the pool, out of the KV cache); it is dropped
with the rollout (`close`). On the H100 its replays gave the eager forward's latents bit for bit. A capture that fails (a kernel that
cannot be captured) falls back to eager for the rest of the process, said once in a warning.
On the CPU nothing is captured: the calls run the same eager path (and keep the same bookkeeping,
`decisions`, which the tests check).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import torch

from worldgen.models.positions import rope_tables

if TYPE_CHECKING:
    from worldgen.models.dit import WanCameraDiT
    from worldgen.models.kv_cache import KVCache

ENV_SWITCH = "LINGBOT_ISAAC_CHUNK_GRAPHS"  # "1": capture (unset: every forward eager)
_failed: list[str] = []  # the first capture failure of this process (then eager for good)


def capture_failed(what: str, instead: str, exc: Exception) -> None:
    """Record a capture's failure (this process captures nothing more, `_failed`) and say it once."""
    _failed.append(str(exc))
    warnings.warn(f"capturing {what} failed ({str(exc).splitlines()[0][:300]}): {instead} from now on", stacklevel=3)


def enabled_by_environment() -> bool:
    return os.environ.get(ENV_SWITCH, "0").strip().lower() in ("1", "true", "yes", "on")


class ChunkGraphs:
    """Calls the DiT like `model(x, t, context, y, cam, cache=, current_start=)`, replaying a CUDA graph
    where the call repeats the last one's key. One per rollout (the graph points at its cache)."""

    def __init__(self, model: WanCameraDiT, allowed: bool = True):
        self.model = model
        self.allowed = allowed
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_key: tuple | None = None
        self.static: dict[str, torch.Tensor] = {}
        self.last_key: tuple | None = None
        self.decisions: list[str] = []  # per call: "eager", "capture" or "replay" (on the CPU: what would be)
        self.captures = 0

    def _key(self, x, t, y, cam, cache: KVCache) -> tuple:
        shapes = tuple(None if a is None else (tuple(a.shape), a.dtype) for a in (x, t, y, cam))
        return (shapes, cache.storage_key, cache.step)

    def __call__(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        context,
        y: torch.Tensor,
        cam: torch.Tensor | None,
        *,
        cache: KVCache,
        current_start: int,
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """`keys_only` (a cache refresh): where the call runs eagerly, only what the cache takes is
        computed and None comes back (`WanCameraDiT.forward_tokens`); a capture or replay runs it whole."""
        model = self.model
        f, h, w = model.grid(x)
        cache.begin(current_start, f * h * w)
        cache.evict_now()
        rope = rope_tables(model.cfg.head_dim, (f, h, w), x.device, current_start // (h * w))
        key = self._key(x, t, y, cam, cache)
        # the text keys/values are made on the cache's first call, the camera cache decides on the host
        capturable = cache.has_text and model.camera_cache is None and model.time_cache is None
        decision = "eager"
        if capturable and key == self.graph_key:
            decision = "replay"
        elif capturable and key == self.last_key:
            decision = "capture"
            self.graph_key = key  # on the CPU only the bookkeeping: nothing is captured
        self.last_key = key
        cuda = x.is_cuda and self.allowed and not _failed
        out = None
        if cuda and decision == "capture":
            out = self._capture(x, t, y, cam, cache, rope, key)
            decision = "capture" if out is not None else "eager"
        elif cuda and decision == "replay" and self.graph is not None:
            out = self._replay(x, t, y, cam, rope)
        if out is None:
            out = model.forward_tokens(x, t, context, y, cam, cache, rope, keys_only)
        self.decisions.append(decision)
        cache.commit()
        return out

    def _inputs(self, x, t, y, cam, rope) -> dict[str, torch.Tensor | None]:
        return {"x": x, "t": t, "y": y, "cam": cam, "cos": rope[0], "sin": rope[1]}

    def _replay(self, x, t, y, cam, rope) -> torch.Tensor:
        for name, value in self._inputs(x, t, y, cam, rope).items():
            if value is not None:
                self.static[name].copy_(value)
        self.graph.replay()
        return self.static["out"].clone()  # the next replay overwrites it

    def _capture(self, x, t, y, cam, cache, rope, key) -> torch.Tensor | None:
        self.graph, self.static = None, {}  # the previous graph and its pool go first
        static = {name: None if v is None else v.clone() for name, v in self._inputs(x, t, y, cam, rope).items()}
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(x.device)
        try:
            with torch.cuda.graph(graph):
                static["out"] = self.model.forward_tokens(
                    static["x"], static["t"], None, static["y"], static["cam"], cache, (static["cos"], static["sin"])
                )
        except Exception as exc:  # noqa: BLE001  (a kernel that cannot be captured: eager from now on)
            capture_failed("the Fast chunk forward as a CUDA graph", "eager forwards", exc)
            del graph
            self.graph_key = None
            torch.cuda.synchronize(x.device)
            return None
        self.graph, self.graph_key, self.static = graph, key, static
        self.captures += 1
        graph.replay()  # capturing ran nothing: this call's result
        return static["out"].clone()

    def close(self) -> None:
        """Drop the graph and its memory pool."""
        self.graph = self.graph_key = None
        self.static = {}
