"""The VAE decoder's nearest 2x spatial upsampling of a channels-last video as one Triton copy on CUDA.

Each output pixel is its source pixel's row of channels (`worldgen.models.vae.upsample_2x`, the values of
`F.interpolate(..., mode="nearest-exact")`). PyTorch makes it as a copy of an expanded 7-D view, whose kernel
works out a 7-D offset for every element: the decoder's three upsamplings and its other reshaping copies took 1.65
GPU ms of a 33 ms decode push at 464x832, where their bytes take ~0.4. Here a program copies a tile of output
pixels x channels, the source offset worked out once a pixel: PyTorch's copies left in a push took 0.38 ms and
the three upsamplings less than that (not among a push's 12 largest; docs/benchmarks.md, "Session 39"). A copy:
the same values, bit for bit, on any input.
"""

from __future__ import annotations

import os

import torch

from worldgen.kernels.triton_lang import Signature, launch, tl, triton

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter runs it on CPU tensors
PIXELS = 32  # output pixels a program, x all channels in pieces of up to 64


def takes(x: torch.Tensor) -> bool:
    """Whether `upsample_2x_channels_last` runs the kernel for x [B, C, T, H, W] (channels-last, on CUDA)."""
    channels_last = x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)
    return (x.is_cuda or _INTERPRETED) and triton is not None and channels_last and 4 * x.numel() < 2**31


if triton is not None:

    @triton.jit(do_not_specialize=["pixels", "height", "width"])
    def _nearest_2x_kernel(
        x_ptr, out_ptr, channels, pixels, height, width, PIECE: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # output pixel q of the [frames, 2H, 2W] grid (batch and time folded into frames) reads pixel
        # (frame, y // 2, x // 2) of the input; each is a row of `channels` values in both layouts
        q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * PIECE + tl.arange(0, PIECE)
        out_x = q % (2 * width)
        out_y = (q // (2 * width)) % (2 * height)
        frame = q // (4 * width * height)
        source = (frame * height + out_y // 2) * width + out_x // 2
        mask = (q[:, None] < pixels) & (c[None, :] < channels)
        values = tl.load(x_ptr + source[:, None] * channels + c[None, :], mask=mask)
        tl.store(out_ptr + q[:, None] * channels + c[None, :], values, mask=mask)


def upsample_2x_channels_last(x: torch.Tensor) -> torch.Tensor:
    """x [B, C, T, H, W] channels-last (`takes`) -> [B, C, T, 2H, 2W] channels-last, nearest."""
    b, c, t, h, w = x.shape
    out = torch.empty(b, c, t, 2 * h, 2 * w, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    piece = min(64, triton.next_power_of_2(c))
    pixels = b * t * 4 * h * w
    grid = (triton.cdiv(pixels, PIXELS), triton.cdiv(c, piece))
    launch(_nearest_2x_kernel, grid, x, out, c, pixels, h, w, PIECE=piece, BLOCK_P=PIXELS, num_warps=4)
    return out


# The launch's variants (`triton_lang.Signature`): the float32 VAE (the reference's) and the bf16 one
_TILE = {"PIECE": 64, "BLOCK_P": PIXELS}
SIGNATURES = {
    "_nearest_2x_kernel": (
        Signature("*fp32 *fp32 i32 i32 i32 i32", _TILE, {"num_warps": 4}),
        Signature("*bf16 *bf16 i32 i32 i32 i32", _TILE, {"num_warps": 4}),
    ),
}
