"""Whether a DiT forward waits on the host (Python and launches) or on the GPU, block by block.

`blocks_timed(n)` times each block of the n-th DiT forward of the region (counted by
`WanCameraDiT.forward_tokens`): the device is synchronised, kept busy by a sleep kernel long enough for
the block's launches never to wait for a queue slot, then the block is enqueued. The CPU's seconds to
enqueue it, against the GPU's seconds to run it (CUDA events after the sleep), say which one bounds the
forward: a CPU figure above the GPU's means fewer or cheaper launches (or CUDA graphs) win time and GPU
kernel work does not. Session 15 found a warm fp8 Fast forward bound this way (docs/benchmarks.md,
"Session 15: Fast": 214.7 ms against 196.8 ms over 40 blocks). Only the timed forward is slowed (by the
sleeps and syncs), and its output is unchanged. Off CUDA the GPU column is empty. The forward after it
runs the same way under `cProfile`, which says where the host's time goes (functions by their own time;
the profiler's own cost inflates the many small calls, so read it for the order, not the figures).
The forward after that is timed whole, in stretches of about a block, each behind a sleep: what the host
pays for a forward whatever runs its blocks, also where `worldgen.models.block_graphs` replays them and
no block's `forward` is called.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import pstats
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from worldgen.kernels import triton_lang
from worldgen.models.dit import Block, WanCameraDiT

SLEEP_CYCLES = 30_000_000  # ~20 ms on an H100: longer than any block's launches


@dataclasses.dataclass
class BlockTimes:
    forward: int  # which forward of the region was timed (1-based)
    cpu: list[float] = dataclasses.field(default_factory=list)  # seconds to enqueue each block
    gpu: list[float] = dataclasses.field(default_factory=list)  # seconds the GPU ran each (CUDA only)
    forwards_seen: int = 0
    launches: list[int] = dataclasses.field(default_factory=lambda: [0, 0])  # (direct, through Triton)
    host_functions: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)  # the next forward's
    engine_functions: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)  # (cumulative ms)
    whole: tuple[float, float, int] | None = None  # forward + 2, whole: CPU and GPU seconds, stretches timed

    def whole_summary(self) -> str:
        if self.whole is None:
            why = "not reached" if self.forwards_seen < self.forward + 2 else "not timed: no GPU"
            return f"forward {self.forward + 2} whole {why}"
        cpu, gpu, stretches = self.whole
        bound = "the CPU" if cpu > gpu else "the GPU"
        return f"forward {self.forward + 2} whole ({stretches} stretches): CPU enqueue {cpu * 1e3:.1f} ms, GPU {gpu * 1e3:.1f} ms: bound by {bound}"

    def summary(self) -> str:
        if not self.cpu:
            return f"host bound: {self.whole_summary()}; no block of forward {self.forward} ran eagerly"
        cpu_ms = sum(self.cpu) * 1e3
        text = f"host bound: {self.whole_summary()}; forward {self.forward}, {len(self.cpu)} blocks: CPU enqueue {cpu_ms:.1f} ms"
        text += f" ({self.launches[0]} Triton launches direct, {self.launches[1]} through Triton's own path)"
        if not self.gpu:
            return text
        gpu_ms = sum(self.gpu) * 1e3
        bound = "the CPU" if cpu_ms > gpu_ms else "the GPU"
        per_block = ", ".join(f"{c * 1e3:.2f}/{g * 1e3:.2f}" for c, g in zip(self.cpu[:4], self.gpu[:4], strict=True))
        text = f"{text}, GPU {gpu_ms:.1f} ms: bound by {bound} (first blocks, CPU/GPU ms: {per_block})"
        # the synchronisations are the profiler's own waits for the GPU (it is kept busy), not host work
        own = [row for row in self.host_functions if "synchronize" not in row[0]]
        top = "; ".join(f"{name} {calls}x {ms:.1f} ms" for name, calls, ms in own[:20])
        ours = "; ".join(f"{name} {calls}x {ms:.1f} ms" for name, calls, ms in self.engine_functions[:20])
        if not top:
            return text
        return (
            f"{text}\n  host time of forward {self.forward + 1} under cProfile, by own time: {top}"
            f"\n  the engine's functions there, by cumulative time: {ours}"
        )

    def as_dict(self) -> dict:
        return {"forward": self.forward, "cpu_ms": [round(c * 1e3, 3) for c in self.cpu],
                "gpu_ms": [round(g * 1e3, 3) for g in self.gpu], "launches_direct_triton": self.launches,
                "host_functions": self.host_functions, "engine_functions": self.engine_functions,
                "whole_cpu_gpu_ms": None if self.whole is None else [round(t * 1e3, 3) for t in self.whole[:2]]}  # fmt: skip


@contextlib.contextmanager
def blocks_timed(forward: int) -> Iterator[BlockTimes]:
    """Inside the region, time every block of its `forward`-th DiT forward (see the module's docstring)."""
    times = BlockTimes(forward)
    timing = False
    plain_forward_tokens, plain_block = WanCameraDiT.forward_tokens, Block.forward

    def forward_tokens(self, *args, **kwargs):
        nonlocal timing
        times.forwards_seen += 1
        timing = times.forwards_seen in (forward, forward + 1)
        profiler = cProfile.Profile() if times.forwards_seen == forward + 1 else None
        try:
            if times.forwards_seen == forward + 2:
                return _timed_whole(times, plain_forward_tokens, self, *args, **kwargs)
            if profiler is None:
                return plain_forward_tokens(self, *args, **kwargs)
            return profiler.runcall(plain_forward_tokens, self, *args, **kwargs)
        finally:
            timing = False
            if profiler is not None:
                times.host_functions = _by_own_time(profiler)
                times.engine_functions = _engine_by_cumulative_time(profiler)

    def block_forward(self, x, *args, **kwargs):
        if not timing:
            return plain_block(self, x, *args, **kwargs)
        cuda = x.is_cuda
        if cuda:
            torch.cuda.synchronize(x.device)
            torch.cuda._sleep(SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        counts = triton_lang.counts
        launched = (counts.direct, counts.triton)
        began = time.perf_counter()
        out = plain_block(self, x, *args, **kwargs)
        if cuda:
            end.record()
        if times.forwards_seen == forward + 1:  # the profiled one: only kept busy
            return out
        times.cpu.append(time.perf_counter() - began)
        times.launches[0] += counts.direct - launched[0]
        times.launches[1] += counts.triton - launched[1]
        if cuda:
            end.synchronize()
            times.gpu.append(start.elapsed_time(end) / 1e3)
        return out

    WanCameraDiT.forward_tokens, Block.forward = forward_tokens, block_forward
    try:
        yield times
    finally:
        WanCameraDiT.forward_tokens, Block.forward = plain_forward_tokens, plain_block


def _timed_whole(times: BlockTimes, forward_tokens, model, *args, **kwargs):
    """One forward enqueued in stretches, each behind a sleep: its host seconds against its GPU seconds.

    A stretch ends where a block writes its KV cache (`LayerKV.update`, once a block whether the block runs
    eagerly or between `worldgen.models.block_graphs`' replays): one forward at once behind one sleep filled
    CUDA's launch queue, and the host then waited for the GPU."""
    from worldgen.models.kv_cache import LayerKV

    device = next(model.parameters()).device
    if device.type != "cuda":
        return forward_tokens(model, *args, **kwargs)
    stretches: list[list[torch.cuda.Event]] = []
    host = [0.0, 0.0]  # seconds so far, when the open stretch began

    def begin() -> None:
        torch.cuda.synchronize(device)
        torch.cuda._sleep(SLEEP_CYCLES)
        stretches.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
        stretches[-1][0].record()
        host[1] = time.perf_counter()

    def end() -> None:
        host[0] += time.perf_counter() - host[1]
        stretches[-1][1].record()

    plain_update = LayerKV.update

    def update(self, *a, **k):
        end()
        begin()
        return plain_update(self, *a, **k)

    LayerKV.update = update
    try:
        begin()
        out = forward_tokens(model, *args, **kwargs)
        end()
    finally:
        LayerKV.update = plain_update
    torch.cuda.synchronize(device)
    times.whole = (host[0], sum(a.elapsed_time(b) for a, b in stretches) / 1e3, len(stretches))
    return out


def _by_own_time(profiler: cProfile.Profile, top: int = 40) -> list[tuple[str, int, float]]:
    """(file:line(function), calls, own ms) of the `top` functions by their own time."""
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return [
        (f"{Path(file).name}:{line}({name})", calls, round(own * 1e3, 2))
        for (file, line, name), (_, calls, own, _, _) in rows
    ]


def _engine_by_cumulative_time(profiler: cProfile.Profile, top: int = 30) -> list[tuple[str, int, float]]:
    """(file:line(function), calls, cumulative ms) of the engine's own functions (worldgen/), the largest
    first, less the forward itself: which of its steps the host's time goes to."""
    stats = pstats.Stats(profiler).stats
    rows = [
        (f"{Path(file).name}:{line}({name})", calls, round(cumulative * 1e3, 2))
        for (file, line, name), (_, calls, _, cumulative, _) in stats.items()
        if "worldgen" in file and name not in ("forward_tokens", "block_forward")
    ]
    return sorted(rows, key=lambda row: row[2], reverse=True)[:top]
