"""A VAE convolution's bias added by the kernel that reads its output next, on CUDA.

PyTorch adds a cuDNN convolution's bias in a kernel of its own after the convolution (`output.add_(bias)`):
one more pass over the activation, ~0.17 GPU s of an 81-frame Fast rollout with the bf16 VAE and ~0.24 s with
the float32 one on the H100 (docs/benchmarks.md, "Session 18: Fast"). A residual block's convolutions are read
next by the channel norm (`channel_norm.rms_norm_silu` takes the bias) and by the residual add (`residual_add`
here: the bias and the shortcut in one pass), so `worldgen.models.vae` runs them without their bias there.

Numerics: PyTorch's, to the bit: the convolution's output plus its bias rounded to the activation's dtype,
then plus the shortcut rounded again (each sum in float32).
"""

from __future__ import annotations

import os

import torch

from worldgen.kernels import channel_norm
from worldgen.kernels.triton_lang import Signature, launch, tl, triton

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter runs it on CPU tensors
BLOCK = 4096


def folds(x: torch.Tensor) -> bool:
    """Whether a residual block's convolutions may leave their bias to the kernels reading them (on CUDA)."""
    return channel_norm.runs_fused(x)


if triton is not None:

    @triton.jit(do_not_specialize=["numel", "positions"])
    def _residual_add_kernel(
        r_ptr, b_ptr, h_ptr, out_ptr, numel, channels, positions, CHANNELS_LAST: tl.constexpr, BLOCK: tl.constexpr
    ):
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = at < numel
        channel = at % channels if CHANNELS_LAST else (at // positions) % channels
        dtype = out_ptr.dtype.element_ty
        r = tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
        r = (r + tl.load(b_ptr + channel, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        out = r + tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, out.to(dtype), mask=mask)


def residual_add(r: torch.Tensor, bias: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """(r + bias [C]) + h for r, h [B, C, T, H, W] of one dtype and layout: a block's last convolution's output
    without its bias, and the block's shortcut."""
    layout = channel_norm._layout(r)
    same = r.shape == h.shape and r.stride() == h.stride() and r.dtype == h.dtype == bias.dtype
    if (r.is_cuda or _INTERPRETED) and triton is not None and layout is not None and same and r.dim() == 5:
        out = torch.empty_like(r)
        launch(
            _residual_add_kernel, (triton.cdiv(r.numel(), BLOCK),), r, bias, h, out, r.numel(), r.shape[1],
            r[0, 0].numel(), CHANNELS_LAST=layout == torch.channels_last_3d, BLOCK=BLOCK, num_warps=8,
        )  # fmt: skip
        return out
    return (r + bias.view(-1, 1, 1, 1)) + h


# The launch's variants (`triton_lang.Signature`): the float32 and bf16 VAEs, both layouts, a tensor of more
# than 2**31 elements (its count an i64)
SIGNATURES = {
    "_residual_add_kernel": (
        Signature("*fp32 *fp32 *fp32 *fp32 i32 i32 i32", {"CHANNELS_LAST": False, "BLOCK": BLOCK}, {"num_warps": 8}),
        Signature("*bf16 *bf16 *bf16 *bf16 i32 i32 i32", {"CHANNELS_LAST": True, "BLOCK": BLOCK}, {"num_warps": 8}),
        Signature("*bf16 *bf16 *bf16 *bf16 i64 i32 i32", {"CHANNELS_LAST": False, "BLOCK": BLOCK}, {"num_warps": 8}),
    ),
}  # fmt: skip
