"""Triton where this install has it, and how our hand-written kernels are launched (or compiled ahead).

CUDA builds of PyTorch ship Triton; CPU-only installs have none and never need it. This is the one
import guard of the hand-written kernels (`fp8`, `nf4` through it, `fused_triton`) and their one
launcher, `launch`.

Compiling ahead: a kernel variant is compiled the first time it is launched, one after another on the
launching thread; a fresh process's first Fast forward met ~25 of them in a row (docs/benchmarks.md,
"Session 10: Fast"). Inside `compiling_ahead()` a launch runs nothing: the variant's compile goes to a
pool of threads (Triton's `warmup`, which compiles and keeps the kernel in the function's in-process
cache, then the build of its launcher) and the caller gets its outputs unwritten. A dry forward under it (`worldgen.pipelines.fast_warm_up`)
meets every variant a job will launch and has them compiled side by side; the job then launches them
with no compile. The kernels' token-count arguments are not specialised on (`do_not_specialize`), so a
variant does not depend on the job's size.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None

__all__ = ["CompileAhead", "compiling_ahead", "launch", "tl", "triton"]


class CompileAhead:
    """The compiles submitted while compiling ahead: one per kernel variant met, run on a thread pool."""

    def __init__(self, workers: int):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="triton-compile")
        self.futures: dict[tuple, Future] = {}
        self.started = time.perf_counter()

    def submit(self, kernel, grid, args: tuple, kwargs: dict) -> None:
        key = (kernel, tuple(_variant(a) for a in args), tuple(sorted(kwargs.items())))
        if key not in self.futures:
            device = torch.cuda.current_device()
            self.futures[key] = self.pool.submit(_warm, device, kernel, grid, args, kwargs)

    def wait(self) -> tuple[int, list[str]]:
        """Block until every compile is done; -> (variants compiled, their errors)."""
        self.pool.shutdown(wait=True)
        errors = [f"{key[0].__name__}: {f.exception()}" for key, f in self.futures.items() if f.exception()]
        return len(self.futures), errors


def _variant(arg) -> object:
    """What of an argument makes another Triton variant (roughly: a repeat only costs a second compile)."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool) or not isinstance(arg, int):
        return arg if isinstance(arg, (bool, float, str, type(None))) else type(arg)
    return (arg == 1, arg % 16 == 0)


def _warm(device: int, kernel, grid, args: tuple, kwargs: dict) -> None:
    torch.cuda.set_device(device)  # Triton compiles for (and caches under) the thread's current device
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    # and what Triton otherwise does at the first launch: build the kernel's C launcher (the C compiler,
    # ~0.1 s each: 2 s of a fresh process's first Fast chunk on the H100) and load its module
    init_handles = getattr(compiled, "_init_handles", None)
    if init_handles is not None:
        init_handles()


_ahead: CompileAhead | None = None
_ahead_owner: threading.Thread | None = None  # the thread whose launches compile ahead
_ahead_lock = threading.Lock()


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`; inside `compiling_ahead()` (on its thread) the compile only."""
    ahead = _ahead
    if ahead is not None and threading.current_thread() is _ahead_owner:
        ahead.submit(kernel, grid, args, kwargs)
        return
    kernel[grid](*args, **kwargs)


@contextlib.contextmanager
def compiling_ahead(workers: int = 8) -> Iterator[CompileAhead | None]:
    """Launches on this thread compile instead of running (their outputs stay unwritten), on `workers`
    threads side by side; on leaving, wait for them. Failed compiles are said in one warning (the
    kernel compiles again, and fails there, when a job launches it). None without Triton or CUDA."""
    global _ahead, _ahead_owner
    if triton is None or not torch.cuda.is_available():
        yield None
        return
    with _ahead_lock:
        if _ahead is not None:
            raise RuntimeError("compiling_ahead() is already active")
        triton.runtime.driver.active.get_current_device()  # the driver set up once, on this thread
        _ahead, _ahead_owner = CompileAhead(workers), threading.current_thread()
    ahead = _ahead
    try:
        yield ahead
    finally:
        with _ahead_lock:
            _ahead = _ahead_owner = None
        _, errors = ahead.wait()
        if errors:
            warnings.warn(f"compiling ahead: {len(errors)} kernel(s) failed: {'; '.join(errors[:3])}", stacklevel=3)
