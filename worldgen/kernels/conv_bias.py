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
POSITIONS = 32  # positions a program (x 32 or 64 channels): the fastest tile at the VAE's widths on the H200


def folds(x: torch.Tensor) -> bool:
    """Whether a residual block's convolutions may leave their bias to the kernels reading them (on CUDA)."""
    return channel_norm.runs_fused(x)


if triton is not None:

    @triton.jit(do_not_specialize=["positions"])
    def _residual_add_kernel(
        r_ptr, r1_ptr, r2_ptr, b_ptr, h_ptr, out_ptr, channels, positions, channel_stride, position_stride,
        PARTS: tl.constexpr, PIECE: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # a tile of BLOCK_P positions x PIECE channels of one sample, addressed through the layout's strides: no
        # channel index made from a flat offset (an int64 modulo an element made it 1.85x this time at 96 channels on the H200)
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * PIECE + tl.arange(0, PIECE)
        sample = tl.program_id(2).to(tl.int64) * channels * positions
        mask = (p[:, None] < positions) & (c[None, :] < channels)
        at = sample + (p[:, None] * position_stride + c[None, :] * channel_stride)
        dtype = out_ptr.dtype.element_ty
        r = tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if PARTS > 1:  # the convolution's time taps, added in order as PyTorch's += adds them
            r = (r + tl.load(r1_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        if PARTS > 2:
            r = (r + tl.load(r2_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        bias = tl.load(b_ptr + c, mask=c < channels, other=0.0).to(tl.float32)
        r = (r + bias[None, :]).to(dtype).to(tl.float32)
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
        batch, channels = first.shape[:2]
        positions = first[0, 0].numel()
        strides = (1, channels) if channel_norm._layout(first) == torch.channels_last_3d else (positions, 1)
        piece = next((n for n in (64, 32) if channels % n == 0), None) or triton.next_power_of_2(channels)
        grid = (triton.cdiv(positions, POSITIONS), triton.cdiv(channels, piece), batch)
        launch(
            _residual_add_kernel, grid, first, r1, r2, bias, h, out, channels, positions, *strides,
            PARTS=len(parts), PIECE=piece, BLOCK_P=POSITIONS, num_warps=4,
        )  # fmt: skip
        return out
    return (channel_norm.sum_parts(parts) + bias.view(-1, 1, 1, 1)) + h


# The launch's variants (`triton_lang.Signature`): the float32 and bf16 VAEs, both layouts, the float32 VAE's
# time taps summed here (three parts)
_F32, _BF16 = "*fp32 " * 6, "*bf16 " * 6
_TILE = {"BLOCK_P": POSITIONS}
SIGNATURES = {
    "_residual_add_kernel": (
        Signature(_F32 + "i32 i32 i32", {**_TILE, "position_stride": 1, "PARTS": 1, "PIECE": 32}, {"num_warps": 4}),
        Signature(_F32 + "i32 i32 i32", {**_TILE, "channel_stride": 1, "PARTS": 3, "PIECE": 64}, {"num_warps": 4}),
        Signature(_BF16 + "i32 i32 i32", {**_TILE, "channel_stride": 1, "PARTS": 1, "PIECE": 32}, {"num_warps": 4}),
    ),
}  # fmt: skip
