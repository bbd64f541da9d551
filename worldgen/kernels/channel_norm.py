"""The VAE's channel RMS norm followed by SiLU (every residual block and head: `RMSNorm`, then `nn.SiLU`)
as one hand-written Triton kernel on CUDA.

Eager, the pair is six passes over the activation (the norm's reduction, its clamp, the division, the
two products, SiLU), each reading and writing the whole tile of video; an 81-frame Fast rollout runs it
2,100 times (encode and decode), at up to 96 channels x 4 frames x 464 x 448. One kernel reads it once
and writes it once: 1.7-3.8x faster on the H100, 0.57 -> 0.31 GPU s a rollout (docs/benchmarks.md,
"Session 14: Fast").

Both layouts a VAE runs in: contiguous [B, C, T, H, W], and channels-last (`torch.channels_last_3d`, the
layout cuDNN's convolutions run in on CUDA without transposing, `worldgen.models.vae`); the kernel reads
a tile of positions x all channels either way, through the layout's strides.

The kernel is bound by its arithmetic, not by memory: at 96 channels x 4 frames x 464 x 832 in bf16 it took
0.81 ms where a copy of the tensor takes 0.14 on the H200, 9.3 of a decode push's 41 GPU ms. Three changes
made it 0.19-0.20 ms (a push's 29 calls: 1.95 ms), the bits unchanged but for the channel sum's order
(docs/benchmarks.md, "Session 39"): the
channels read as three power-of-two pieces (every VAE width is 3 x 2^k; a tile padded to the next power of
two computed a third more for nothing), the division by the norm as a product by its inverse corrected once,
and SiLU's division Triton's own (two IEEE divisions an element were most of the work).

Numerics: the eager ops' roundings (the norm, the quotient and each product rounded to the activation's
dtype, as PyTorch rounds each op), float32 in between, the quotient by the norm IEEE-rounded (Markstein's
correction: the same bits as a division); the channel sum runs in another order, Triton's exponential is not
CUDA's `expf` and SiLU's division is within 2 float32 ulps, so a rare bf16 element differs by one step.

Two ways round a pass over the activation, both for the float32 VAE's time taps (`worldgen.models.vae._time_taps`):
the input may come as the parts of a sum (a convolution's three taps), added here in their order as PyTorch's
`+=` would, so they are never summed in memory first; and the output may go to a view (`out`: the frames slot
of the next convolution's [past | new frames] input), so the convolution needs no `torch.cat` to join them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from worldgen.kernels.triton_lang import Signature, launch, tl, triton

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter runs it on CPU tensors
POSITIONS = 16  # positions (t, y, x) a program: with all channels, 16 x 512 values at most
_failed: set[str] = set()


Summands = torch.Tensor | Sequence[torch.Tensor]  # a tensor, or the parts of one (summed in their order)
MAX_PARTS = 3  # a causal convolution's three time taps


def rms_norm_silu(
    x: Summands,
    gamma: torch.Tensor,
    scale: float,
    eps: float = 1e-12,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """silu(F.normalize(x', dim=1) * scale * gamma) for x [B, C, ...] and gamma [C, 1, ...], where x' is x, or
    x + bias [C] rounded to x's dtype: a convolution's output whose bias was left out (`worldgen.kernels.conv_bias`).
    `x` may be a sequence of parts of one shape, summed first in their order (`((a + b) + c)`, each sum rounded to
    their dtype); `out`, a tensor of x's shape and layout to write (a view is fine), else a new one is returned."""
    parts = _parts(x)
    first = parts[0]
    on_device = first.is_cuda or _INTERPRETED
    fits = _fits(parts, out) and gamma.numel() == first.shape[1]
    if on_device and fits and triton is not None and not _failed:
        try:
            return _triton_rms_norm_silu(parts, gamma, scale, eps, bias, out)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (no Triton / compiler: the eager ops, said once)
            _failed.add("rms_norm_silu")
            warnings.warn(f"the VAE's fused norm + SiLU kernel failed ({exc}); using PyTorch ops", stacklevel=2)
    x = sum_parts(parts)
    if bias is not None:
        x = x + bias.view(-1, *(1,) * (x.dim() - 2))
    y = F.silu(F.normalize(x, dim=1, eps=eps) * scale * gamma)
    return y if out is None else out.copy_(y)


def sum_parts(parts: Summands) -> torch.Tensor:
    """The parts summed in their order, as `y = a; y += b; y += c` sums them (a tensor: itself)."""
    parts = _parts(parts)
    if len(parts) == 1:
        return parts[0]
    total = parts[0] + parts[1]
    for part in parts[2:]:
        total += part
    return total


def _parts(x: Summands) -> tuple[torch.Tensor, ...]:
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


def _fits(parts: tuple[torch.Tensor, ...], out: torch.Tensor | None) -> bool:
    """Whether the kernels take these parts (and write `out`): one shape, dtype and layout the kernel reads, at most
    MAX_PARTS of them, 512 channels and 2**31 values a sample (the kernels' offsets within a sample are int32)."""
    first = parts[0]
    layout = _layout(first)
    fits = first.dim() >= 3 and layout is not None and first.dtype in _FLOATS and first.shape[1] <= 512
    fits = fits and first[0].numel() < 2**31
    same = all(p.shape == first.shape and p.stride() == first.stride() and p.dtype == first.dtype for p in parts)
    writes = out is None or (out.shape == first.shape and out.dtype == first.dtype and _layout(out) == layout)
    return fits and same and writes and len(parts) <= MAX_PARTS


def runs_fused(x: torch.Tensor) -> bool:
    """Whether `rms_norm_silu` of `x` runs as the kernel on CUDA (a convolution before it may leave its bias to it)."""
    return x.is_cuda and _fits((x,), None) and triton is not None and not _failed


def _layout(x: torch.Tensor) -> torch.memory_format | None:
    """The layout the kernel reads `x` [B, C, ...] in: contiguous, channels-last (5-D), or None (neither)."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return None


if triton is not None:

    @triton.jit(do_not_specialize=["positions"])
    def _rms_norm_silu_kernel(
        x_ptr, x1_ptr, x2_ptr, g_ptr, b_ptr, out_ptr, channels, positions, scale, eps, channel_stride, position_stride,
        PARTS: tl.constexpr, BIAS: tl.constexpr, PIECES: tl.constexpr, PIECE: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # BLOCK_P positions of one sample x all channels, read as PIECES tiles of PIECE channels (`_pieces`): the
        # channel sums of squares first, then each tile read again (from the cache: the kernel is bound by its
        # arithmetic, not by memory) and written. Offsets within a sample are int32 (`_fits`: under 2**31 values).
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        sample = tl.program_id(1).to(tl.int64) * channels * positions
        x_ptr, x1_ptr, x2_ptr, out_ptr = x_ptr + sample, x1_ptr + sample, x2_ptr + sample, out_ptr + sample
        dtype = out_ptr.dtype.element_ty
        squares = tl.zeros([BLOCK_P], dtype=tl.float32)
        for read in tl.static_range(2 * PIECES):  # PIECES tiles for the sums, then PIECES again for the output
            c = (read % PIECES) * PIECE + tl.arange(0, PIECE)
            mask = (p[:, None] < positions) & (c[None, :] < channels)
            at = p[:, None] * position_stride + c[None, :] * channel_stride
            x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
            if PARTS > 1:  # the parts of a sum (a convolution's time taps), added in order as PyTorch's += adds them
                x = (x + tl.load(x1_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
            if PARTS > 2:
                x = (x + tl.load(x2_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
            if BIAS:  # the convolution's bias, rounded as PyTorch's own add rounds it
                bias = tl.load(b_ptr + c, mask=c < channels, other=0.0).to(tl.float32)
                x = tl.where(mask, (x + bias[None, :]).to(dtype).to(tl.float32), 0.0)
            if read < PIECES:
                squares += tl.sum(x * x, axis=1)
            else:
                if read == PIECES:
                    norm = tl.maximum(tl.sqrt(squares).to(dtype).to(tl.float32), eps)[:, None]
                    inverse = tl.math.div_rn(tl.full([BLOCK_P, 1], 1.0, tl.float32), norm)
                # x / norm, IEEE-rounded without a division an element: the product by the rounded inverse, then
                # one correction by its exact residual (Markstein's theorem: the correctly rounded quotient)
                q = x * inverse
                y = tl.fma(tl.fma(-q, norm, x), inverse, q).to(dtype).to(tl.float32)
                y = (y * scale).to(dtype).to(tl.float32)
                gamma = tl.load(g_ptr + c, mask=c < channels, other=0.0).to(tl.float32)
                y = (y * gamma[None, :]).to(dtype).to(tl.float32)
                y = y / (1.0 + tl.exp(-y))  # SiLU; Triton's division here is within 2 float32 ulps
                tl.store(out_ptr + at, y.to(dtype), mask=mask)


def _pieces(channels: int) -> tuple[int, int]:
    """(PIECES, PIECE): a tile's channels as 3 power-of-two pieces where they are (96, 192, 384: every width of the
    VAE), else one piece padded to a power of two, whose padding the kernel computes on for nothing."""
    third = channels // 3
    if channels % 3 == 0 and third >= 16 and third & (third - 1) == 0:
        return 3, third
    return 1, triton.next_power_of_2(channels)


def _triton_rms_norm_silu(
    parts: tuple[torch.Tensor, ...], gamma: torch.Tensor, scale: float, eps: float, bias, out: torch.Tensor | None
) -> torch.Tensor:
    x = parts[0]
    batch, channels = x.shape[:2]
    positions = x[0, 0].numel()
    layout = _layout(x)
    out = torch.empty_like(x, memory_format=layout) if out is None else out
    strides = (positions, 1) if layout == torch.contiguous_format else (1, channels)
    x1, x2 = (parts[min(i, len(parts) - 1)] for i in (1, 2))  # unread where there are fewer parts
    pieces, piece = _pieces(channels)
    launch(
        _rms_norm_silu_kernel, (triton.cdiv(positions, POSITIONS), batch), x, x1, x2, gamma.reshape(-1),
        x if bias is None else bias, out, channels, positions, float(scale), eps, *strides, PARTS=len(parts),
        BIAS=bias is not None, PIECES=pieces, PIECE=piece, BLOCK_P=POSITIONS, num_warps=_warps(piece),
    )  # fmt: skip
    return out


def _warps(piece: int) -> int:
    """Warps a program: the fastest of 2, 4 and 8 at each VAE width on the H200 (docs/benchmarks.md, "Session 39")."""
    return max(2, min(8, piece // 16))


# The launch's variants (`triton_lang.Signature`): the float32 VAE (the reference's) and the bf16 one, contiguous
# (a position stride of 1) and channels-last (a channel stride of 1), with a convolution's bias and without, and
# the float32 VAE's time taps summed here (three parts)
_NORM = {"BLOCK_P": POSITIONS}
_F32, _BF16 = "*fp32 " * 6 + "i32 i32 fp32 fp32 i32", "*bf16 " * 6 + "i32 i32 fp32 fp32 i32"
_WIDE, _96, _192, _384 = (
    {"PIECES": pieces, "PIECE": piece} for pieces, piece in ((1, 512), (3, 32), (3, 64), (3, 128))
)
SIGNATURES = {
    "_rms_norm_silu_kernel": (
        Signature(_F32, {**_NORM, **_WIDE, "position_stride": 1, "PARTS": 1, "BIAS": False}, {"num_warps": 8}),
        Signature(_F32, {**_NORM, **_96, "channel_stride": 1, "PARTS": 1, "BIAS": True}, {"num_warps": 2}),
        Signature(_F32, {**_NORM, **_384, "channel_stride": 1, "PARTS": 3, "BIAS": True}, {"num_warps": 8}),
        Signature(_BF16, {**_NORM, **_192, "channel_stride": 1, "PARTS": 1, "BIAS": True}, {"num_warps": 4}),
    ),
}  # fmt: skip
