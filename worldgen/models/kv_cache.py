"""The self-attention KV cache of the causal LingBot-World-Fast DiT, and how it is stored.

The Fast model generates a video chunk by chunk; each chunk's queries attend to the keys/values of
the chunks before it (held here) plus its own (full attention inside a chunk). Keys are stored
already rotated (RoPE), so they keep their positions when the cache rolls.

Index rules (the reference's `CausalWanSelfAttention`, one state shared by all layers):
- a call on tokens [current_start, current_end) writes them at slots [local_end - L, local_end) with
  local_end = old local_end + current_end - old global_end; repeated calls on the same chunk (the
  denoising steps and the clean refresh) overwrite the same slots;
- `rolling` (the reference's `local_attn_size != -1`): when a call advances past the cache's end,
  the oldest tokens after the first `sink_frames` frames (the attention sink) are evicted, the rest
  shifted left, and the new chunk appended at the end;
- queries attend to slots [max(0, local_end - max_attention_size), local_end).

Storage (`storage`): the compute dtype (bf16 on CUDA, as the reference), or `fp8`: float8_e4m3fn
with one scale (compute dtype) per token and head (absmax / 448), about half the bytes,
dequantized to the compute dtype only for the window a call reads.
"""

from __future__ import annotations

import dataclasses

import torch

from contracts.settings import KV_CACHE_MODES
from worldgen.kernels import fused
from worldgen.kernels.fp8 import QuantizedTensor

STORAGES = ("model", "fp8")


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """The shape of one job's cache: what the memory plan decides and prints."""

    capacity_tokens: int  # slots per layer
    frame_tokens: int  # tokens of one latent frame (lat_h/2 * lat_w/2)
    storage: str = "model"  # "model" (the compute dtype) or "fp8"
    rolling: bool = False  # evict old frames when full (the reference's local_attn_size gate)
    sink_frames: int = 0  # frames never evicted (attention sink), when rolling
    max_attention_tokens: int | None = None  # attention window; None: the whole cache

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"KV-cache storage must be one of {STORAGES}, not {self.storage!r}")
        if self.capacity_tokens < 1 or self.frame_tokens < 1:
            raise ValueError("a KV cache needs at least one slot and one token per frame")

    def bytes(self, num_layers: int, num_heads: int, head_dim: int, compute_dtype: torch.dtype) -> int:
        """Bytes of keys + values (+ the fp8 scales) over all layers."""
        slots = 2 * num_layers * self.capacity_tokens * num_heads
        size = torch.empty(0, dtype=compute_dtype).element_size()
        if self.storage == "fp8":
            return slots * (head_dim + size)  # one byte per value, one scale per token and head
        return slots * head_dim * size

    def planned_bytes(self, num_layers: int, num_heads: int, head_dim: int, compute_dtype: torch.dtype) -> int:
        """What a plan counts for it: `bytes`, plus for FP8 the window dequantized for one layer at a
        time during attention (transient)."""
        size = torch.empty(0, dtype=compute_dtype).element_size()
        dequant = 2 * self.capacity_tokens * num_heads * head_dim * size if self.storage == "fp8" else 0
        return self.bytes(num_layers, num_heads, head_dim, compute_dtype) + dequant

    def describe(self) -> str:
        kind = "in the compute dtype" if self.storage == "model" else "FP8 (e4m3, per-token scales)"
        text = f"{self.capacity_tokens // self.frame_tokens} latent frames ({self.capacity_tokens:,} tokens), {kind}"
        if self.rolling:
            sink = f"a {self.sink_frames}-frame attention sink" if self.sink_frames else "no attention sink"
            text += f", rolling window with {sink}"
        if self.max_attention_tokens is not None:
            text += f", attention to the last {self.max_attention_tokens:,} cached tokens"
        return text


class LayerKV:
    """One layer's slots (and its text keys/values); `update` is called by `SelfAttention`."""

    def __init__(self, owner: KVCache, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.owner = owner
        self.fp8 = owner.spec.storage == "fp8"
        # slots are only ever read after being written (the window ends at the last write), so the
        # FP8 store need not be zeroed; the compute-dtype one is, as the reference's
        alloc = torch.empty if self.fp8 else torch.zeros
        store = torch.float8_e4m3fn if self.fp8 else dtype
        self.k = alloc(shape, dtype=store, device=device)
        self.v = alloc(shape, dtype=store, device=device)
        if self.fp8:
            self.k_scale = torch.zeros((*shape[:-1], 1), dtype=dtype, device=device)
            self.v_scale = torch.zeros((*shape[:-1], 1), dtype=dtype, device=device)
        self.cross: tuple[torch.Tensor, torch.Tensor] | None = None

    def _tensors(self) -> list[torch.Tensor]:
        return [self.k, self.v, self.k_scale, self.v_scale] if self.fp8 else [self.k, self.v]

    def grow(self, capacity: int, used: int) -> None:
        """Reallocate at `capacity` slots, keeping slots [0, used)."""
        for name in ("k", "v", "k_scale", "v_scale") if self.fp8 else ("k", "v"):
            old = getattr(self, name)
            alloc = torch.empty if old.dtype == torch.float8_e4m3fn else torch.zeros
            new = alloc((old.shape[0], capacity, *old.shape[2:]), dtype=old.dtype, device=old.device)
            new[:, :used] = old[:, :used]
            setattr(self, name, new)
            del old

    def shift(self, step: _Step) -> None:
        """Evict `step.evict` slots after the sink: the kept ones move left. In pieces no longer than the
        eviction, first to last: a piece never overlaps the slots it comes from, and the slots a later
        piece overwrites were read before. One pass, no temporary copy of the window (a clone, then a
        copy back, took twice the time)."""
        sink, ev, kept = step.sink, step.evict, step.kept
        for t in self._tensors():
            for lo in range(0, kept, ev):
                n = min(ev, kept - lo)
                t[:, sink + lo : sink + lo + n] = t[:, sink + ev + lo : sink + ev + lo + n]

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write this call's rotated keys and values [1, L, n, d] into its slots (after its eviction)."""
        step = self.owner.step
        if step.evict:
            self.shift(step)
        start, end = step.write_start, step.write_end
        if self.fp8:
            for value, store, scale in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
                fused.quantize_per_token_into(value, store[:, start:end], scale[:, start:end])
        else:
            self.k[:, start:end] = k
            self.v[:, start:end] = v

    def update(self, k: torch.Tensor, v: torch.Tensor, fp8_window: bool = False) -> tuple:
        """`write`, then return the window to attend to: in k's dtype, or, with `fp8_window` and FP8
        storage, as two `QuantizedTensor`s (one scale each, made from the stored bytes: the FP8
        attention's input without a bf16 copy of the window)."""
        self.write(k, v)
        step = self.owner.step
        end = step.write_end
        if self.fp8:
            lo = step.window_start
            windows = ((self.k[:, lo:end], self.k_scale[:, lo:end]), (self.v[:, lo:end], self.v_scale[:, lo:end]))
            if fp8_window:
                return tuple(QuantizedTensor(*fused.requantize_per_tensor(d, s)) for d, s in windows)
            # dequantized in the compute dtype: one window-sized copy per layer, freed after attention
            return tuple(fused.dequantize_per_token(d, s, k.dtype) for d, s in windows)
        return self.k[:, step.window_start : end], self.v[:, step.window_start : end]


@dataclasses.dataclass(frozen=True)
class _Step:
    write_start: int
    write_end: int
    window_start: int
    evict: int = 0
    kept: int = 0
    sink: int = 0


class KVCache:
    """Per-layer self-attention slots for one rollout (batch 1), plus each layer's text keys/values.

    `start_tokens` allocates fewer slots at first (the Fast loop starts with one chunk's worth, so the
    rest of the conditioning frames can be encoded beside it); `grow` then reallocates at the spec's
    capacity. Until then nothing can have been evicted, so the slots and windows are those of a cache
    allocated whole from the start.
    """

    def __init__(
        self,
        spec: CacheSpec,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        start_tokens: int | None = None,
    ):
        self.spec = spec
        self.capacity = spec.capacity_tokens if start_tokens is None else min(start_tokens, spec.capacity_tokens)
        shape = (1, self.capacity, num_heads, head_dim)
        self.layers = [LayerKV(self, shape, dtype, torch.device(device)) for _ in range(num_layers)]
        self.global_end = 0  # one past the last video token written so far
        self.local_end = 0  # one past the last slot written so far
        self.step: _Step | None = None
        self._pending: tuple[int, int] | None = None

    @property
    def has_text(self) -> bool:
        return self.layers[0].cross is not None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer._tensors())

    def grow(self) -> None:
        """Reallocate every layer at the spec's capacity, keeping the slots written so far."""
        if self.capacity == self.spec.capacity_tokens:
            return
        for layer in self.layers:
            layer.grow(self.spec.capacity_tokens, self.local_end)
        self.capacity = self.spec.capacity_tokens

    def begin(self, current_start: int, num_tokens: int) -> None:
        """Decide where a call on tokens [current_start, current_start + num_tokens) writes and reads."""
        spec = self.spec
        capacity = self.capacity
        current_end = current_start + num_tokens
        evict = kept = sink = 0
        if spec.rolling and current_end > self.global_end and num_tokens + self.local_end > capacity:
            sink = spec.sink_frames * spec.frame_tokens
            evict = num_tokens + self.local_end - capacity
            kept = self.local_end - evict - sink
            if kept < 0:
                raise ValueError(
                    f"KV cache of {capacity} tokens cannot roll past a {sink}-token sink for a "
                    f"{num_tokens}-token chunk: make it larger or the sink smaller"
                )
        local_end = self.local_end + current_end - self.global_end - evict
        if local_end > capacity or local_end - num_tokens < 0:
            raise ValueError(
                f"KV cache of {capacity} tokens has no room for tokens [{current_start}, {current_end}) "
                "(a non-rolling cache must hold the whole video)"
            )
        window = spec.max_attention_tokens or capacity
        self.step = _Step(local_end - num_tokens, local_end, max(0, local_end - window), evict, kept, sink)
        self._pending = (current_end, local_end)

    def evict_now(self) -> None:
        """Do the begun call's eviction on every layer now, so its `update`s only write: the slots a
        call writes and reads are then the same for every call of a steady chunk loop (what a captured
        chunk forward needs, `worldgen.models.chunk_graph`). The same slots end up in the same places."""
        step = self.step
        if step is None or not step.evict:
            return
        for layer in self.layers:
            layer.shift(step)
        self.step = dataclasses.replace(step, evict=0, kept=0, sink=0)

    @property
    def storage_key(self) -> tuple:
        """What a captured forward depends on beside the step: which buffers, at which capacity."""
        first = self.layers[0]
        return (id(self), self.capacity, first.k.data_ptr())

    def close(self) -> None:
        """Free every slot now (layers point back at the cache, so dropping it alone would wait for gc)."""
        for layer in self.layers:
            layer.owner = None
            layer.k = layer.v = layer.cross = None
            if layer.fp8:
                layer.k_scale = layer.v_scale = None
        self.layers = []

    def commit(self) -> None:
        """After all layers ran: the call's end becomes the cache's end."""
        self.global_end, self.local_end = self._pending
        self.step = self._pending = None


MODES = KV_CACHE_MODES


def plan_cache(
    latent_frames: int,
    frame_tokens: int,
    chunk_frames: int,
    *,
    room_bytes: float | None,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    compute_dtype: torch.dtype,
    mode: str = "auto",
    sink_frames: int | None = None,
    max_attention_tokens: int | None = None,
    cache_frames: int | None = None,
) -> tuple[CacheSpec, str]:
    """Choose one job's cache and say why. `room_bytes` is what the budget leaves for it (None: no
    budget). `auto` takes the first that fits of: the reference's cache (whole video, compute dtype;
    with `max_attention_tokens`, only the frames it reads), the same in FP8, a rolling FP8 window
    (sink + as many whole chunks as fit). `full`, `fp8` and
    `rolling` force a kind (a rolling window still sized to the room). FP8 sizes include the window
    dequantized for one layer during attention. `cache_frames` (LingBot-World 2.0's local_attn_size): the
    reference's cache is that many frames, rolling with `sink_frames` kept, and a rolling fallback is never
    longer. Raises ValueError when even
    the smallest rolling window (sink + one chunk) does not fit."""
    if mode not in MODES:
        raise ValueError(f"KV-cache mode must be one of {MODES}, not {mode!r}")

    def make(frames: int, storage: str, rolling: bool, sink: int) -> CacheSpec:
        return CacheSpec(frames * frame_tokens, frame_tokens, storage, rolling, sink, max_attention_tokens)

    def size(spec: CacheSpec) -> int:
        return spec.planned_bytes(num_layers, num_heads, head_dim, compute_dtype)

    # the reference: whole video; max_attention_tokens also flips its rolling gate (never rolls here)
    ref_rolling, ref_sink = max_attention_tokens is not None, sink_frames or 0
    held, what = latent_frames, "whole video"
    if max_attention_tokens is not None:
        # the reference reads only the last max_attention_tokens of its whole-video cache: a cache of the
        # window's frames (at least a chunk's) that rolls without a sink gives every call the same keys
        # and values, so a job longer than the window costs no more memory or time a chunk than one as long
        window_frames = max(-(-max_attention_tokens // frame_tokens), chunk_frames)
        if window_frames < latent_frames:
            held, what, ref_sink = window_frames, f"the attention window's {window_frames} latent frames", 0
    if cache_frames is not None and cache_frames < latent_frames:
        ref_rolling, ref_sink, held = True, sink_frames or 0, cache_frames
        what = f"the reference's rolling window of {held} latent frames ({ref_sink}-frame sink)"
    gib = 2**30
    if mode in ("auto", "full"):
        spec = make(held, "model", ref_rolling, ref_sink)
        if room_bytes is None or size(spec) <= room_bytes or mode == "full":
            return spec, f"{what} in the compute dtype ({size(spec) / gib:.1f} GiB), as the reference reads it"
    if mode in ("auto", "fp8"):
        spec = make(held, "fp8", ref_rolling, ref_sink)
        if room_bytes is None or size(spec) <= room_bytes or mode == "fp8":
            return spec, f"{what} in FP8 ({size(spec) / gib:.1f} GiB): bf16 would not fit the budget"
    sink = asked_sink = 1 if sink_frames is None else sink_frames
    per_frame = size(make(1, "fp8", True, 0))
    fit_frames = latent_frames if room_bytes is None else int(room_bytes // per_frame)
    if fit_frames - sink < chunk_frames <= fit_frames:  # the sink asked for leaves no room for a chunk: a smaller one
        sink = fit_frames - chunk_frames
    chunks = min((fit_frames - sink) // chunk_frames, -(-(latent_frames - sink) // chunk_frames))
    if chunks < 1:
        need = (sink + chunk_frames) * per_frame / gib
        raise ValueError(
            f"the smallest rolling KV cache ({sink} sink frame(s) + one chunk, {need:.2f} GiB) does not fit "
            f"the {0 if room_bytes is None else room_bytes / gib:.2f} GiB left: raise --vram-budget or lower --size"
        )
    frames = min(sink + chunks * chunk_frames, latent_frames, cache_frames or latent_frames)
    spec = make(frames, "fp8", True, sink)
    why = (
        f"rolling FP8 window of {frames} of {latent_frames} latent frames ({size(spec) / gib:.1f} GiB, "
        f"{sink}-frame attention sink): the whole video would need {size(make(latent_frames, 'fp8', False, 0)) / gib:.1f} GiB"
    )
    if sink < asked_sink:
        why += f"; the sink cut from {asked_sink} to {sink} frame(s): {asked_sink} and one chunk do not fit"
    return spec, why
