"""Whether a DiT forward waits on the host (Python and launches) or on the GPU, block by block.

`blocks_timed(n)` times each block of the n-th DiT forward of the region (counted by
`WanCameraDiT.forward_tokens`): the device is synchronised, kept busy by a sleep kernel long enough for
the block's launches never to wait for a queue slot, then the block is enqueued. The CPU's seconds to
enqueue it, against the GPU's seconds to run it (CUDA events after the sleep), say which one bounds the
forward: a CPU figure above the GPU's means fewer or cheaper launches (or CUDA graphs) win time and GPU
kernel work does not. Session 15 found a warm fp8 Fast forward bound this way (docs/benchmarks.md,
"Session 15: Fast": 214.7 ms against 196.8 ms over 40 blocks). Only the timed forward is slowed (by the
sleeps and syncs), and its output is unchanged. Off CUDA the GPU column is empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

import torch

from worldgen.models.dit import Block, WanCameraDiT

SLEEP_CYCLES = 30_000_000  # ~20 ms on an H100: longer than any block's launches


@dataclasses.dataclass
class BlockTimes:
    forward: int  # which forward of the region was timed (1-based)
    cpu: list[float] = dataclasses.field(default_factory=list)  # seconds to enqueue each block
    gpu: list[float] = dataclasses.field(default_factory=list)  # seconds the GPU ran each (CUDA only)
    forwards_seen: int = 0

    def summary(self) -> str:
        if not self.cpu:
            return f"host bound: forward {self.forward} was not reached ({self.forwards_seen} forwards)"
        cpu_ms = sum(self.cpu) * 1e3
        text = f"host bound, forward {self.forward}, {len(self.cpu)} blocks: CPU enqueue {cpu_ms:.1f} ms"
        if not self.gpu:
            return text
        gpu_ms = sum(self.gpu) * 1e3
        bound = "the CPU" if cpu_ms > gpu_ms else "the GPU"
        per_block = ", ".join(f"{c * 1e3:.2f}/{g * 1e3:.2f}" for c, g in zip(self.cpu[:4], self.gpu[:4], strict=True))
        return f"{text}, GPU {gpu_ms:.1f} ms: bound by {bound} (first blocks, CPU/GPU ms: {per_block})"

    def as_dict(self) -> dict:
        return {"forward": self.forward, "cpu_ms": [round(c * 1e3, 3) for c in self.cpu],
                "gpu_ms": [round(g * 1e3, 3) for g in self.gpu]}  # fmt: skip


@contextlib.contextmanager
def blocks_timed(forward: int) -> Iterator[BlockTimes]:
    """Inside the region, time every block of its `forward`-th DiT forward (see the module's docstring)."""
    times = BlockTimes(forward)
    timing = False
    plain_forward_tokens, plain_block = WanCameraDiT.forward_tokens, Block.forward

    def forward_tokens(self, *args, **kwargs):
        nonlocal timing
        times.forwards_seen += 1
        timing = times.forwards_seen == forward
        try:
            return plain_forward_tokens(self, *args, **kwargs)
        finally:
            timing = False

    def block_forward(self, x, *args, **kwargs):
        if not timing:
            return plain_block(self, x, *args, **kwargs)
        cuda = x.is_cuda
        if cuda:
            torch.cuda.synchronize(x.device)
            torch.cuda._sleep(SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        out = plain_block(self, x, *args, **kwargs)
        if cuda:
            end.record()
        times.cpu.append(time.perf_counter() - began)
        if cuda:
            end.synchronize()
            times.gpu.append(start.elapsed_time(end) / 1e3)
        return out

    WanCameraDiT.forward_tokens, Block.forward = forward_tokens, block_forward
    try:
        yield times
    finally:
        WanCameraDiT.forward_tokens, Block.forward = plain_forward_tokens, plain_block
