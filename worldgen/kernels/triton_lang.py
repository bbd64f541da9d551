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

Launching: Triton's own launch (`JITFunction.run`) binds and specialises every argument, turns its options
into a string for the cache key, builds launch metadata and calls two (empty) hook chains, every time. A
warm Fast forward launches ~1,000 of our kernels and its enqueue outran the GPU (docs/benchmarks.md,
"Session 15: Fast"). So `launch` keeps, per variant of a call (`_call_key`: more than Triton specialises
on, so one variant never needs two compiled kernels), the compiled kernel Triton chose and calls its C
launcher with what Triton hands it (every argument in the kernel's order, no metadata and no hooks while
no hook is installed). A variant's first two launches go through Triton, the second checking that Triton
picks the same compiled kernel and binds the same trailing arguments; it is launched directly from the
third on. Set LINGBOT_ISAAC_DIRECT_LAUNCH=0 to launch everything through Triton.

Targets: each module with kernels says, beside its launches, the variants they make (`SIGNATURES`: one
`Signature` per variant), and tests/worldgen/test_triton_targets.py compiles every kernel from them for the
GPUs our users own (sm_80, sm_86, sm_89, sm_90) on the CPU, with no GPU: a kernel without an entry fails it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
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

__all__ = [
    "CompileAhead", "LaunchCounts", "Signature", "capability", "compiling_ahead", "counts", "deferring", "launch", "tl",
    "triton",
]  # fmt: skip

TARGET_SWITCH = "LINGBOT_ISAAC_TRITON_TARGET"  # "sm80": every Triton kernel built for sm_80 (`force_target`)


def _forced_target() -> int | None:
    """The compute capability (major * 10 + minor) TARGET_SWITCH forces, or None; a clear error when malformed."""
    value = os.environ.get(TARGET_SWITCH, "").strip()
    if not value:
        return None
    if not re.fullmatch(r"sm_?\d{2,3}", value):
        raise ValueError(f"{TARGET_SWITCH}={value!r}: give a CUDA target such as sm80 (or unset it)")
    return int(value.removeprefix("sm").removeprefix("_"))


FORCED_TARGET = _forced_target()


def capability(device: torch.device | int | None = None) -> tuple[int, int]:
    """The compute capability our dispatch decides by: the card's, or the one TARGET_SWITCH forces (the
    sm_80 code path measured on a newer card: no e4m3 kernels, the GEMM's Ampere tiles)."""
    if FORCED_TARGET is not None:
        return divmod(FORCED_TARGET, 10)
    return torch.cuda.get_device_capability(device)


def binary_for(compiled, device_capability: tuple[int, int]) -> bytes:
    """What to load for a compiled kernel on a card: its cubin when its PTX targets that card's architecture, else
    its PTX (text, NUL-terminated) for the driver to compile for the card: a cubin is not forward compatible across
    architectures (sm_80's does not load on sm_90), PTX is. (Triton 3.7 builds the PTX and cubin of an overridden
    arch for the card itself, only its code path for the override: the cubin then loads as it is.)"""
    found = re.search(r"^\.target sm_(\d+)", compiled.asm.get("ptx", ""), re.MULTILINE)
    if found and int(found[1]) != device_capability[0] * 10 + device_capability[1]:
        return compiled.asm["ptx"].encode() + b"\0"
    return compiled.asm["cubin"]


def force_target(target: int) -> None:
    """Build every Triton kernel of this process for `target` (80: sm_80) whatever the card: Triton's own
    switch (`knobs.runtime.override_arch`, TRITON_OVERRIDE_ARCH) lowers each kernel by that target's code path
    (Ampere's mma.sync and cp.async, no wgmma or TMA; no e4m3). Where Triton then writes PTX for the target
    rather than the card, the kernel is loaded from that PTX, which the driver compiles for the card it runs on
    (`binary_for`: Triton would load the cubin, which a newer card refuses)."""
    triton.knobs.runtime.override_arch = f"sm{target}"
    kernel_class = triton.compiler.CompiledKernel
    if getattr(kernel_class, "_lingbot_forced", False):
        return
    original = kernel_class._init_handles

    def _init_handles(self):
        if self.module is None:
            device = triton.runtime.driver.active.get_current_device()
            self.kernel = binary_for(self, torch.cuda.get_device_capability(device))
        return original(self)

    kernel_class._init_handles = _init_handles
    kernel_class._lingbot_forced = True


if FORCED_TARGET is not None and triton is not None:
    force_target(FORCED_TARGET)


@dataclasses.dataclass(frozen=True)
class Signature:
    """One variant of a kernel's launches, as Triton compiles it: `types`, the Triton type of each argument that
    is not a constexpr, in the kernel's order (`*bf16` a pointer to bf16, `*fp8e4nv` to e4m3, `i32` / `i64` an
    int, `fp32` a float); `constexprs`, the constexpr values (and an int Triton specialises on, such as a stride
    of 1); `options`, the launch's compile options (`num_warps`, `enable_fp_fusion`)."""

    types: str
    constexprs: dict[str, object] = dataclasses.field(default_factory=dict)
    options: dict[str, object] = dataclasses.field(default_factory=dict)

    @property
    def e4m3(self) -> bool:
        """Whether it reads or writes float8 e4m3 (Triton's fp8e4nv: compute capability 8.9+ only)."""
        return "fp8e4nv" in self.types


class CompileAhead:
    """The compiles submitted while compiling ahead: one per kernel variant met, run on a thread pool."""

    def __init__(self, workers: int):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="triton-compile")
        self.futures: dict[tuple, Future] = {}
        self.started = time.perf_counter()

    def submit(self, kernel, grid, args: tuple, kwargs: dict) -> None:
        key = (kernel, tuple(map(_arg_key, args)), tuple(sorted(kwargs.items())))
        if key not in self.futures:
            device = torch.cuda.current_device()
            self.futures[key] = self.pool.submit(_warm, device, kernel, grid, args, kwargs)

    def wait(self) -> tuple[int, list[str]]:
        """Block until every compile is done; -> (variants compiled, their errors)."""
        self.pool.shutdown(wait=True)
        errors = [f"{key[0].__name__}: {f.exception()}" for key, f in self.futures.items() if f.exception()]
        return len(self.futures), errors


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


DIRECT_SWITCH = "LINGBOT_ISAAC_DIRECT_LAUNCH"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # "0": every launch through Triton's own path


class LaunchCounts:
    """How this process's launches went: straight to the C launcher, or through Triton's `run`."""

    __slots__ = ("direct", "triton")

    def __init__(self) -> None:
        self.direct = self.triton = 0


counts = LaunchCounts()


class _Direct:
    """One call variant's compiled kernel and what its C launcher takes beside the call's own arguments."""

    __slots__ = ("compiled", "run", "function", "packed", "tail", "checked")

    def __init__(self, compiled, tail: tuple) -> None:
        self.compiled, self.tail, self.checked = compiled, tail, False
        self.run, self.function, self.packed = compiled.run, compiled.function, compiled.packed_metadata


_direct: dict[tuple, _Direct | None] = {}  # call variant -> its launcher, or None: always through Triton
_I32, _U64 = 2**31, 2**63
_DESCRIPTOR_OPTIONS = ("padding", "round_f32_to_tf32")  # a TensorDescriptor's options (the second: Triton 3.7+)


def _arg_key(arg) -> object:
    """What of one argument Triton specialises on, or more: a tensor's dtype and 16-byte alignment; an
    int's being 1, a multiple of 16, and its integer type's range; the value of anything else hashable."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    kind = arg.__class__
    if kind is int:
        return (int, arg == 1, arg % 16 == 0, -_I32 <= arg < _I32, arg >= _U64)
    if kind is float:
        return float  # Triton passes every float as fp32 and specialises on none
    if kind.__name__ == "TensorDescriptor":  # a host TMA descriptor: Triton specialises on its dtype and block
        return (kind, arg.base.dtype, tuple(arg.block_shape), *(getattr(arg, f, None) for f in _DESCRIPTOR_OPTIONS))
    return (kind, arg)  # bools, None, strings, constexpr values: the value (unhashable: TypeError)


def _call_key(kernel, args: tuple, kwargs: dict) -> tuple:
    """The call's variant: `_arg_key` of each argument (tensors inline: most arguments are, and this runs
    at every launch), the kwargs, the device."""
    tensor = torch.Tensor
    keys = [(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, tensor) else _arg_key(a) for a in args]
    return (kernel, torch.cuda.current_device(), *keys, *kwargs.items())


def _hooks_idle() -> bool:
    """No launch hook installed (a profiler such as proton installs them): Triton's calls would do nothing."""
    runtime = triton.knobs.runtime
    return not runtime.launch_enter_hook.calls and not runtime.launch_exit_hook.calls


def _triton_binding(kernel, args: tuple, kwargs: dict) -> tuple | None:
    """(the compiled kernel Triton launches for this call, every argument in the kernel's order), or None
    when it has none compiled yet; what `JITFunction.run` does before it launches."""
    knobs = triton.knobs
    options = dict(kwargs)
    options["debug"] = options.get("debug", kernel.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kernel_cache, key_cache, _, _, binder = kernel.device_caches[torch.cuda.current_device()]
    bound, specialization, options = binder(*args, **options)
    compiled = kernel_cache.get(triton.runtime.jit.compute_cache_key(key_cache, specialization, options))
    return None if compiled is None else (compiled, tuple(bound.values()))


def _learn(kernel, key: tuple, args: tuple, kwargs: dict, known: _Direct | None) -> None:
    """After a launch through Triton: keep the variant's launcher (first launch), or check it (second)."""
    plain = (
        isinstance(kernel, triton.runtime.jit.JITFunction)
        and not kernel.pre_run_hooks
        and os.environ.get(DIRECT_SWITCH, "1") != "0"
    )
    binding = _triton_binding(kernel, args, kwargs) if plain else None
    if binding is not None and hasattr(binding[0], "result"):
        return  # compiled asynchronously and not done yet: learn at a later launch
    if binding is None or not _same(binding[1][: len(args)], args):
        _direct[key] = None
        return
    compiled, values = binding
    tail = values[len(args) :]
    if known is None:
        _direct[key] = _Direct(compiled, tail)
    elif compiled is known.compiled and _same(tail, known.tail):
        known.checked = True
    else:  # the variant key missed something Triton specialises on: never direct
        _direct[key] = None


def _same(a: tuple, b: tuple) -> bool:
    """The same objects, or equal values (never a tensor's elementwise ==)."""
    return len(a) == len(b) and all(
        x is y or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(a, b, strict=True)
    )


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """`kernel[grid](*args, **kwargs)`; inside `compiling_ahead()` (on its thread) the compile only; a
    variant launched twice before goes straight to its C launcher (module docstring)."""
    if INTERPRETED:  # Triton's interpreter on CPU tensors (the tests): no device, no compiled kernel to keep
        kernel[grid](*args, **kwargs)
        return
    ahead = _ahead
    if ahead is not None and threading.current_thread() is _ahead_owner:
        ahead.submit(kernel, grid, args, kwargs)
        return
    try:
        key = _call_key(kernel, args, kwargs)
        known = _direct.get(key, False)
    except TypeError:  # an unhashable argument: no variant key
        key, known = None, None
    if known and known.checked and grid.__class__ is tuple and _hooks_idle():
        device = key[1]
        known.run(
            grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            _current_stream(device), known.function, known.packed, None, None, None, *args, *known.tail,
        )  # fmt: skip
        counts.direct += 1
        return
    kernel[grid](*args, **kwargs)
    counts.triton += 1
    if key is not None and known is not None and (known is False or not known.checked):
        _learn(kernel, key, args, kwargs, known or None)


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def deferring() -> bool:
    """Whether this thread's launches compile instead of running (inside `compiling_ahead()`): their outputs
    are unwritten, so nothing made from them may be kept (`quantized_weights.QuantizedWeight.of`)."""
    return _ahead is not None and threading.current_thread() is _ahead_owner


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
