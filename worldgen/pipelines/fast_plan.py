"""What one LingBot-World-Fast job is, before any tensor exists: its frames (whole chunks), its 4-step
schedule, its options (cache mode, attention window, sink), the streamed VAE's cuts and the reference's
KV-cache spec. Pure numbers: the chunk loop itself lives in `worldgen.pipelines.fast`.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from contracts.generation_request import FAST_CHUNK_FRAMES
from contracts.model_families import V1_FAST, ModelFamily
from contracts.settings import FIELD_BY_NAME, GenerationSettings
from worldgen.errors import InputError
from worldgen.kernels.fp8 import MIN_ROWS, Fp8Weight
from worldgen.kernels.int8 import Int8Weight
from worldgen.kernels.quantized_weights import held, saved_bytes
from worldgen.kernels.triton_lang import deferring
from worldgen.models.camera_cache import block_bytes
from worldgen.models.dit import Block, Linear
from worldgen.models.dit_config import DiTConfig
from worldgen.models.kv_cache import MODES, CacheSpec
from worldgen.models.vae_tiling import TILE_OVERLAP, grid_tile_areas, streamed_tiles, tile_shape
from worldgen.pipelines.camera import TEMPORAL_STRIDE, frames_for_poses
from worldgen.pipelines.scheduler import FlowUniPCScheduler
from worldgen.runtime.memory import (
    CUDA_CONTEXT_GIB,
    MIN_TILE_PIXELS,
    VAE_MARGIN,
    VAE_WEIGHTS_GIB,
    GiB,
    activation_gib,
    vae_peak_gib,
    vae_tile_pixels,
)

TIMESTEP_INDICES = V1_FAST.timestep_indices  # of the 1000-step schedule: 4 steps, as the model was distilled
NUM_TRAIN_TIMESTEPS = 1000

LOOP_MARGIN_GIB = 0.5  # allocator fragmentation and small buffers during the loop
# The streamed VAE beside the DiT and its KV cache, measured on the H100 at 464x832, float32 as the VAE
# runs (bench/bench_vae_stream.py, docs/benchmarks.md): the causal caches every tile keeps between
# chunks, per pixel of all tiles together (tiles overlap), and the transient peak of one push above
# them, per pixel of one tile. (The first plan guessed 2 GiB, then 6.3 GiB with small tiles: both ran
# out of memory, small tiles hold 2.3x the caches of whole frames and decode 2x slower.)
# The pushes' figures are scaled by what the float32 VAE's convolutions as three 2-D time taps (`vae._time_taps`:
# one more output tensor at a time) added to a push's peak on the H200: 2.6% decoding, 14% encoding ("Session 31").
DECODE_CACHE_BYTES_PER_PIXEL = 9_460  # whole frames: 3.40 GiB; two strips 3.92 GiB
DECODE_PUSH_BYTES_PER_PIXEL = 12_210  # whole frames: 4.19 GiB; two strips 2.47 GiB (before the taps' 2.6%)
ENCODE_CACHE_BYTES_PER_PIXEL = 5_620  # whole frames: 2.02 GiB; two strips 2.33 GiB
ENCODE_PUSH_BYTES_PER_PIXEL = 15_250  # whole frames: 4.75 GiB; two strips 2.77 GiB (before the taps' 14%)
# A chunk forward captured as a CUDA graph keeps its own memory pool while the rollout lives: 1.23-1.24
# GiB at 4,524 tokens on the H100 (docs/benchmarks.md, "Session 7: Fast"), above the activation estimate
GRAPH_POOL_BYTES_PER_TOKEN = 1.24 * GiB / 4524
# The blocks' CUDA graphs (worldgen.models.block_graphs) hold their buffers (the float32 residual, q/k/v,
# the attention's output, the camera's inputs) and one pool of a graph's temporaries while the rollout
# lives: 0.42 GiB (fp8) and 0.54 GiB (exact) added to the allocator's reserve at 2,100 tokens on the H100
# (docs/benchmarks.md, "Session 23: Fast"), counted here with a tenth more. The plan turns them on only
# where the job's KV cache and VAE cut stay what they are without them.
BLOCK_GRAPH_BYTES_PER_TOKEN = 0.6 * GiB / 2100


@dataclasses.dataclass(frozen=True)
class StreamVAE:
    """One way to cut frames into tiles for the streamed VAE, and what it costs beside the DiT."""

    tile_pixels: int | None  # the tiles' largest area (None: whole frames)
    tiles: int
    decode_cache_gib: float  # kept from the first decoded chunk to the end (parked: one tile's, in its turn)
    decode_push_gib: float  # transient, while a chunk decodes
    encode_cache_gib: float  # kept while conditioning frames are encoded
    encode_push_gib: float  # transient, while frames encode
    # the decoder's tiles' caches wait in host memory between their turns (`vae_tiling._Streaming.park`), the
    # VAE in bf16: the cut of a budget where no other cut fits beside the DiT and its KV cache
    parked: bool = False
    # parked: the caches of every tile but the one on the device, in pinned host memory (the process's RSS; the
    # device's one tile is `decode_cache_gib`, counted beside the forwards' activations as beside a push)
    host_gib: float = 0.0
    # counted at bf16's figures, the VAE in bf16 (parked, or every tile's caches on the device): the cut of a
    # budget where no float32 cut fits (`fast_fit.fit_loop`: for the same KV cache, unparked before parked;
    # an unparked bf16 cut beside the DiT is not yet measured on a GPU, where halving float32's figures once ran
    # out of memory, `cut`)
    bf16: bool = False

    @classmethod
    def cut(
        cls, height: int, width: int, tile_pixels: int | None, parked: bool = False, bf16: bool = False
    ) -> StreamVAE:
        """The float32 figures whatever the VAE's dtype: a plan that halved them for a bf16 VAE grew the
        24 GiB cache from 10 to 16 frames and chunk 1's cache grow ran out of memory on the H100 (2.6-3.0
        GiB reserved and unusable: fragmentation; docs/benchmarks.md, "Session 9: Fast"). What a bf16
        VAE saves is left as slack. A `bf16` cut (where no float32 cut fits) is counted at bf16, half the float32
        figures per pixel, as a `parked` one is
        (the decoder's caches are 2,365 elements a pixel whatever the dtype, 9,458 bytes in float32 and
        4,729 in bf16 as `StreamingDecoder.cache_bytes` counts them on the CPU; a push's tensors measured
        there 7,823 and 3,990 bytes a pixel: the push is counted at half the H100's float32 figure), for
        its largest tile: the device holds one tile's caches at a time (its encode figures stay float32:
        the encoder is not parked)."""
        one, every, count = streamed_tiles(height, width, tile_pixels)
        tile = None if count == 1 else tile_pixels
        bf16 = bf16 or parked
        half = 0.5 if bf16 else 1.0
        return cls(
            tile,
            count,
            half * DECODE_CACHE_BYTES_PER_PIXEL * (one if parked else every) / GiB,
            half * DECODE_PUSH_BYTES_PER_PIXEL * one / GiB,
            ENCODE_CACHE_BYTES_PER_PIXEL * every / GiB,
            ENCODE_PUSH_BYTES_PER_PIXEL * one / GiB,
            parked,
            half * DECODE_CACHE_BYTES_PER_PIXEL * (every - one) / GiB if parked else 0.0,
            bf16,
        )

    @property
    def bf16_saving_gib(self) -> float:
        """What a bf16 VAE leaves unused of the float32 figures counted for the loop (half the decoder's
        caches and push; its peak was 3 GiB lower, docs/benchmarks.md, "Session 9: Fast"). Kept out of
        the KV cache, whose growth chunk by chunk fragmented memory when it took this room; a chunk's
        camera modulation (`camera_blocks`), the same allocation every chunk, may use it. A bf16 cut
        is counted at bf16 already: nothing left."""
        return 0.0 if self.bf16 else (self.decode_cache_gib + self.decode_push_gib) / 2


def fewest_tiles_pixels(height: int, width: int, max_pixels: int) -> int | None:
    """The area of the tiles `worldgen.models.vae_tiling.tile_shape` cuts `height` x `width` frames into under
    `max_pixels` (the fewest, then the smallest): a tile as large as `max_pixels` cuts into as many but overlaps more.
    None: whole frames fit."""
    if height * width <= max_pixels:
        return None
    tile_h, tile_w = tile_shape(height, width, max_pixels, unit=8, overlap=TILE_OVERLAP)
    return tile_h * tile_w


def encode_tile_pixels(height: int, width: int, room_gib: float, vae_dtype: torch.dtype) -> int | None:
    """The tile area for encoding every conditioning frame before the loop in `room_gib` (`Pipeline.condition`: a tile
    and 16 frames at a time, never the whole video): whole frames where their peak in the VAE's dtype fits, else the
    fewest (then smallest) tiles the largest tile that fits allows. A bf16 VAE's figures are the float32 ones halved,
    not measured: whole frames keep the tiles' margin too."""
    pixels, element = height * width, torch.empty(0, dtype=vae_dtype).element_size()
    if vae_peak_gib(pixels, element) <= room_gib * (1.0 if element == 4 else VAE_MARGIN):
        return None
    return fewest_tiles_pixels(height, width, vae_tile_pixels(room_gib, element))


def stream_vae_cuts(height: int, width: int, parked: bool = False, bf16: bool = False) -> list[StreamVAE]:
    """Whole frames, then every grid of tiles `worldgen.models.vae_tiling.tile_shape` makes (tiles of at least
    MIN_TILE_PIXELS) in `grid_tile_areas`' order (the fewest tiles first); one entry per distinct cut (`parked`:
    each with its tiles' caches parked; `bf16`: counted at bf16, every tile's caches on the device)."""
    areas = [None, *(a for a in grid_tile_areas(height, width, TILE_OVERLAP) if a >= MIN_TILE_PIXELS)]
    cuts, seen = [], set()
    for area in areas:
        cut = StreamVAE.cut(height, width, area, parked, bf16)
        key = (cut.tiles, round(cut.decode_cache_gib, 4), round(cut.decode_push_gib, 4))
        if key not in seen:
            seen.add(key)
            cuts.append(cut)
    return cuts


@dataclasses.dataclass(frozen=True)
class FastOptions:
    """The Fast model's own knobs (the reference's generate_fast.py flags and their defaults)."""

    shift: float = FIELD_BY_NAME["shift"].default  # sigma shift of the 1000-step schedule
    chunk_frames: int = FAST_CHUNK_FRAMES  # latent frames per chunk (12 video frames; the door's rule too)
    timestep_indices: tuple[int, ...] = TIMESTEP_INDICES
    max_attention_tokens: int | None = None  # attend to at most this many cached tokens (None: all)
    sink_frames: int | None = None  # frames kept when a rolling cache evicts (None: 1 when rolling)
    kv_cache: str = FIELD_BY_NAME["kv_cache"].default  # one of KV_CACHE_MODES (worldgen.models.kv_cache.plan_cache)
    # LingBot-World 2.0's local_attn_size: the reference's cache holds this many latent frames and rolls,
    # keeping `sink_frames` (None: the whole video, or v1's window rule with max_attention_tokens)
    cache_frames: int | None = None

    def __post_init__(self) -> None:
        if self.shift <= 0:
            raise InputError(f"Fast shift must be > 0 (got {self.shift})")
        if self.chunk_frames < 1:
            raise InputError(f"chunk_frames must be >= 1 (got {self.chunk_frames})")
        if not self.timestep_indices or any(not 0 <= i < NUM_TRAIN_TIMESTEPS for i in self.timestep_indices):
            raise InputError(f"timestep_indices must lie in [0, {NUM_TRAIN_TIMESTEPS}) (got {self.timestep_indices})")
        if self.max_attention_tokens is not None and self.max_attention_tokens < 1:
            raise InputError(f"max_attention_tokens must be >= 1 (got {self.max_attention_tokens})")
        if self.sink_frames is not None and self.sink_frames < 0:
            raise InputError(f"sink_frames must be >= 0 (got {self.sink_frames})")
        if self.kv_cache not in MODES:
            raise InputError(f"kv_cache must be one of {', '.join(MODES)} (got {self.kv_cache!r})")
        if self.cache_frames is not None and self.cache_frames < self.chunk_frames + (self.sink_frames or 0):
            raise InputError(
                f"attention_frames {self.cache_frames}: a rolling cache holds its {self.sink_frames or 0} sink frame(s) "
                f"and at least one chunk of {self.chunk_frames} latent frames; give at least "
                f"{self.chunk_frames + (self.sink_frames or 0)}, or 0 for the whole video"
            )

    @classmethod
    def from_settings(
        cls, settings: GenerationSettings, frame_tokens: int, family: ModelFamily = V1_FAST
    ) -> FastOptions:
        """A job's settings (shift, kv_cache, attention_frames, sink_frames) for frames of `frame_tokens`, with
        the family's chunk and steps (`contracts.model_families`). attention_frames is v1 Fast's
        max_attention_size (a window read from the whole video), or v2's local_attn_size (a cache that
        rolls keeping sink_frames) where the family says so."""
        loop = {"chunk_frames": family.chunk_frames, "timestep_indices": family.timestep_indices or TIMESTEP_INDICES}
        if family.window_keeps_sink:
            return cls(
                shift=settings.shift,
                cache_frames=settings.attention_frames or None,
                sink_frames=settings.sink_frames,
                kv_cache=settings.kv_cache,
                **loop,
            )
        window = settings.attention_frames * frame_tokens or None
        return cls(
            shift=settings.shift,
            max_attention_tokens=window,
            sink_frames=settings.sink_frames,
            kv_cache=settings.kv_cache,
            **loop,
        )


@dataclasses.dataclass(frozen=True)
class FastSchedule:
    """The few timesteps a chunk is denoised at, and the sigmas the reference pairs with them."""

    timesteps: tuple[int, ...]  # integer timesteps the DiT is called with
    sigmas_x0: tuple[float, ...]  # flow -> x0 uses the FIRST schedule entry nearest to t (float64 math)
    sigmas_add_noise: tuple[float, ...]  # re-noising to t uses the SECOND entry when t occurs twice


def fast_schedule(shift: float, indices: tuple[int, ...] = TIMESTEP_INDICES) -> FastSchedule:
    scheduler = FlowUniPCScheduler(NUM_TRAIN_TIMESTEPS)
    scheduler.set_timesteps(NUM_TRAIN_TIMESTEPS, shift=shift)
    all_t, sigmas = scheduler.timesteps, scheduler.sigmas  # int64 [1000], float32 [1001]
    chosen = [int(all_t[i]) for i in indices]
    x0, noise = [], []
    for t in chosen:
        x0.append(float(sigmas[int(torch.argmin((all_t.double() - t).abs()))]))
        matches = (all_t == t).nonzero().flatten()
        noise.append(float(sigmas[int(matches[1 if len(matches) > 1 else 0])]))
    return FastSchedule(tuple(chosen), tuple(x0), tuple(noise))


@dataclasses.dataclass(frozen=True)
class FastFrames:
    frames: int  # video frames generated (whole chunks)
    pose_frames: int  # poses the camera path spans (the 4n+1 frames asked for, capped by the poses)
    latent_frames: int


def fast_frames(frame_num: int, num_poses: int | None, chunk_frames: int) -> FastFrames:
    """Frame counts as the reference rounds them, warning when the video gets shorter than asked."""
    if num_poses is not None:
        pose_frames = frames_for_poses(frame_num, num_poses)  # 4n+1, capped by the poses (warns)
    else:
        pose_frames = (frame_num - 1) // TEMPORAL_STRIDE * TEMPORAL_STRIDE + 1
    latent = (pose_frames - 1) // TEMPORAL_STRIDE + 1
    latent -= latent % chunk_frames
    if latent < chunk_frames:
        need = (chunk_frames - 1) * TEMPORAL_STRIDE + 1
        raise InputError(
            f"frame_num {frame_num}: the Fast model makes whole chunks of {chunk_frames} latent frames; "
            f"ask for at least {need} frames (and give as many poses)"
        )
    frames = (latent - 1) * TEMPORAL_STRIDE + 1
    if frames != pose_frames:
        warnings.warn(
            f"frame_num {pose_frames}: the Fast model makes whole chunks of {chunk_frames} latent frames; "
            f"generating {frames} frames",
            UserWarning,
            stacklevel=2,
        )
    return FastFrames(frames, pose_frames, latent)


def vae_dtype(model: str, compute: str, device: torch.device) -> torch.dtype:
    """The VAE's compute dtype: float32 as the reference, but bf16 for the Fast model under fp8 or int8 on CUDA.

    A Fast chunk decodes while the next is awaited, and in float32 its decode was 0.52 s of a 1.87 s
    chunk on the H100 (docs/benchmarks.md, "Session 8: Fast"); fp8 and int8 are approximate already,
    and a Fast pipeline's jobs run in the compute it was loaded with (`FastPipeline.set_compute`
    reloads the VAE when that changes), so no exact job decodes through a bf16 VAE. The base model's
    jobs may switch compute per job: its VAE stays float32."""
    if model == "fast" and compute in ("fp8", "int8") and device.type == "cuda":
        return torch.bfloat16
    return torch.float32


def resident_dit_gib(
    disk_gib: float, checkpoint_kind: str, compute: str, cfg: DiTConfig, dtype: torch.dtype, chunk_tokens: int
) -> float:
    """What the Fast DiT holds on the device through the chunk loop: its size on disk, less what its blocks' dense
    Linears free under fp8 or int8 (`worldgen.kernels.quantized_weights`: each holds its 8-bit weight in place of
    the bf16 one, made as the job is planned (`make_block_weights`), or by its first 8-bit GEMM (a chunk's tokens or
    the text's 512 rows) where the DiT was not loaded then; the Linears outside the blocks are left counted at
    bf16). The plan still counts the bf16 weights until chunk 0's first forward (`disk_gib`: the text, the encode
    before the loop and that forward), for that second case. An NF4 checkpoint keeps its NF4 bytes."""
    if compute not in ("fp8", "int8") or checkpoint_kind != "bf16" or chunk_tokens < MIN_ROWS:
        return disk_gib
    with torch.device("meta"):
        block = Block(cfg).to(dtype)
    return disk_gib - cfg.num_layers * saved_bytes(block, Linear) / GiB


def make_block_weights(model: torch.nn.Module, compute: str) -> int:
    """Make the 8-bit weights `resident_dit_gib` counts (every dense Linear of the DiT's blocks; their bf16 weights
    dropped) at once, as a job is planned, rather than one by one inside chunk 0's first forward: there each freed
    bf16 weight left a hole among the chunk's activations, and under `--vram-budget 8` the 1.3B's fp8 decode of
    chunk 1 ran out of memory with 1.8 GiB reserved and unused (docs/benchmarks.md, "Session 30"). The same
    weights, made by the same quantizer; the bf16 ones' memory is handed back to the driver (the caller's
    `free_device_memory`). -> the number made (none while compiling ahead: a dry call keeps nothing)."""
    kind = {"fp8": Fp8Weight, "int8": Int8Weight}[compute]
    todo = [m for m in model.blocks.modules() if isinstance(m, Linear) and not hasattr(m, "dequantized_weight")]
    todo = [m for m in todo if held(m) is None]
    if deferring():
        return 0
    for linear in todo:
        kind.of(linear)
    return len(todo)


# A block's Linears that every chunk forward runs (the camera's run once a chunk where the camera cache covers the
# block, the text's keys/values once a prompt): the ones an NF4 checkpoint's 8-bit GEMMs would otherwise make their
# weight for on every call (`NF4Linear.hold`)
EVERY_FORWARD = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.o", "ffn.0",
                 "ffn.2")  # fmt: skip
HELD_WEIGHTS_MARGIN_GIB = 0.5  # kept free beside the held weights: the plan's figures are estimates


def held_block_gib(cfg: DiTConfig) -> float:
    """GiB one block's `EVERY_FORWARD` Linears take as 8-bit weights (a byte a weight, a float32 scale a row)."""
    weights = 6 * cfg.dim * cfg.dim + 2 * cfg.dim * cfg.ffn_dim
    rows = 7 * cfg.dim + cfg.ffn_dim
    return (weights + 4 * rows) / GiB


def held_weight_blocks(room_gib: float | None, checkpoint_kind: str, compute: str, cfg: DiTConfig) -> int:
    """How many blocks (from the first) of an NF4 checkpoint hold their 8-bit weights beside the NF4 bytes under
    fp8 / int8: as many as `room_gib` (what the plan leaves; None: no limit) takes, less a margin. Another
    checkpoint or compute: none (a bf16 checkpoint's blocks hold theirs in place of the bf16 ones: `make_block_weights`)."""
    if checkpoint_kind != "nf4" or compute not in ("fp8", "int8"):
        return 0
    if room_gib is None:
        return cfg.num_layers
    return max(0, min(cfg.num_layers, int((room_gib - HELD_WEIGHTS_MARGIN_GIB) // held_block_gib(cfg))))


def hold_nf4_weights(model: torch.nn.Module, compute: str, blocks: int) -> int:
    """The first `blocks` blocks' NF4 `EVERY_FORWARD` Linears hold `compute`'s 8-bit weight, the others none (a held
    one beyond them is dropped); nothing while compiling ahead (a dry call keeps nothing). -> the bytes held."""
    if deferring():
        return 0
    model.held_blocks = blocks if compute in ("fp8", "int8") else 0  # what a second rank mirrors (`two_gpu`)
    total = 0
    for i, block in enumerate(model.blocks):
        for name in EVERY_FORWARD:
            linear = block.get_submodule(name)
            if hasattr(linear, "hold"):  # an NF4Linear
                total += linear.hold(compute if i < blocks else None)
    return total


def hold_planned_weights(pipe, room_gib: float | None, chunk_tokens: int, slot) -> None:
    """`pipe.held_blocks` (`held_weight_blocks`) from the room its plan leaves once the camera's kept blocks have
    theirs (`room_gib`: under a budget what the loop's fit leaves (`fast_fit.fit_loop`), else the card's spare;
    None: no plan), and its loaded NF4 DiT's held weights made to match (a later job's plan may hold fewer: the rest
    are dropped)."""
    cfg = pipe.dit_config
    if room_gib is not None:  # the camera's blocks kept through the decodes (not a slab freed for each) come out of it
        kept = 0 if pipe.camera_until_decode else pipe.camera_blocks
        room_gib -= kept * 1.1 * block_bytes(pipe.rank_rows(chunk_tokens), cfg.dim, 2) / GiB
    pipe.held_blocks = held_weight_blocks(room_gib, pipe.plan.checkpoint_kind, pipe.compute, cfg)
    if slot.loaded and pipe.plan.checkpoint_kind == "nf4":
        hold_nf4_weights(slot.get(), pipe.compute, pipe.held_blocks)


def vae_dtype_for_cut(pipe, cut: StreamVAE) -> None:
    """A bf16 cut (parked or not) runs the VAE in bf16 (counted so); a job with room again gets the pipeline's
    own back (`vae_dtype`: float32 for exact, the reference's). A VAE loaded in the other dtype is dropped (it
    reloads); the record says why."""
    own = pipe._own_vae_dtype
    if cut.bf16 and pipe.vae_dtype != torch.bfloat16 or not cut.bf16 and own is not None:
        pipe.vae.unload()
        pipe.vae_dtype, pipe._own_vae_dtype = (torch.bfloat16, pipe.vae_dtype) if cut.bf16 else (own, None)
    if cut.bf16 and pipe._own_vae_dtype is not None:
        pipe.plan.notes += (
            "the VAE decodes in bf16 (the reference: float32): no float32 decode fits this budget beside the "
            "DiT and its KV cache",
        )


def spare_without_budget(pipe, spec: CacheSpec, cut: StreamVAE, chunk_tokens: int) -> float | None:
    """No budget: on a GPU, what its memory leaves beside every resident model (umT5 too), the KV cache,
    the VAE's whole frames and one chunk's activations; None off CUDA (no plan)."""
    cfg, card = pipe.dit_config, pipe.plan.card_gib
    if pipe.device.type != "cuda" or card is None:
        return None
    kv = spec.planned_bytes(cfg.num_layers, pipe.cache_heads, cfg.head_dim, pipe.dtype) / GiB
    resident = pipe.dit_gib(chunk_tokens) + pipe.plan.text_encoder_gib + VAE_WEIGHTS_GIB + LOOP_MARGIN_GIB
    vae = cut.decode_cache_gib + max(activation_gib(chunk_tokens, cfg.dim), cut.decode_push_gib)
    return card - CUDA_CONTEXT_GIB - resident - kv - vae


def camera_blocks(spare_gib: float | None, chunk_tokens: int, dim: int, num_layers: int, dtype: torch.dtype) -> int:
    """How many DiT blocks keep a chunk's camera modulation across its forwards (`worldgen.models.camera_cache`:
    the same numbers, a chunk's 4 steps and refresh compute it once): every block without a limit
    (`spare_gib` None), else as many as the room the plan leaves after the KV cache holds, the camera
    tokens counted when some blocks are left out (they still need them), 10% for the allocator's rounding."""
    if spare_gib is None:
        return num_layers
    elem = torch.empty(0, dtype=dtype).element_size()
    per_block = 1.1 * block_bytes(chunk_tokens, dim, elem) / GiB
    if num_layers * per_block <= spare_gib:
        return num_layers
    tokens = 1.1 * chunk_tokens * dim * elem / GiB
    return max(0, int((spare_gib - tokens) // per_block))


# A streamed exact chunk forward's transient peak above `activation_gib`, per token: measured on the H100 at
# 4,524 tokens under 24 GiB (docs/benchmarks.md, "Session 21: Fast"), 16 blocks' camera kept until each
# decode raised the peak allocation 0.6 GiB above the decode's: the forwards' own room was 0.78 GiB, not
# the 1.70 GiB that the push less `activation_gib` gives (8 blocks left the peak where it was)
FORWARD_EXCESS_BYTES_PER_TOKEN = 0.92 * GiB / 4524


@dataclasses.dataclass(frozen=True)
class CameraChoice:
    """How a job's chunks keep their camera's modulation (`worldgen.models.camera_cache`)."""

    blocks: int  # blocks whose modulation a chunk's forwards share
    decode_after_loop: bool = False  # a batch job: the chunks decode after the loop, the decoder's room is the camera's
    until_decode: bool = False  # a streamed job: each chunk's modulation (one slab) is freed before its decode


def camera_choice(
    kept: int, streamed: bool, loop_room_gib: float, push_gib: float, chunk_tokens: int, dims: tuple, dtype
) -> CameraChoice:
    """Under a budget, with `kept` blocks kept through each decode (what the KV cache leaves): a batch job
    whose chunks nobody takes as they come decodes them after the loop where `loop_room_gib` (the loop
    without the decoder) keeps more blocks (docs/benchmarks.md, "Session 20: Fast"). A streamed job that
    keeps none keeps as many as the decoder's push leaves beside a forward, from each chunk's first step
    to its decode: its other 3 steps share them, the refresh after the decode computes its own ("Session 21")."""
    dim, num_layers = dims
    if not streamed:
        blocks = camera_blocks(loop_room_gib, chunk_tokens, dim, num_layers, dtype)
        return CameraChoice(blocks, decode_after_loop=True) if blocks > kept else CameraChoice(kept)
    if kept == 0:
        room = push_gib - activation_gib(chunk_tokens, dim) - FORWARD_EXCESS_BYTES_PER_TOKEN * chunk_tokens / GiB
        blocks = camera_blocks(room, chunk_tokens, dim, num_layers, dtype)
        return CameraChoice(blocks, until_decode=blocks > 0)
    return CameraChoice(kept)


def full_cache_spec(latent_frames: int, frame_tokens: int, options: FastOptions) -> CacheSpec:
    """The reference's cache in the compute dtype: the whole video, or v2's `cache_frames` rolling with its sink."""
    if options.cache_frames is not None and options.cache_frames < latent_frames:
        return CacheSpec(
            options.cache_frames * frame_tokens, frame_tokens, rolling=True, sink_frames=options.sink_frames or 0
        )
    return CacheSpec(
        capacity_tokens=latent_frames * frame_tokens,
        frame_tokens=frame_tokens,
        rolling=options.max_attention_tokens is not None,
        sink_frames=options.sink_frames or 0,
        max_attention_tokens=options.max_attention_tokens,
    )


def describe_fast_plan(pipe) -> str:
    """A Fast pipeline's plan: the base plan's lines with the denoise line for the chunk loop and the KV cache added."""
    cut = getattr(pipe, "vae_cut", None)

    def tiles(pixels: int | None, decode: bool = False) -> str:
        parked = ""
        if decode and cut is not None and cut.parked:
            parked = f", in bf16, caches parked in host memory but the running tile's ({cut.host_gib:.2f} GiB)"
        elif decode and cut is not None and cut.bf16:
            parked = f", in bf16, every tile's caches on the device ({cut.decode_cache_gib:.1f} GiB), none parked"
        if pixels is None:
            return "whole frames" + parked
        count = f"{cut.tiles} " if cut is not None and cut.tile_pixels == pixels else ""
        return f"{count}spatial tiles of <= {pixels:,} pixels, blended at the seams" + parked

    lines = []
    for line in pipe.plan.describe().splitlines():
        if line.startswith("  denoise"):
            ffn = next(part for part in line.split("; ") if part.startswith("feed-forward"))
            steps = f"{pipe.steps} guided steps (two passes each)" if getattr(pipe, "kv_caches", 1) == 2 else "4 steps"
            line = f"  denoise Fast DiT resident, chunk by chunk ({steps}, then 1 cache refresh before the next chunk); {ffn}"
            line += f"; camera modulation kept a chunk in {pipe.camera_blocks} of {pipe.dit_config.num_layers} blocks"
            line += " until its decode (one slab)" if pipe.camera_until_decode else ""
            if getattr(pipe, "held_blocks", 0):
                line += f"; {pipe.compute} weights held beside the NF4 ones in {pipe.held_blocks} blocks"
            line += "; blocks replayed as CUDA graphs between self-attentions" if pipe.block_graph_room else ""
        elif line.startswith("  encode"):
            when = "every frame before the loop"
            if getattr(pipe, "stream_encode", False):
                rest = "as chunk 1 starts" if pipe.decode_after_loop else "after its preview"
                when = f"the first chunk's frames first, the rest {rest}"
            line = line.split(",")[0] + f", {tiles(pipe.encode_tile_pixels)}; {when}"
        elif line.startswith("  decode"):
            when = (
                "chunk by chunk after the loop (nobody takes them as they come: the room keeps the camera's)"
                if pipe.decode_after_loop
                else "chunk by chunk, each as soon as it is made"
            )
            line = line.split(",")[0] + f", {tiles(pipe.decode_tile_pixels, decode=True)}; {when}"
        lines.append(line)
        if line.startswith("  denoise") and pipe.cache_spec is not None:
            lines += [f"  kv cache {pipe.cache_spec.describe()}", f"           ({pipe.cache_reason})"]
    return "\n".join(lines)
