"""A VAE convolution's bias added by the kernel that reads its output next, on CUDA.

PyTorch adds a cuDNN convolution's bias in a kernel of its own after the convolution (`output.add_(bias)`):
one more pass over the activation, ~0.17 GPU s of an 81-frame Fast rollout with the bf16 VAE and ~0.24 s with
the float32 one on the H100 (docs/benchmarks.md, "Session 18: Fast"). A residual block's convolutions are read
next by the channel norm (`channel_norm.rms_norm_silu` takes the bias) and by the residual add (`residual_add`
here: the bias and the shortcut in one pass), so `worldgen.models.vae` runs them without their bias there.

Numerics: PyTorch's, to the bit: the convolution's output plus its bias rounded to the activation's dtype,
then plus the shortcut rounded again (each sum in float32). The output may come as the parts of a sum (the float32
VAE's three time taps, `worldgen.models.vae._time_taps`), added first in their order as PyTorch's `+=` adds them.
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
        r_ptr, r1_ptr, r2_ptr, b_ptr, h_ptr, out_ptr, numel, channels, positions,
        PARTS: tl.constexpr, CHANNELS_LAST: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = at < numel
        channel = at % channels if CHANNELS_LAST else (at // positions) % channels
        dtype = out_ptr.dtype.element_ty
        r = tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if PARTS > 1:  # the convolution's time taps, added in order as PyTorch's += adds them
            r = (r + tl.load(r1_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        if PARTS > 2:
            r = (r + tl.load(r2_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        r = (r + tl.load(b_ptr + channel, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        out = r + tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, out.to(dtype), mask=mask)


def residual_add(r: channel_norm.Summands, bias: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """(r + bias [C]) + h for r, h [B, C, T, H, W] of one dtype and layout: a block's last convolution's output
    without its bias (or the parts of it, `channel_norm.sum_parts`), and the block's shortcut."""
    parts = channel_norm._parts(r)
    first = parts[0]
    same = first.shape == h.shape and first.stride() == h.stride() and first.dtype == h.dtype == bias.dtype
    on_device = (first.is_cuda or _INTERPRETED) and triton is not None
    if on_device and channel_norm._fits(parts, None) and same and first.dim() == 5:
        out = torch.empty_like(first)
        r1, r2 = (parts[min(i, len(parts) - 1)] for i in (1, 2))  # unread where there are fewer parts
        layout = channel_norm._layout(first)
        launch(
            _residual_add_kernel, (triton.cdiv(first.numel(), BLOCK),), first, r1, r2, bias, h, out, first.numel(),
            first.shape[1], first[0, 0].numel(), PARTS=len(parts), CHANNELS_LAST=layout == torch.channels_last_3d,
            BLOCK=BLOCK, num_warps=8,
        )  # fmt: skip
        return out
    return (channel_norm.sum_parts(parts) + bias.view(-1, 1, 1, 1)) + h


# The launch's variants (`triton_lang.Signature`): the float32 and bf16 VAEs, both layouts, a tensor of more
# than 2**31 elements (its count an i64), the float32 VAE's time taps summed here (three parts)
_F32, _BF16 = "*fp32 " * 6, "*bf16 " * 6
SIGNATURES = {
    "_residual_add_kernel": (
        Signature(_F32 + "i32 i32 i32", {"PARTS": 1, "CHANNELS_LAST": False, "BLOCK": BLOCK}, {"num_warps": 8}),
        Signature(_F32 + "i32 i32 i32", {"PARTS": 3, "CHANNELS_LAST": True, "BLOCK": BLOCK}, {"num_warps": 8}),
        Signature(_BF16 + "i32 i32 i32", {"PARTS": 1, "CHANNELS_LAST": True, "BLOCK": BLOCK}, {"num_warps": 8}),
        Signature(_BF16 + "i64 i32 i32", {"PARTS": 1, "CHANNELS_LAST": False, "BLOCK": BLOCK}, {"num_warps": 8}),
    ),
}  # fmt: skip
