"""Attention kernels for the DiT: PyTorch SDPA, or FlashAttention / SageAttention when installed.

- `sdpa`: `F.scaled_dot_product_attention`; PyTorch picks its flash or memory-efficient kernel.
  The reference numerics (and the golden tests) use it.
- `flash`: FlashAttention: FlashAttention 4 (`pip install flash-attn-4`, the CuTe-DSL kernels,
  `flash_attn.cute`) when installed, else the `flash_attn` package's `flash_attn_func`
  (FlashAttention 2): the same math, bf16/fp16 on CUDA only.
- `sage`: the `sageattention` package's `sageattn`: INT8 Q and K, so not bit-faithful to the
  reference; used only when asked for.
- `auto` (default): `flash` when the package is installed, else `sdpa`, for both models (on the H100
  FlashAttention 4 ran the base model's attention 18% faster than cuDNN's kernel and the Fast model's
  self-attention over its KV window 15-17% faster: docs/benchmarks.md, sessions 6 and 21).

Cross-attention's few text keys go through SDPA whatever the choice (`OPTIONAL_MIN_KEYS`).

Inputs the optional kernels cannot take (CPU, float32) go through SDPA whatever the choice.

`fp8_attention` is the FP8 path's self-attention (`--compute fp8`, approximate): cuDNN's FP8 kernel
(worldgen/kernels/cudnn_attention.py) where it can run, its e4m3 output handed to the output projection's
FP8 GEMM as it is.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch
import torch.nn.functional as F

from contracts.engine_options import ATTENTIONS
from worldgen.errors import InputError
from worldgen.kernels import fp8
from worldgen.kernels.fp8 import QuantizedRows, QuantizedTensor, quantize_tensor

BACKENDS = ATTENTIONS  # the one list, in contracts.engine_options
_PACKAGES = {
    "flash": ("flash_attn", "pip install flash-attn-4 (Hopper, Blackwell) or flash-attn"),
    "sage": ("sageattention", "pip install sageattention"),
}


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is missing
        return False


def installed(backend: str) -> bool:
    if backend == "flash":  # FA4 ships as the namespace package flash_attn.cute, FA2 as flash_attn
        return _find("flash_attn.cute") or _find("flash_attn.flash_attn_interface")
    return backend == "sdpa" or _find(_PACKAGES[backend][0])


@functools.cache
def _flash_attn_func():
    """FlashAttention 4 where installed, else FlashAttention 2: (q, k, v) [B, L, n, d] -> out."""
    if _find("flash_attn.cute"):
        from flash_attn.cute import flash_attn_func as fa4

        # its CuTe DSL says at every compile that an argument (FA4's own) is not a JIT argument: not ours to fix
        warnings.filterwarnings("ignore", message=r"Argument aux_data .* cannot be converted", category=UserWarning)

        def run(q, k, v):
            out = fa4(q, k, v)
            return out[0] if isinstance(out, tuple) else out  # (out, lse) in FA4's API

        return run
    from flash_attn import flash_attn_func

    return flash_attn_func


@functools.cache
def import_error(backend: str) -> str | None:
    """None when the installed package of an optional backend imports, else why not. A package can be
    found on disk and still fail to import (FlashAttention 4 without its compiler's libraries, session 21):
    `auto` must not choose it then."""
    try:
        if backend == "flash":
            _flash_attn_func()
        else:
            importlib.import_module(_PACKAGES[backend][0])
    except Exception as exc:  # noqa: BLE001  (any failure to import: the backend is not usable)
        return f"{type(exc).__name__}: {exc}"
    return None


def resolve_backend(name: str) -> str:
    """'auto' -> the best installed exact kernel; an explicit choice must be installed and import.

    Both models take FlashAttention where it is installed. (Session 6 kept the Fast model on SDPA: its
    DiT loop, then bound by launches, ran slower with FlashAttention 4, 15.5 s against 14.7 s. Session
    21, a loop bound by the GPU's work: 9.89-9.94 s against 10.37-10.43 s, docs/benchmarks.md.)"""
    if name not in BACKENDS:
        raise InputError(f"attention backend {name!r} is unknown: use one of {', '.join(BACKENDS)}")
    if name == "sdpa" or (name == "auto" and not installed("flash")):
        return "sdpa"
    backend = "flash" if name == "auto" else name
    package, command = _PACKAGES[backend]
    if not installed(backend):
        raise InputError(f"--attention {name}: the {package} package is not installed ({command}), or use sdpa")
    error = import_error(backend)
    if error is None:
        return backend
    why = f"the installed {package} package does not import ({error})"
    if name == "auto":
        warnings.warn(f"--attention auto: {why}; using PyTorch SDPA. Reinstall it ({command}).", stacklevel=2)
        return "sdpa"
    raise InputError(f"--attention {name}: {why}: reinstall it ({command}), or use sdpa")


_failed: set[str] = set()  # optional kernels that failed once in this process: SDPA from then on


def _optional_kernel(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if backend == "flash":
        return _flash_attn_func()(q, k, v)
    from sageattention import sageattn

    # K smoothed out of place: sageattn's own smoothing (`smooth_k`) subtracts the mean from k in place, and k is
    # the KV cache's window (a view): the cached keys would drift by each call's mean
    return sageattn(q, k - k.mean(dim=1, keepdim=True), v, tensor_layout="NHD", smooth_k=False)


# Fewer keys than this (the 512 text tokens of cross-attention) go through SDPA whatever the backend:
# on the H100 FlashAttention 4 took 0.11 ms for 4,524 queries over 512 keys, cuDNN's SDPA 0.09 ms
# (docs/benchmarks.md, "Session 21: Fast")
OPTIONAL_MIN_KEYS = 1024


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa") -> torch.Tensor:
    """[B, L, n, d] inputs -> [B, L, n*d]; softmax scale 1/sqrt(d), no mask.

    An optional kernel that fails (FlashAttention 4 compiles at run time; a package can be broken)
    does not fail the job: SDPA computes the same attention, said once in a warning."""
    usable = backend != "sdpa" and backend not in _failed and k.shape[1] >= OPTIONAL_MIN_KEYS
    if usable and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        try:
            return _optional_kernel(backend, q, k, v).flatten(2)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure of an optional kernel: SDPA instead)
            _failed.add(backend)
            warnings.warn(f"--attention {backend} failed ({exc}); using PyTorch SDPA from now on", stacklevel=2)
    return _sdpa(q, k, v).transpose(1, 2).flatten(2)


# Which of PyTorch's SDPA kernels to try first on CUDA (None: PyTorch's own order). A setting so the
# benchmarks can compare kernels in one process (bench/bench_fast.py --sdpa-first).
SDPA_FIRST: str | None = None
_SDPA_KERNELS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's SDPA on [B, L, n, d] views -> [B, n, L, d]."""
    args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    if SDPA_FIRST is None or not q.is_cuda:
        return F.scaled_dot_product_attention(*args)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = [_SDPA_KERNELS[SDPA_FIRST], *(n for n in _SDPA_KERNELS.values() if n != _SDPA_KERNELS[SDPA_FIRST])]
    with sdpa_kernel([getattr(SDPBackend, n) for n in (*names, "MATH")], set_priority=True):
        return F.scaled_dot_product_attention(*args)


_fp8_usable: dict[tuple, bool] = {}  # (device, shapes) -> whether cuDNN's FP8 attention ran them
FP8_ATTENTION = True  # False: `--compute fp8` keeps attention bf16 (benchmarks compare the two)


def fp8_attention_runs(q: torch.Tensor) -> bool:
    """Whether `fp8_attention` takes these queries (before any shape is tried): CUDA bf16, enough
    tokens to matter, Hopper with cuDNN's frontend installed. The FP8 KV cache then hands its window
    over already in FP8 (`LayerKV.update(fp8_window=True)`)."""
    if not (FP8_ATTENTION and q.is_cuda and q.dtype == torch.bfloat16 and q.shape[1] >= fp8.MIN_ROWS):
        return False
    from worldgen.kernels import cudnn_attention

    return _fp8_usable.setdefault((q.device,), cudnn_attention.fp8_unsupported_reason(q.device) is None)


def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor | QuantizedTensor,
    v: torch.Tensor | QuantizedTensor,
    q8: QuantizedTensor | None = None,
    out: torch.Tensor | None = None,
) -> QuantizedTensor | None:
    """Self-attention in FP8 ([B, L, n, d] bf16 q; k and v bf16, or already in e4m3 with one scale
    each; the output [B, L, n, d] in e4m3 with its scale, for `attention_rows`), or None where cuDNN's
    FP8 attention cannot run (the caller uses `attention`): not CUDA bf16, too few tokens to matter,
    no Hopper, no cuDNN frontend, or a shape cuDNN declines (said once). `q8`: q already quantized
    (`quantize_tensor(q)`, made inside a block graph); `out`: where the e4m3 output goes."""
    if not fp8_attention_runs(q):
        return None
    from worldgen.kernels import cudnn_attention

    k, v = (t if isinstance(t, QuantizedTensor) else quantize_tensor(t) for t in (k, v))
    key = (q.device, q.shape, k.data.shape, v.data.shape)
    if _fp8_usable.get(key) is False:
        return None
    try:
        o = cudnn_attention.fp8_attention_quantized(quantize_tensor(q) if q8 is None else q8, k, v, out=out)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (cuDNN declines this shape: bf16 attention for it)
        _fp8_usable[key] = False
        warnings.warn(f"cuDNN's FP8 attention declined {tuple(q.shape)}: bf16 attention for it ({exc})", stacklevel=2)
        return None
    _fp8_usable[key] = True
    return o


def attention_rows(o: QuantizedTensor) -> QuantizedRows:
    """`fp8_attention`'s output as the output projection's e4m3 rows: one scale for the whole output,
    given per row as the FP8 GEMM's row-wise scaling wants it."""
    rows = o.data.flatten(2).view(-1, o.data.shape[2] * o.data.shape[3])
    return QuantizedRows(rows, o.descale.view(1, 1).expand(rows.shape[0], 1).contiguous(), tuple(o.data.shape[:2]))
