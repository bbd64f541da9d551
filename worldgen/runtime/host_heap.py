"""Giving the C heap's free pages back to the system once a pipeline has loaded (glibc's `malloc_trim`).

Why: glibc keeps what the process freed inside its heaps (and the per-thread arenas of Triton's compiles on a pool
of threads, `worldgen.kernels.triton_lang.compiling_ahead`) resident for reuse; only a heap's top is handed back on
its own. A 1.3B job under `--vram-budget 8` held ~1.4 GiB of anonymous memory at its peak, 0.5 GiB of it added by
the load's dry forward and compiles (docs/benchmarks.md, "Session 35"), against an RSS target of 4 GiB beside Isaac
Sim. `malloc_trim(0)` returns every free page of every arena (madvise), keeps what is in use, and changes no
number. Nothing else does this job: Python's own allocator frees its arenas, not glibc's.

Measured on the H200 after a 1.3B load under `--vram-budget 8`: 0.049 GiB released (exact), 0.041 (fp8); most of
that anonymous memory is in use, not free (docs/benchmarks.md, "Session 37"). Kept: it costs milliseconds once a
load and the engine record says what it gave back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from worldgen.runtime.metering import rss_gib


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, another OS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def trim() -> float | None:
    """Hand the C heap's free pages back to the system; -> the GiB of RSS that released (None where glibc's
    `malloc_trim` or /proc is not there: nothing was done or nothing could be measured)."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return None
    before = rss_gib()
    malloc_trim(0)
    after = rss_gib()
    return None if before is None or after is None else round(before - after, 3)
