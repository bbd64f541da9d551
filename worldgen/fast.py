"""LingBot-World-Fast: the causal DiT run chunk by chunk with a KV cache, 4 steps a chunk, no guidance.

The phases are the base pipeline's (`worldgen.pipeline`: text, encode, decode are shared); only the
denoise phase differs (the reference's `WanI2VFast.generate`):
  for each chunk of `chunk_frames` latent frames (tokens [c*chunk*frame_tokens, ...) of the video):
    for each of the 4 timesteps t_s (indices [0, 179, 358, 679] of the 1000-step shifted schedule):
      flow = DiT(x_t, t_s, chunk condition, chunk camera, KV cache)
      x0   = x_t - sigma(t_s) * flow                (float64, cast back to float32)
      x_t  = (1 - sigma') * x0 + sigma' * noise      (sigma' of t_{s+1}; fresh noise from the seed)
    the chunk is the last x0; one more forward of it at t = 0 refreshes the cache with clean K/V.
Frame counts: 4n+1 video frames as the base model, then the latent frames are rounded DOWN to whole
chunks (a warning says so); the camera path spans the poses of the 4n+1 frames asked for.
`rollout_chunks` yields each finished chunk so it can be decoded and shown while the next is made.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from contracts.settings import FIELD_BY_NAME, GenerationSettings
from worldgen.camera import (
    TEMPORAL_STRIDE,
    frames_for_poses,
    plucker_embedding,
    relative_poses,
    resample_poses,
    scale_intrinsics,
    validate_action,
)
from worldgen.cuda_memory import free_device_memory
from worldgen.dit import DiTConfig
from worldgen.errors import InputError
from worldgen.kv_cache import MODES, CacheSpec, KVCache, plan_cache
from worldgen.memory import (
    MIN_TILE_PIXELS,
    REFERENCE_PIXELS,
    VAE_PEAK_GIB,
    VAE_WEIGHTS_GIB,
    GiB,
    activation_gib,
    vae_peak_gib,
    vae_tile_pixels,
)
from worldgen.pipeline import Pipeline, Progress, _no_progress, condition_mask, prepare_image
from worldgen.residency import ModelSlot
from worldgen.scheduler import FlowUniPCScheduler
from worldgen.vae import StreamingDecoder

TIMESTEP_INDICES = (0, 179, 358, 679)  # of the 1000-step schedule: 4 steps, as the model was distilled
NUM_TRAIN_TIMESTEPS = 1000

ChunkCallback = Callable[[int, int, torch.Tensor], None]  # (chunk index, chunks, its frames [3, f, H, W])
LOOP_MARGIN_GIB = 0.5  # allocator fragmentation and small buffers during the loop
# Decoding chunk by chunk beside the DiT and its cache. The decoder's causal caches (float32, every
# tile's kept for the next chunk) are 3.4 GiB for a 464x832 frame (measured: 9,458 bytes per output
# pixel) and do not shrink with tiles; tiles overlap, so they grow by about STREAM_TILE_OVERLAP. The
# rest of the base plan's measured decode peak (VAE_PEAK_GIB) is activations, linear in tile area:
# tiles are sized so those stay under STREAM_TILE_ACT_GIB. (An H100 run with a 2 GiB allowance for
# all of it ran out of memory in the first chunk's decode: the caches had not been counted.)
VAE_CACHE_BYTES_PER_PIXEL = 9_458
STREAM_TILE_OVERLAP = 1.4
STREAM_TILE_ACT_GIB = 1.0


@dataclasses.dataclass(frozen=True)
class FastOptions:
    """The Fast model's own knobs (the reference's generate_fast.py flags and their defaults)."""

    shift: float = FIELD_BY_NAME["shift"].default  # sigma shift of the 1000-step schedule
    chunk_frames: int = 3  # latent frames per chunk (12 video frames)
    timestep_indices: tuple[int, ...] = TIMESTEP_INDICES
    max_attention_tokens: int | None = None  # attend to at most this many cached tokens (None: all)
    sink_frames: int | None = None  # frames kept when a rolling cache evicts (None: 1 when rolling)
    kv_cache: str = FIELD_BY_NAME["kv_cache"].default  # one of KV_CACHE_MODES (worldgen.kv_cache.plan_cache)

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

    @classmethod
    def from_settings(cls, settings: GenerationSettings, frame_tokens: int) -> FastOptions:
        """A job's settings (shift, kv_cache, attention_frames, sink_frames) for frames of `frame_tokens`."""
        window = settings.attention_frames * frame_tokens or None
        return cls(
            shift=settings.shift,
            max_attention_tokens=window,
            sink_frames=settings.sink_frames,
            kv_cache=settings.kv_cache,
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


def fast_camera(poses: np.ndarray, intrinsics: np.ndarray, frames: FastFrames, height: int, width: int) -> torch.Tensor:
    """Plücker [1, 384, lat_f, height/8, width/8]: the poses of `pose_frames` resampled to lat_f."""
    c2w = resample_poses(poses[: frames.pose_frames], frames.latent_frames)
    K = scale_intrinsics(torch.from_numpy(intrinsics[:1]), height, width)[0]
    return plucker_embedding(relative_poses(c2w), K, height, width)


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """The scheduler's add_noise: (1 - sigma) x0 + sigma noise, in the latent's float32."""
    s = torch.tensor(sigma, dtype=torch.float32)
    return (1 - s) * x0 + s * noise


class FastPipeline(Pipeline):
    """The base pipeline's text/encode phases, the causal chunk loop, and a chunk-by-chunk decode.

    Each finished chunk is decoded right away (the VAE decoder's causal caches carried over, see
    `worldgen.vae.StreamingDecoder`) whether or not anyone watches, so a streamed video and a
    non-streamed one are the same video.
    """

    def __init__(self, *, dit: ModelSlot, dit_config: DiTConfig, dtype: torch.dtype | None = None, **kwargs):
        super().__init__(experts={"fast": dit}, **kwargs)
        self.dit = dit
        self.dit_config = dit_config
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.cache_spec: CacheSpec | None = None  # this job's cache, chosen by `plan_job`
        self.cache_reason = ""
        self.timings: dict[str, float] = {}  # seconds per part of the last `generate` (see _Clock)
        self.encode_tile_pixels: int | None = None  # VAE tiles before the loop / during it (None: whole frames)
        self.decode_tile_pixels: int | None = None

    # -- memory ------------------------------------------------------------------------------------
    def plan_job(self, latent_frames: int, lat_h: int, lat_w: int, options: FastOptions) -> CacheSpec:
        """Fit the memory plan to this job and choose its KV cache (see `worldgen.kv_cache.plan_cache`)."""
        frame_tokens = (lat_h // 2) * (lat_w // 2)
        pixels = lat_h * lat_w * 64
        chunk_tokens = options.chunk_frames * frame_tokens
        self._frame_pixels = pixels
        self.residency.fit(chunk_tokens, pixels)
        # the VAE decodes each chunk while the DiT is resident: the room below is made for it
        self.plan.experts_beside_vae = True
        cfg = self.dit_config
        room = None
        self.encode_tile_pixels = self.decode_tile_pixels = self.plan.vae_tile_pixels
        if self.plan.usable_gib is not None:
            # what the loop needs beside the weights and the cache: one chunk's activations, the text
            # keys/values, and the VAE decoding each finished chunk (stream_decode_plan)
            cross = 2 * cfg.num_layers * cfg.text_len * cfg.dim * torch.empty(0, dtype=self.dtype).element_size() / GiB
            transient = activation_gib(chunk_tokens) + cross + LOOP_MARGIN_GIB
            self.decode_tile_pixels, self.vae_room_gib = stream_decode_plan(pixels)
            room = (self.plan.usable_gib - self.plan.expert_gib - transient - self.vae_room_gib) * GiB
        try:
            spec, why = plan_cache(
                latent_frames,
                frame_tokens,
                options.chunk_frames,
                room_bytes=room,
                num_layers=cfg.num_layers,
                num_heads=cfg.num_heads,
                head_dim=cfg.head_dim,
                compute_dtype=self.dtype,
                mode=options.kv_cache,
                sink_frames=options.sink_frames,
                max_attention_tokens=options.max_attention_tokens,
            )
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if room is not None:
            # encode runs before the cache exists (beside the DiT at most); decode beside both
            encode_room = self.plan.usable_gib - self.plan.expert_gib - LOOP_MARGIN_GIB
            self.encode_tile_pixels = None if vae_peak_gib(pixels) <= encode_room else vae_tile_pixels(encode_room)
        self.plan.vae_tile_pixels = self.decode_tile_pixels
        self.cache_spec, self.cache_reason = spec, why
        if self.on_plan is not None:
            self.on_plan(self.describe_plan())
        return spec

    def describe_plan(self) -> str:
        """The base plan's lines with the denoise line for the chunk loop and the KV cache added."""
        lines = []
        for line in self.plan.describe().splitlines():
            if line.startswith("  denoise"):
                ffn = line.rsplit("; ", 1)[-1]
                line = f"  denoise Fast DiT resident, chunk by chunk (4 steps + 1 cache refresh each); {ffn}"
            elif line.startswith("  encode"):
                tiles = self.encode_tile_pixels
                line = line.split(",")[0] + (
                    ", whole frames" if tiles is None else f", spatial tiles of <= {tiles:,} pixels"
                )
            elif line.startswith("  decode"):
                line = line.replace(" (experts freed first)", "") + "; chunk by chunk, each as soon as it is made"
            lines.append(line)
            if line.startswith("  denoise") and self.cache_spec is not None:
                lines += [f"  kv cache {self.cache_spec.describe()}", f"           ({self.cache_reason})"]
        return "\n".join(lines)

    def new_cache(self, latent_frames: int, frame_tokens: int, options: FastOptions, dtype: torch.dtype) -> KVCache:
        cfg = self.dit_config
        spec = self.cache_spec
        if spec is None or spec.frame_tokens != frame_tokens:  # no plan for this size: the reference's cache
            spec = full_cache_spec(latent_frames, frame_tokens, options)
        return KVCache(spec, cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype, self.device)

    # -- denoise -----------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout_chunks(
        self,
        noise: torch.Tensor,
        y: torch.Tensor,
        context: torch.Tensor,
        plucker: torch.Tensor | None,
        options: FastOptions,
        generator: torch.Generator | None = None,
        renoise_draws: torch.Tensor | None = None,
        progress: Progress = _no_progress,
    ) -> Iterator[torch.Tensor]:
        """Yield each chunk's final latent [16, chunk_frames, lat_h, lat_w] (float32, on the device) in order.

        Re-noising draws come from `generator` (CPU, so the result does not depend on the device),
        or from `renoise_draws` [chunks, steps-1, 16, chunk_frames, lat_h, lat_w] when given.
        """
        schedule = fast_schedule(options.shift, options.timestep_indices)
        _, lat_f, lat_h, lat_w = noise.shape
        n = options.chunk_frames
        if lat_f % n:
            raise InputError(f"latent frames {lat_f} are not whole chunks of {n}")
        chunks = lat_f // n
        frame_tokens = (lat_h // 2) * (lat_w // 2)
        model = self.residency.use("fast")
        cache = self.new_cache(lat_f, frame_tokens, options, model.compute_dtype)
        device, steps = self.device, len(schedule.timesteps)
        context = [context.to(device)]
        total = chunks * (steps + 1)
        progress("denoise", 0, total)
        try:
            for c in range(chunks):
                frames = slice(c * n, (c + 1) * n)
                y_c = y[:, frames].to(device)[None]
                cam_c = None if plucker is None else plucker[:, :, frames].to(device)
                start = c * n * frame_tokens
                x_t = noise[:, frames].to(device, torch.float32)
                for s, t in enumerate(schedule.timesteps):
                    timestep = torch.tensor([t], dtype=torch.int64, device=device)
                    flow = model(x_t[None], timestep, context, y_c, cam_c, cache=cache, current_start=start)[0]
                    x0 = (x_t.double() - schedule.sigmas_x0[s] * flow.double()).to(torch.float32)
                    del flow
                    if s + 1 < steps:
                        if renoise_draws is not None:
                            draw = renoise_draws[c, s].to(device, torch.float32)
                        else:
                            draw = torch.randn(x0.shape, generator=generator, dtype=torch.float32).to(device)
                        x_t = renoise(x0, draw, schedule.sigmas_add_noise[s + 1])
                    progress("denoise", c * (steps + 1) + s + 1, total)
                # refresh: the cache gets the clean chunk's keys/values (output discarded)
                zero = torch.zeros(1, dtype=torch.int64, device=device)
                model(x0[None], zero, context, y_c, cam_c, cache=cache, current_start=start)
                progress("denoise", (c + 1) * (steps + 1), total)
                yield x0
        finally:  # also when the consumer stops early (a cancelled job)
            cache.close()
            free_device_memory(device)
        model = None
        self.residency.phase_done("denoise")

    # -- all of it ---------------------------------------------------------------------------------
    def generate(
        self,
        image: Image.Image | np.ndarray | str | Path,
        prompt: str | None,
        poses: np.ndarray | None = None,
        intrinsics: np.ndarray | None = None,
        settings: GenerationSettings | None = None,
        progress: Progress | None = None,
        noise: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        negative_context: torch.Tensor | None = None,
        options: FastOptions | None = None,
        on_chunk: ChunkCallback | None = None,
    ) -> torch.Tensor:
        """-> video [3, F, H, W] float32 in [-1, 1] on the CPU (see `Pipeline.generate`).

        `settings` gives size, frame_num, seed, shift and the Fast knobs (steps, guidance, boundary and
        the negative prompt do not apply); `options`, when given, replaces those knobs. `on_chunk(i, n, frames)` gets every chunk's decoded
        frames [3, f, H, W] as soon as they exist (the first chunk has 9 frames, the others 12).
        """
        settings = settings or GenerationSettings(model="fast")
        progress = progress or _no_progress
        clock = _Clock(self.device)
        if (poses is None) != (intrinsics is None):
            raise InputError("camera control needs both poses.npy and intrinsics.npy (or neither)")
        if poses is not None:
            poses, intrinsics = validate_action(poses, intrinsics)
        chunk_frames = (options or FastOptions()).chunk_frames
        frames = fast_frames(settings.frame_num, None if poses is None else len(poses), chunk_frames)

        with self.meter.phase("text"):
            progress("text", 0, 1)
            if context is None:
                if not prompt or not prompt.strip():
                    raise InputError("prompt is empty: describe the scene (prompt.txt or --prompt)")
                (context,) = self.encode_text([prompt])
            progress("text", 1, 1)
        clock.lap("text")

        image_resized = prepare_image(image, settings.max_area)
        _, _, h, w = image_resized.shape
        lat_h, lat_w = h // 8, w // 8
        options = options or FastOptions.from_settings(settings, (lat_h // 2) * (lat_w // 2))
        self.plan_job(frames.latent_frames, lat_h, lat_w, options)
        plucker = None if poses is None else fast_camera(poses, intrinsics, frames, h, w)

        with self.meter.phase("encode"):
            progress("encode", 0, 1)
            self.plan.vae_tile_pixels = self.encode_tile_pixels
            y = self.condition(image_resized, frames.frames)
            self.plan.vae_tile_pixels = self.decode_tile_pixels
            progress("encode", 1, 1)
        clock.lap("encode")

        generator = torch.Generator("cpu").manual_seed(settings.seed)
        shape = (16, frames.latent_frames, lat_h, lat_w)
        if noise is None:
            noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        elif tuple(noise.shape) != shape:
            raise InputError(f"noise has shape {tuple(noise.shape)}, expected {shape}")

        pieces: list[torch.Tensor] = []
        latents: list[torch.Tensor] = []
        num_chunks = frames.latent_frames // options.chunk_frames

        def emit(piece: torch.Tensor) -> None:
            pieces.append(piece)
            if len(pieces) == 1:
                clock.mark("first_chunk")
            if on_chunk is not None:
                on_chunk(len(pieces) - 1, num_chunks, piece)

        with self.meter.phase("loop"):  # the DiT chunk loop, each chunk decoded as soon as it is done
            decoder = None
            streaming = True
            for latent in self.rollout_chunks(noise, y, context, plucker, options, generator, progress=progress):
                clock.lap("dit")
                latents.append(latent.cpu())
                if streaming:
                    try:
                        decoder = decoder or StreamingDecoder(self.residency.use("vae"), self.plan.vae_tile_pixels)
                        piece = decoder.push(latent[None].to(next(decoder.vae.parameters()).device))[0].cpu()
                    except torch.OutOfMemoryError:
                        # the plan's estimate was short: finish the loop, then decode every chunk again
                        # with the same tiles once the KV cache is gone (so the same video)
                        streaming, decoder = False, None
                        free_device_memory(self.device)
                        self.plan.notes += (
                            "decoding beside the KV cache ran out of memory: chunks decoded after the loop",
                        )
                    else:
                        emit(piece)
                clock.lap("decode")
            if not streaming:
                decoder, done = StreamingDecoder(self.residency.use("vae"), self.plan.vae_tile_pixels), len(pieces)
                device = next(decoder.vae.parameters()).device
                for i, latent in enumerate(latents):
                    piece = decoder.push(latent[None].to(device))[0].cpu()
                    if i < done:
                        pieces[i] = piece
                    else:
                        emit(piece)
                clock.lap("decode")
            del decoder
            self.residency.phase_done("decode")
        clock.mark("total")
        self.timings = clock.seconds
        return torch.cat(pieces, dim=1)


def stream_decode_plan(pixels: int) -> tuple[int | None, float]:
    """(tile pixels or None for whole frames, GiB) for decoding chunks of `pixels`-pixel frames during
    the loop: weights + every tile's causal caches + one tile's activations (see the constants)."""
    caches = VAE_CACHE_BYTES_PER_PIXEL * pixels / GiB
    act_per_pixel = (
        VAE_PEAK_GIB - VAE_WEIGHTS_GIB - VAE_CACHE_BYTES_PER_PIXEL * REFERENCE_PIXELS / GiB
    ) / REFERENCE_PIXELS
    whole = VAE_WEIGHTS_GIB + caches + act_per_pixel * pixels
    if act_per_pixel * pixels <= STREAM_TILE_ACT_GIB:
        return None, whole
    tile = max(MIN_TILE_PIXELS, int(STREAM_TILE_ACT_GIB / act_per_pixel))
    return tile, VAE_WEIGHTS_GIB + caches * STREAM_TILE_OVERLAP + act_per_pixel * tile


class _Clock:
    """Seconds per part of one rollout (`timings`): text, encode, dit (the chunk loop's forwards),
    decode (the chunk decodes), first_chunk (start to the first decoded chunk), total. The device is
    synchronised at each lap so GPU work is counted where it happens (a few syncs per chunk)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start = self.last = self._now()
        self.seconds: dict[str, float] = {}

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def mark(self, name: str) -> None:
        self.seconds[name] = self._now() - self.start


def full_cache_spec(latent_frames: int, frame_tokens: int, options: FastOptions) -> CacheSpec:
    """The reference's cache: the whole video, in the compute dtype, never rolling."""
    return CacheSpec(
        capacity_tokens=latent_frames * frame_tokens,
        frame_tokens=frame_tokens,
        rolling=options.max_attention_tokens is not None,
        sink_frames=options.sink_frames or 0,
        max_attention_tokens=options.max_attention_tokens,
    )


def y_from_latent(image_latent: torch.Tensor, frames: int) -> torch.Tensor:
    """[16, lat_f, lat_h, lat_w] VAE latent of the conditioning video -> y [20, ...] (mask first)."""
    _, _, lat_h, lat_w = image_latent.shape
    return torch.cat([condition_mask(frames, lat_h, lat_w), image_latent])
