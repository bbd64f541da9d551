"""Wan2.1 video VAE (causal 3-D conv autoencoder, 4x temporal / 8x spatial), reference numerics.

Hand-written for memory control: video is encoded one chunk at a time (frame 0 alone, then 4 frames
per chunk) and decoded one latent frame at a time, and every causal convolution carries the last 2
frames of its input from one chunk to the next in a `FrameCache`. `encode_chunk` / `decode_chunk`
are the units a caller can later tile spatially (one cache per tile).

Structure and state-dict keys are those of the reference `Wan2.1_VAE.pth`. Two chunk rules of the
reference that are not plain causal convolution over the whole stream, reproduced here:
- a temporal downsample keeps the first chunk's single frame as is, then convolves (kernel 3,
  stride 2) over [last frame of the previous chunk, this chunk];
- a temporal upsample leaves the first chunk (latent frame 0) as one frame; later chunks are
  doubled by a causal conv whose history starts at latent frame 1 (zeros before it).
Spatial convs of resamplers run as Conv3d with a (1, 3, 3) view of the Conv2d weight: the same
sums without reshaping the video into a batch of images.

A server's bf16 VAE on CUDA (the Fast model's fp8 path, `timed_conv`, set by the loader for a long-lived
pipeline) lets cuDNN time its convolution algorithms once per shape (`cudnn.benchmark`, `_conv_algorithms`):
encode 1.29 -> 1.08-1.14 s and decode 2.15 -> 1.88-1.99 s an 81-frame rollout on the H100, for ~2.3 s more at
the process's start, so a one-job process (`generate`) keeps cuDNN's heuristics (docs/benchmarks.md, "Session
16: Fast"); the algorithm, and with it the last bit of a bf16 sum, can differ between processes. A float32 VAE
(the reference's numerics) always keeps the heuristics: timed, its decode ran slower under a 24 GiB cap.

On CUDA the VAE runs channels-last (`torch.channels_last_3d`: [B, C, T, H, W] stored as B, T, H, W, C;
`WanVAE.channels_last`, None: on CUDA only): cuDNN's convolutions run in that layout, and with contiguous
tensors every one of them transposed its input and output (0.39 GPU s of an 81-frame Fast rollout in bf16,
0.43 s in float32). With it and the decoded chunks' pinned copy to the host (`cuda_memory.to_host`, ~0.25 s
of it), the rollout's bf16 decode went from 1.84-1.93 to 1.22-1.24 s, its encode from 1.07-1.15 to
0.89-0.92 s on the H100 (docs/benchmarks.md, "Session 17: Fast"). The layers here keep the layout through
their joins, pads and shuffles (`upsample_2x`, `interleave_frame_pairs`); elementwise ops and `torch.cat`
keep it by themselves. The CPU keeps the contiguous layout (the golden tests' numbers; its convolutions
return contiguous tensors anyway).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from worldgen.errors import InputError
from worldgen.kernels import channel_norm, conv_bias, upsample
from worldgen.models.vae_config import WAN21_VAE, VAEConfig

CACHE_FRAMES = 2
# on CUDA a residual block's convolutions leave their bias to the kernel reading their output (one pass less
# over the activation each, the same bits: `worldgen.kernels.conv_bias`); False adds it as PyTorch does
FOLD_CONV_BIAS = True

# on CUDA a causal convolution 3 frames deep, channels-last, runs in these dtypes as three 2-D convolutions over the
# frames, summed (`_time_taps`): in float32 (TF32) cuDNN's 2-D kernels beat its 3-D ones at the decoder's shapes
TIME_TAPS_DTYPES = {torch.float32}
TIME_TAPS_DEVICES = {"cuda"}
# a residual block's convolutions hand their three taps to the kernel reading them (the channel norm, the residual
# add), which sums them as it reads (`worldgen.kernels.channel_norm`): two passes of `+=` over the output less
SUM_TAPS_IN_READER = True
# a norm before a causal convolution writes into that convolution's [past | new frames] input (channels-last), which
# then needs no `torch.cat` of the past and the new frames: one read and write of all its frames less
JOIN_IN_PLACE = True

# State carried between chunks of one stream (one video, or later one spatial tile of it):
# module -> its cached input frames (None marks "first chunk seen" for temporal upsamplers).
FrameCache = dict
# A FrameCache entry while a push is watched (`watch_stillness`): a device bool, True while every cache write of
# the push wrote what the cache held already
STILL = "still"


class CausalConv3d(nn.Conv3d):
    """Conv3d that pads only the past in time: 2*p frames, taken from the cache where it has them."""

    def __init__(self, in_dim: int, out_dim: int, kernel, stride=1, padding=0):
        kernel = (kernel,) * 3 if isinstance(kernel, int) else tuple(kernel)
        padding = (padding,) * 3 if isinstance(padding, int) else tuple(padding)
        super().__init__(in_dim, out_dim, kernel, stride=stride, padding=(0, padding[1], padding[2]))
        self.time_pad = 2 * padding[0]

    def forward(
        self,
        x: torch.Tensor,
        cache: FrameCache | None = None,
        bias: bool = True,
        parts: bool = False,
        joined: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """bias=False: without the bias, which the kernel reading the output adds (`worldgen.kernels.conv_bias`).
        parts=True: where the time taps run, their three outputs unsummed, for a reader that sums them
        (`channel_norm.sum_parts`'s order); else the output. joined: x is the new-frames slot of this tensor,
        made by `join_buffer` (the past frames in front of it already)."""
        if self.time_pad:
            past = cache.get(self) if cache is not None else None
            if joined is None:
                front = [] if past is None else [past]
                missing = self.time_pad - (0 if past is None else past.shape[2])
                if missing:
                    zeros = torch.zeros(*x.shape[:2], missing, *x.shape[3:], dtype=x.dtype, device=x.device)
                    front.insert(0, zeros.contiguous(memory_format=layout_of(x)))
                joined = torch.cat([*front, x], dim=2)
            if cache is not None:
                _keep_last_frames(cache, self, past, x, joined)
            x = joined
        bias_or_none = self.bias if bias else None
        if self._takes_time_taps(x):
            return _time_taps(x, self.weight, bias_or_none, self.padding[1:], parts=parts)
        return self._conv_forward(x, self.weight, bias_or_none)

    def join_buffer(self, x: torch.Tensor, cache: FrameCache | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(joined, slot): this layer's next input [past | new frames] in x's shape, dtype and layout, its past
        frames written (the cache's, zeros before them, as `forward` joins them), and the view of it the new frames
        go to, for whoever makes them to write there (`_normed_input`). Channels-last, a frame is one block of
        memory, so the slot is dense in that layout too."""
        past = cache.get(self) if cache is not None else None
        held = 0 if past is None else past.shape[2]
        b, c, t, h, w = x.shape
        joined = torch.empty(b, c, self.time_pad + t, h, w, dtype=x.dtype, device=x.device, memory_format=layout_of(x))
        missing = self.time_pad - held
        if missing:
            joined[:, :, :missing].zero_()
        if held:
            joined[:, :, missing : self.time_pad].copy_(past)
        return joined, joined[:, :, self.time_pad :]

    def _takes_time_taps(self, x: torch.Tensor) -> bool:
        single = x.shape[0] == 1 and self.stride == (1, 1, 1) and self.dilation == (1, 1, 1) and self.groups == 1
        shape_ok = single and self.kernel_size[0] == 3 and x.dim() == 5 and layout_of(x) == torch.channels_last_3d
        return x.device.type in TIME_TAPS_DEVICES and x.dtype in TIME_TAPS_DTYPES and shape_ok


def _time_taps(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple[int, int], parts: bool = False
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """conv3d of x [1, C, T + 2, H, W] (channels-last, its past frames joined) with a kernel 3 frames deep, as the sum
    of three conv2d over its frames (tap k reads frames k .. k + T - 1): the same sums in another order. cuDNN's
    TF32 2-D kernels ran the float32 decoder's convolutions 1.1-1.6x faster than its 3-D ones on the H200 (96
    channels at 464x832: 3.9 against 5.8 ms for 4 frames; docs/benchmarks.md, "Session 31"); in bf16 the 3-D
    kernels are level or faster, and three roundings of the partial sums would add error. Each tap's weight is
    copied channels-last per call (kept, the copies would hold the decoder's weights twice on the device). The bias
    is added last, as the kernels reading a convolution without its bias add it (`worldgen.kernels.conv_bias`): the
    same bits either way. parts=True (no bias): the three taps' outputs, unsummed, for a reader that sums them."""
    frames = x[0].transpose(0, 1)  # [T + 2, C, H, W], channels-last: a view
    taps = [w.contiguous(memory_format=torch.channels_last) for w in weight.unbind(2)]
    t = frames.shape[0] - 2

    def tap(k: int) -> torch.Tensor:
        return F.conv2d(frames[k : k + t], taps[k], padding=padding)

    if parts and bias is None:
        return tuple(tap(k).unsqueeze(0).transpose(1, 2) for k in range(3))  # each [1, out, T, H, W], channels-last
    y = tap(0)
    y += tap(1)
    y += tap(2)
    if bias is not None:
        y += bias.view(-1, 1, 1)
    return y.unsqueeze(0).transpose(1, 2)  # [1, out, T, H, W], channels-last


def layout_of(x: torch.Tensor) -> torch.memory_format:
    """channels-last for a 5-D tensor stored so (and not also contiguous), else contiguous."""
    channels_last = x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)
    return torch.channels_last_3d if channels_last else torch.contiguous_format


def upsample_2x(x: torch.Tensor) -> torch.Tensor:
    """Nearest ("nearest-exact": source pixel dst // 2 at scale 2) 2x spatial upsampling of [B, C, T, H, W]
    as one copy in x's layout, whichever it is (the values of `F.interpolate(..., mode="nearest-exact")`); on CUDA,
    channels-last, one Triton copy (`worldgen.kernels.upsample`: PyTorch's copy of the 7-D view is slow)."""
    b, c, t, h, w = x.shape
    if upsample.takes(x):
        return upsample.upsample_2x_channels_last(x)
    if layout_of(x) == torch.channels_last_3d:
        rows = x.permute(0, 2, 3, 4, 1)[:, :, :, None, :, None, :].expand(b, t, h, 2, w, 2, c)
        return rows.reshape(b, t, 2 * h, 2 * w, c).permute(0, 4, 1, 2, 3)
    return x[:, :, :, :, None, :, None].expand(b, c, t, h, 2, w, 2).reshape(b, c, t, 2 * h, 2 * w)


def interleave_frame_pairs(x: torch.Tensor) -> torch.Tensor:
    """[B, 2C, T, H, W], channel halves the two output frames of each input frame -> [B, C, 2T, H, W], x's layout."""
    b, c2, t, h, w = x.shape
    c = c2 // 2
    if layout_of(x) == torch.channels_last_3d:
        frames = x.permute(0, 2, 3, 4, 1).reshape(b, t, h, w, 2, c).permute(0, 1, 4, 2, 3, 5)
        return frames.reshape(b, 2 * t, h, w, c).permute(0, 4, 1, 2, 3)
    return x.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)


def _last_frames(past: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The last CACHE_FRAMES frames of the stream [past, x], as a fresh tensor."""
    if x.shape[2] >= CACHE_FRAMES or past is None:
        return x[:, :, -CACHE_FRAMES:].clone()
    return torch.cat([past[:, :, -1:], x], dim=2)


def _keep_last_frames(
    cache: FrameCache, layer: nn.Module, past: torch.Tensor | None, x: torch.Tensor, joined: torch.Tensor
) -> None:
    """cache[layer] = the last CACHE_FRAMES frames of the stream [past, x]; `joined` is [.., past, x] (read
    already). Once the cache holds that many frames they are written into its own tensor: a decoder's
    caches (3.8 GiB at 480p in float32, one per causal convolution) allocated anew at every frame, amid
    the push's transients, fragmented the memory they shared with the Fast DiT's KV cache at a 24 GiB
    card's cap (docs/benchmarks.md, "Session 20: Fast"). The same frames either way."""
    if past is not None and past.shape[2] == CACHE_FRAMES:
        _rewrite(cache, past, joined[:, :, -CACHE_FRAMES:])
    else:
        _note_change(cache)
        cache[layer] = _last_frames(past, x)


def watch_stillness(cache: FrameCache, device: torch.device) -> None:
    """Watch the next push on `cache`: `still_after` then says whether it left every cached frame as it was."""
    cache[STILL] = torch.ones((), dtype=torch.bool, device=device)


def still_after(cache: FrameCache) -> bool:
    """Whether the watched push left the caches as they were (one sync), the watch ended. Such a state is a fixed
    point: the stream's next push of the same frames computes the same numbers from the same caches, so gives the
    same output and leaves them as they are again (a conditioning video's black frames: `StreamingEncoder.still`)."""
    flag = cache.pop(STILL, None)
    return flag is not None and bool(flag)


def _rewrite(cache: FrameCache, held: torch.Tensor, frames: torch.Tensor) -> None:
    """held <- frames (a cache's own tensor), noting for a watched push whether that changed anything."""
    flag = cache.get(STILL)
    if flag is not None:
        flag.logical_and_(torch.eq(held, frames).all())  # no sync: read once, by `still_after`
    held.copy_(frames)


def _note_change(cache: FrameCache) -> None:
    """A watched push made a cache entry (or grew one): not still."""
    flag = cache.get(STILL)
    if flag is not None:
        flag.fill_(False)


class RMSNorm(nn.Module):
    """Channel RMS norm: F.normalize over channels * sqrt(C) * gamma."""

    def __init__(self, dim: int, images: bool = False):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma

    def then_silu(
        self, x: channel_norm.Summands, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """silu(self(x + bias)): one kernel on CUDA (`worldgen.kernels.channel_norm`), these ops elsewhere; x may be
        the parts of a sum (a convolution's time taps), `out` where to write it."""
        return channel_norm.rms_norm_silu(x, self.gamma, self.scale, bias=bias, out=out)


def _conv2d_per_frame(x: torch.Tensor, conv: nn.Conv2d, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """Apply a Conv2d to every frame of [B, C, T, H, W] without folding time into the batch."""
    weight = conv.weight.unsqueeze(2)  # [out, in, 1, k, k]
    return F.conv3d(x, weight, conv.bias, stride=(1, stride, stride), padding=(0, padding, padding))


class Resample(nn.Module):
    """2x spatial (and optionally 2x temporal) down- or upsampling between resolution levels."""

    def __init__(self, dim: int, mode: str):
        super().__init__()
        if mode not in ("upsample2d", "upsample3d", "downsample2d", "downsample3d"):
            raise ValueError(f"unknown resample mode {mode!r}")
        self.mode = mode
        # Sequential index 0 is the parameter-free pad/upsample: keeps the reference key `resample.1`.
        if mode.startswith("up"):
            upsample = nn.Upsample(scale_factor=2.0, mode="nearest-exact")
            self.resample = nn.Sequential(upsample, nn.Conv2d(dim, dim // 2, 3, padding=1))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        conv = self.resample[1]
        if self.mode.startswith("up"):
            if self.mode == "upsample3d":
                x = self._double_frames(x, cache)
            return _conv2d_per_frame(upsample_2x(x), conv, padding=1)

        x = _conv2d_per_frame(F.pad(x, (0, 1, 0, 1)), conv, stride=2)
        if self.mode == "downsample3d":
            past = cache.get(self)
            if past is None:  # the first chunk (frame 0) passes through un-convolved
                _note_change(cache)
                cache[self] = x[:, :, -1:].clone()
            else:  # the last frame kept in the cache's own tensor once the cat has read it (as above)
                joined = torch.cat([past, x], dim=2)
                _rewrite(cache, past, x[:, :, -1:])
                x = self.time_conv(joined)
        return x

    def _double_frames(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        if self not in cache:  # first chunk: latent frame 0 stays a single frame
            _note_change(cache)
            cache[self] = None
            return x
        return interleave_frame_pairs(self.time_conv(x, cache))  # [B, 2C, T, H, W] -> [B, C, 2T, H, W]


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        # Index layout of the reference Sequential (norm, silu, conv, norm, silu, dropout, conv).
        self.residual = nn.Sequential(
            RMSNorm(in_dim), nn.SiLU(), CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMSNorm(out_dim), nn.SiLU(), nn.Identity(), CausalConv3d(out_dim, out_dim, 3, padding=1),
        )  # fmt: skip
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        h = self.shortcut(x)
        if not (FOLD_CONV_BIAS and conv_bias.folds(x)):
            return _run(self.residual, x, cache) + h
        # on CUDA: each convolution's bias (and its time taps' sum) left to the kernel reading it next; each input
        # dropped once read, so the taps of one convolution and the next are never held together
        norm1, _, conv1, norm2, _, _, conv2 = self.residual  # the dropout (index 5) is an identity
        a, joined = _normed_input(norm1, x, conv1, cache)
        y = conv1(a, cache, bias=False, parts=SUM_TAPS_IN_READER, joined=joined)
        del a, joined  # read: not held beside y's taps and the next joined input (1.5 outputs at the peak)
        a, joined = _normed_input(norm2, y, conv2, cache, norm_bias=conv1.bias)
        del y
        r = conv2(a, cache, bias=False, parts=SUM_TAPS_IN_READER, joined=joined)
        del a, joined
        return conv_bias.residual_add(r, conv2.bias, h)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(frames)).reshape(b * t, 1, 3 * c, h * w).transpose(-1, -2)
        q, k, v = qkv.contiguous().chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(q, k, v)  # [BT, 1, HW, C]
        out = self.proj(out.squeeze(1).transpose(1, 2).reshape(b * t, c, h, w))
        return x + out.reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)  # channels-last in, channels-last out


_CACHED = (CausalConv3d, Resample, ResidualBlock, AttentionBlock)  # layers that take the cache


def _run(layers: nn.Sequential, x: torch.Tensor, cache: FrameCache, stop: int | None = None) -> torch.Tensor:
    """The layers in order (up to `stop`); an RMSNorm followed by SiLU as one step (`RMSNorm.then_silu`), written
    into the input of a causal convolution after them where it can be (`_joins`: a head's, a residual block's first)."""
    i, stop = 0, len(layers) if stop is None else stop
    while i < stop:
        layer = layers[i]
        if isinstance(layer, RMSNorm) and i + 1 < stop and isinstance(layers[i + 1], nn.SiLU):
            conv = layers[i + 2] if i + 2 < stop else None
            if isinstance(conv, CausalConv3d) and _joins(x, conv, cache):
                x, joined = _normed_input(layer, x, conv, cache)
                x, i = conv(x, cache, joined=joined), i + 3
                del joined  # read: not held through the layers after it
                continue
            x, i = layer.then_silu(x), i + 2
            continue
        x = layer(x, cache) if isinstance(layer, _CACHED) else layer(x)
        i += 1
    return x


def _joins(x: channel_norm.Summands, conv: CausalConv3d, cache: FrameCache | None) -> bool:
    """Whether the norm before `conv` writes into its [past | new frames] input (`JOIN_IN_PLACE`): a convolution with
    a past, on a stream (a cache), channels-last (where the new frames' slot is dense)."""
    first = x if isinstance(x, torch.Tensor) else x[0]
    return JOIN_IN_PLACE and bool(conv.time_pad) and cache is not None and layout_of(first) == torch.channels_last_3d


def _normed_input(
    norm: RMSNorm,
    x: channel_norm.Summands,
    conv: CausalConv3d,
    cache: FrameCache,
    norm_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input, joined): silu(norm(x + norm_bias)) as `conv`'s next input, written into its [past | new frames] buffer
    where it `_joins` (`joined`, the buffer, for `conv(input, cache, joined=joined)`), else a tensor of its own."""
    if _joins(x, conv, cache):
        joined, slot = conv.join_buffer(x if isinstance(x, torch.Tensor) else x[0], cache)
        norm.then_silu(x, bias=norm_bias, out=slot)
        return slot, joined
    return norm.then_silu(x, bias=norm_bias), None


def _head(in_dim: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(RMSNorm(in_dim), nn.SiLU(), CausalConv3d(in_dim, out_dim, 3, padding=1))


class Encoder3d(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)
        layers: list[nn.Module] = []
        scale = 1.0
        for level, (in_dim, out_dim) in enumerate(pairwise(dims)):
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(in_dim, out_dim))
                if scale in cfg.attn_scales:
                    layers.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if level != len(cfg.dim_mult) - 1:
                mode = "downsample3d" if cfg.temperal_downsample[level] else "downsample2d"
                layers.append(Resample(out_dim, mode))
                scale /= 2.0
        self.downsamples = nn.Sequential(*layers)
        self.middle = nn.Sequential(ResidualBlock(dims[-1], dims[-1]), AttentionBlock(dims[-1]),
                                    ResidualBlock(dims[-1], dims[-1]))  # fmt: skip
        self.head = _head(dims[-1], 2 * cfg.z_dim)

    def forward(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        x = self.conv1(x, cache)
        x = _run(self.downsamples, x, cache)
        x = _run(self.middle, x, cache)
        return _run(self.head, x, cache)


class Decoder3d(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        mult = cfg.dim_mult
        dims = [cfg.dim * m for m in (mult[-1], *mult[::-1])]
        temporal_upsample = cfg.temperal_downsample[::-1]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]),
                                    ResidualBlock(dims[0], dims[0]))  # fmt: skip
        layers: list[nn.Module] = []
        scale = 1.0 / 2 ** (len(mult) - 2)
        for level, (in_dim, out_dim) in enumerate(pairwise(dims)):
            if level > 0:  # the upsampler before this level halved the channels
                in_dim //= 2
            for _ in range(cfg.num_res_blocks + 1):
                layers.append(ResidualBlock(in_dim, out_dim))
                if scale in cfg.attn_scales:
                    layers.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if level != len(mult) - 1:
                layers.append(Resample(out_dim, "upsample3d" if temporal_upsample[level] else "upsample2d"))
                scale *= 2.0
        self.upsamples = nn.Sequential(*layers)
        self.head = _head(dims[-1], 3)

    def forward(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        x = self.conv1(x, cache)
        x = _run(self.middle, x, cache)
        x = _run(self.upsamples, x, cache)
        return _run(self.head, x, cache)


class WanVAE(nn.Module):
    """`encode(video) -> normalised latent mean`, `decode(latent) -> video in [-1, 1]`: float32 in and out, the
    network in the parameters' dtype."""

    def __init__(self, cfg: VAEConfig = WAN21_VAE):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder3d(cfg)
        self.conv1 = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)
        self._scales: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # `_scale`'s, per device
        self.timed_conv = False  # a bf16 VAE on CUDA: cuDNN times its algorithms (module docstring)
        # activations and convolution weights channels-last (module docstring): None on CUDA only, or always / never
        self.channels_last: bool | None = None
        self._weights_layout = torch.contiguous_format

    def _layout(self, weight: torch.Tensor) -> torch.memory_format:
        """The activations' layout on `weight`'s device, the convolution weights moved to it (once)."""
        wanted = weight.is_cuda if self.channels_last is None else self.channels_last
        layout = torch.channels_last_3d if wanted else torch.contiguous_format
        if layout != self._weights_layout:
            images = torch.channels_last if layout == torch.channels_last_3d else torch.contiguous_format
            for module in self.modules():
                if isinstance(module, nn.Conv3d | nn.Conv2d):
                    kernel = module.weight
                    kernel.data = kernel.data.contiguous(memory_format=layout if kernel.dim() == 5 else images)
            self._weights_layout = layout
        return layout

    def _scale(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, 1 / std) [1, z, 1, 1, 1] on `device`, made once a device: a tensor built from a Python list
        on a GPU is a blocking copy that waits for the GPU's queue, and every chunk's encode and decode did
        it once a tile (4.4 s of a profiled pair of Fast rollouts on the H100, docs/benchmarks.md)."""
        key = torch.device(device)
        if key not in self._scales:
            shape = (1, self.config.z_dim, 1, 1, 1)
            mean = torch.tensor(self.config.mean, dtype=torch.float32, device=key).view(shape)
            inv_std = 1.0 / torch.tensor(self.config.std, dtype=torch.float32, device=key).view(shape)
            self._scales[key] = (mean, inv_std)
        return self._scales[key]

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """video [B, 3, F, H, W] in [-1, 1], F = 4k+1, H and W multiples of 8 -> [B, z, k+1, H/8, W/8]."""
        if video.ndim != 5 or video.shape[1] != 3:
            raise InputError(f"VAE encode expects video [B, 3, F, H, W], got shape {tuple(video.shape)}")
        frames, height, width = video.shape[2:]
        if (frames - 1) % 4 or height % 8 or width % 8:
            raise InputError(
                f"VAE encode needs F = 4k+1 frames and H, W multiples of 8; got F={frames}, H={height}, "
                f"W={width}: resize/trim the video"
            )
        cache: FrameCache = {}
        starts = [0, *range(1, frames, 4)]
        latents = [self.encode_chunk(video[:, :, s : s + (1 if s == 0 else 4)], cache) for s in starts]
        return torch.cat(latents, dim=2)

    def encode_chunk(self, chunk: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        """One chunk (frame 0 alone, then 4 frames) -> its normalised latent frame, float32."""
        weight = self.conv1.weight
        layout = self._layout(weight)
        with _conv_algorithms(weight, self.timed_conv):
            x = self.encoder(chunk.to(weight.dtype, memory_format=layout), cache)
        z = self.config.z_dim  # only the mean half of the posterior is needed
        mu = F.conv3d(x, weight[:z], self.conv1.bias[:z])
        del x
        mean, inv_std = self._scale(mu.device)
        return (mu.to(torch.float32, memory_format=torch.contiguous_format) - mean) * inv_std

    @torch.no_grad()
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """latent [B, z, T, h, w] (normalised) -> video [B, 3, 4(T-1)+1, 8h, 8w] float32 in [-1, 1]."""
        if latent.ndim != 5 or latent.shape[1] != self.config.z_dim:
            raise InputError(f"VAE decode expects latent [B, {self.config.z_dim}, T, h, w], got {tuple(latent.shape)}")
        cache: FrameCache = {}
        frames = [self.decode_chunk(latent[:, :, t : t + 1], cache) for t in range(latent.shape[2])]
        return torch.cat(frames, dim=2)

    def decode_chunk(self, latent_frame: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        """One normalised latent frame -> its pixel frames (1 for the first, then 4), float32, clamped."""
        mean, inv_std = self._scale(latent_frame.device)
        layout = self._layout(self.conv2.weight)
        z = (latent_frame.float() / inv_std + mean).to(self.conv2.weight.dtype, memory_format=layout)
        with _conv_algorithms(self.conv2.weight, self.timed_conv):
            x = self.decoder(self.conv2(z), cache)
        return x.to(torch.float32, memory_format=torch.contiguous_format).clamp_(-1.0, 1.0)


@contextlib.contextmanager
def _conv_algorithms(weight: torch.Tensor, timed: bool) -> Iterator[None]:
    """cuDNN times its algorithms for a `timed` bf16 VAE on CUDA, keeps its heuristics otherwise."""
    timed = timed and weight.is_cuda and weight.dtype == torch.bfloat16
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or timed
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before
