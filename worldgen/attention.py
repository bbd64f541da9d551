"""Attention kernels for the DiT: PyTorch SDPA, or FlashAttention / SageAttention when installed.

- `sdpa`: `F.scaled_dot_product_attention`; PyTorch picks its flash or memory-efficient kernel.
  The reference numerics (and the golden tests) use it.
- `flash`: the `flash_attn` package's `flash_attn_func` (FlashAttention 2, or 3 on Hopper): the
  same math, bf16/fp16 on CUDA only.
- `sage`: the `sageattention` package's `sageattn`: INT8 Q and K, so not bit-faithful to the
  reference; used only when asked for.
- `auto` (default): `flash` when the package is installed, else `sdpa`.

Inputs the optional kernels cannot take (CPU, float32) go through SDPA whatever the choice.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from contracts.engine_options import ATTENTIONS
from worldgen.errors import InputError

BACKENDS = ATTENTIONS  # the one list, in contracts.engine_options
_PACKAGES = {"flash": ("flash_attn", "pip install flash-attn"), "sage": ("sageattention", "pip install sageattention")}


def installed(backend: str) -> bool:
    return backend == "sdpa" or importlib.util.find_spec(_PACKAGES[backend][0]) is not None


def resolve_backend(name: str) -> str:
    """'auto' -> the best installed exact kernel; an explicit choice must be installed."""
    if name not in BACKENDS:
        raise InputError(f"attention backend {name!r} is unknown: use one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "flash" if installed("flash") else "sdpa"
    if not installed(name):
        package, command = _PACKAGES[name]
        raise InputError(f"--attention {name}: the {package} package is not installed ({command}), or use sdpa")
    return name


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa") -> torch.Tensor:
    """[B, L, n, d] inputs -> [B, L, n*d]; softmax scale 1/sqrt(d), no mask."""
    if backend != "sdpa" and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        if backend == "flash":
            from flash_attn import flash_attn_func

            return flash_attn_func(q, k, v).flatten(2)
        if backend == "sage":
            from sageattention import sageattn

            return sageattn(q, k, v, tensor_layout="NHD").flatten(2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).flatten(2)
