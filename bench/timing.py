"""The one GPU timer of the benchmarks: mean seconds per call after one warm-up call."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def seconds_per_call(fn: Callable[[], object], repeats: int = 5) -> float:
    """Mean wall seconds of `fn` over `repeats` calls, after one untimed call (compiles, autotunes),
    with the GPU synchronised before and after, so queued kernels are counted."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats
