"""LingBot-World-Fast: the causal DiT run chunk by chunk with a KV cache, 4 steps a chunk, no guidance.

The phases are the base pipeline's (`worldgen.pipelines.base`: text, encode, decode are shared); only the
denoise phase differs (the reference's `WanI2VFast.generate`):
  for each chunk of `chunk_frames` latent frames (tokens [c*chunk*frame_tokens, ...) of the video):
    for each of the 4 timesteps t_s (indices [0, 179, 358, 679] of the 1000-step shifted schedule):
      flow = DiT(x_t, t_s, chunk condition, chunk camera, KV cache)
      x0   = x_t - sigma(t_s) * flow                (float64, cast back to float32)
      x_t  = (1 - sigma') * x0 + sigma' * noise      (sigma' of t_{s+1}; fresh noise from the seed)
    the chunk is the last x0 (handed out here); a forward of it at t = 0 refreshes the cache (clean K/V; not the last).
Frame counts: 4n+1 video frames as the base model, then the latent frames are rounded DOWN to whole
chunks (a warning says so); the camera path spans the poses of the 4n+1 frames asked for.
`rollout_chunks` yields each finished chunk so it can be decoded and shown while the next is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from contracts.model_families import V1_FAST, ModelFamily
from contracts.settings import GenerationSettings
from worldgen.errors import InputError
from worldgen.models.block_graphs import BlockGraphs
from worldgen.models.camera_cache import CameraCache
from worldgen.models.chunk_graph import ChunkGraphs, enabled_by_environment
from worldgen.models.dit_config import DiTConfig
from worldgen.models.kv_cache import CacheSpec, KVCache, plan_cache
from worldgen.pipelines import decode_overlap
from worldgen.pipelines.base import Pipeline, Progress, _no_progress, condition_mask, prepare_image
from worldgen.pipelines.camera import validate_camera
from worldgen.pipelines.chunk_decodes import ChunkDecodes
from worldgen.pipelines.decoded_video import Keep, Sink
from worldgen.pipelines.fast_conditioning import ChunkConditioning, FastCamera
from worldgen.pipelines.fast_fit import fit_loop, overlap_fit
from worldgen.pipelines.fast_plan import (
    BLOCK_GRAPH_BYTES_PER_TOKEN,
    LOOP_MARGIN_GIB,
    CameraChoice,
    FastOptions,
    StreamVAE,
    camera_blocks,
    camera_choice,
    describe_fast_plan,
    encode_tile_pixels,
    fast_frames,
    fast_schedule,
    full_cache_spec,
    hold_planned_weights,
    make_block_weights,
    resident_dit_gib,
    spare_without_budget,
    vae_dtype,
    vae_dtype_for_cut,
)
from worldgen.runtime.cuda_memory import free_device_memory, to_device
from worldgen.runtime.memory import (
    VAE_WEIGHTS_GIB,
    GiB,
    activation_gib,
)
from worldgen.runtime.metering import LapClock
from worldgen.runtime.residency import ModelSlot

ChunkCallback = Callable[[int, int, torch.Tensor], None]  # (chunk index, chunks, its frames [3, f, H, W])


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """The scheduler's add_noise: (1 - sigma) x0 + sigma noise, in the latent's float32."""
    s = torch.tensor(sigma, dtype=torch.float32)
    return (1 - s) * x0 + s * noise


class FastPipeline(Pipeline):
    """The base pipeline's text/encode phases, the causal chunk loop, and a chunk-by-chunk decode.

    Each finished chunk is decoded right away (the VAE decoder's causal caches carried over, see
    `worldgen.models.vae_tiling.StreamingDecoder`), or, in a batch job under a budget, after the loop with
    the same tiles (`decode_after_loop`): a streamed video and a non-streamed one are the same video.
    """

    def __init__(self, *, dit: ModelSlot, dit_config: DiTConfig, dtype=None, family: ModelFamily = V1_FAST, **kwargs):
        super().__init__(experts={"fast": dit}, **kwargs)
        self.family = family  # its chunk, steps and window rule (contracts.model_families)
        self.dit = dit
        self.dit_config = dit_config
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.cache_spec: CacheSpec | None = None  # this job's cache, chosen by `plan_job`
        self.cache_reason = ""
        self.timings: dict[str, float] = {}  # seconds per part of the last `generate` (see `LapClock`)
        self.encode_tile_pixels: int | None = None  # VAE tiles before the loop / during it (None: whole frames)
        self.decode_tile_pixels: int | None = None
        self._chunk_graphs = enabled_by_environment()  # asked for (`use_chunk_graphs`)
        self.graph_room = True  # whether the plan has room for a captured forward's pool / a decode beside it
        # chunks 1.. decode beside the next chunk's forwards where the plan has room (`decode_overlap`)
        self.overlap_decode = decode_overlap.enabled_by_environment()
        self.decode_overlapped = False  # whether the last rollout's decodes ran on the second stream
        self.use_block_graphs = True  # blocks between attentions as CUDA graphs where the plan has room
        self.block_graph_room = False
        self.block_graphs: BlockGraphs | None = None  # the last rollout's (its `decisions`, `captures`)
        self.chunk_graphs: ChunkGraphs | None = None  # the last rollout's (its `decisions`, `captures`)
        self.chunk_timings: list[dict[str, float]] = []  # seconds per chunk of the last `generate`
        # `plan_job` decides: the blocks whose camera modulation a chunk's forwards share, whether a batch job's chunks
        # decode after the loop, whether a chunk's camera modulation is freed before its decode, and how many blocks of
        # an NF4 DiT hold their 8-bit weights (`fast_plan.hold_planned_weights`)
        self.camera_blocks, self.decode_after_loop, self.camera_until_decode, self.held_blocks = 0, False, False, 0
        self._own_vae_dtype: torch.dtype | None = None  # the VAE's dtype before a parked cut made it bf16
        self.kv_caches = 1  # KV caches a job holds at once, each planned in its share of the room (guided: 2)
        self.scale_out = None  # a second rank: each forward split over two (`worldgen.pipelines.two_gpu`)
        self.ranks = 1  # devices each forward is split over (`two_gpu.use_two_devices` sets 2): the plan's share
        self.loop_left_gib: float | None = None  # under a budget, what the loop's fit leaves unused (`fast_fit`)
        self.overlap_trial = False  # `fast_fit.overlap_fit` is counting a decode beside a forward's activations

    def set_compute(self, compute: str) -> None:
        """Switch the DiT's compute between jobs (the bench compares both in one process); the VAE is
        dropped when its dtype changes with it (`worldgen.pipelines.fast_plan.vae_dtype`) and reloads."""
        self.residency.use("fast").set_compute(compute)
        self.compute = compute
        dtype = vae_dtype("fast", compute, self.device)
        self._own_vae_dtype = None
        if dtype != self.vae_dtype:
            self.vae.unload()
            self.vae_dtype = dtype

    @property
    def use_chunk_graphs(self) -> bool:
        """Whole forwards as CUDA graphs: opt-in (LINGBOT_ISAAC_CHUNK_GRAPHS=1, or set; 24 GiB fp8: 1.66 -> 1.52 s a chunk,
        a 7-frame KV window not 10, "Session 9: Fast"); never beside a rank 1 (`two_gpu`): a replay skips its call."""
        return self._chunk_graphs and self.scale_out is None

    @use_chunk_graphs.setter
    def use_chunk_graphs(self, on: bool) -> None:
        self._chunk_graphs = on

    # -- memory ------------------------------------------------------------------------------------
    @property
    def cache_heads(self) -> int:
        """The heads whose keys/values this device's KV cache holds (what the plan counts): all of them, or
        one rank's share when each forward is split over two GPUs (`worldgen.pipelines.two_gpu`)."""
        return self.dit_config.num_heads // self.ranks

    def plan_job(
        self, latent_frames: int, lat_h: int, lat_w: int, options: FastOptions, streamed: bool = True
    ) -> CacheSpec:
        """Fit the memory plan to this job: the KV cache (`worldgen.models.kv_cache.plan_cache`), how the VAE
        cuts frames while it streams beside the DiT, whether conditioning frames are encoded chunk by
        chunk (the first chunk's preview comes sooner) or all before the loop, and, for a job whose
        chunks nobody takes as they come (not `streamed`), whether they decode after the loop."""
        frame_tokens = (lat_h // 2) * (lat_w // 2)
        height, width = lat_h * 8, lat_w * 8
        chunk_tokens = options.chunk_frames * frame_tokens
        self._frame_pixels = height * width
        self.residency.fit(chunk_tokens, height * width)
        # notes are per job: the load's own notes, then what this job adds (a decode fallback)
        self._load_notes = getattr(self, "_load_notes", self.plan.notes)
        self.plan.notes = self._load_notes
        dit, slot = self.dit_gib(chunk_tokens), self.residency.slot("fast")
        if dit < self.plan.expert_gib and slot.loaded and make_block_weights(slot.get(), self.compute):
            free_device_memory(self.device)  # the dropped bf16 weights' memory back, before the job's tensors
        if dit < self.plan.expert_gib:
            self.plan.notes += (f"the DiT's blocks hold {self.compute} weights in place of bf16 ones: {dit:.1f} GiB",)
        self.plan.experts_beside_vae = True  # the VAE decodes each chunk while the DiT is resident
        cfg = self.dit_config
        dims = {"num_layers": cfg.num_layers, "num_heads": self.cache_heads, "head_dim": cfg.head_dim}

        def cache_for(room_gib: float | None) -> tuple[CacheSpec, str]:
            return plan_cache(
                latent_frames,
                frame_tokens,
                options.chunk_frames,
                room_bytes=None if room_gib is None else room_gib * GiB / self.kv_caches,
                compute_dtype=self.dtype,
                mode=options.kv_cache,
                sink_frames=options.sink_frames,
                max_attention_tokens=options.max_attention_tokens,
                cache_frames=options.cache_frames,
                **dims,
            )

        usable = self.plan.usable_gib
        self.block_graph_room = usable is None and self._wants_block_graphs()
        try:
            if usable is None:  # no budget: whole frames, the reference's cache, conditioning chunk by chunk
                (spec, why), cut, stream_encode = cache_for(None), StreamVAE.cut(height, width, None), True
                spare = spare_without_budget(self, spec, cut, chunk_tokens)
            else:
                fit = fit_loop(self, usable, chunk_tokens, height, width, cache_for)
                spec, why, cut, stream_encode, self.loop_left_gib = (
                    fit.spec,
                    fit.why,
                    fit.cut,
                    fit.stream_encode,
                    fit.left_gib,
                )
                if self._wants_block_graphs():  # where they change nothing of the job's cache and cut
                    try:
                        fitted = fit_loop(self, usable, chunk_tokens, height, width, cache_for, block_graphs=True)
                    except ValueError:  # no room for them at all
                        fitted = None
                    self.block_graph_room = fitted is not None and fitted.same_video(fit)
                    self.loop_left_gib = fitted.left_gib if self.block_graph_room else fit.left_gib
                # what the KV cache leaves is no room in practice: camera tensors beside the float32 VAE retried or ran out
                # of memory at the cap (docs/benchmarks.md, Sessions 15 and 18; one slab ran, 21: `camera_choice`)
                spare = 0.0
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.vae_cut, self.stream_encode = cut, stream_encode
        vae_dtype_for_cut(self, cut)
        # room for a captured forward's pool only where asked (`keeps_forward_activations`), the decode overlap where it costs nothing
        self.graph_room = usable is None or self.keeps_forward_activations()
        self.decode_tile_pixels = cut.tile_pixels
        if stream_encode or usable is None:
            self.encode_tile_pixels = cut.tile_pixels
        else:  # all frames before the loop, beside the DiT as it is then: its blocks' 8-bit weights (fp8, int8) are
            # made above where it is loaded. Counted as the bf16 DiT, the float32 VAE and the whole float32 video, the
            # 1.3B's encode under 8 GiB took 1.5-1.7 s of its first chunk in 92k-pixel tiles ("Session 31")
            room = usable - (dit if slot.loaded else self.plan.expert_gib) - LOOP_MARGIN_GIB
            self.encode_tile_pixels = encode_tile_pixels(height, width, room, self.vae_dtype)
        self.plan.vae_tile_pixels = self.decode_tile_pixels
        if self.ranks > 1:  # the figures above are one rank's
            why += f" (each of {self.ranks} GPUs holds {self.cache_heads} of the {cfg.num_heads} heads)"
        self.cache_spec, self.cache_reason = spec, why
        if spare is not None and self.vae_dtype == torch.bfloat16:
            spare += cut.bf16_saving_gib
        graphs_gib = BLOCK_GRAPH_BYTES_PER_TOKEN * self.rank_rows(chunk_tokens) / GiB if self.block_graph_room else 0.0
        spare = None if spare is None else spare - graphs_gib
        choice = CameraChoice(camera_blocks(spare, chunk_tokens, cfg.dim, cfg.num_layers, self.dtype))
        if usable is not None and not self.keeps_forward_activations():  # the same KV cache and tiles: the same video
            kv = spec.planned_bytes(cfg.num_layers, self.cache_heads, cfg.head_dim, self.dtype) / GiB
            fixed = self.loop_fixed_gib(chunk_tokens)[0]
            room = usable - fixed - kv - activation_gib(self.rank_rows(chunk_tokens), cfg.dim) - graphs_gib
            shape = (cfg.dim, cfg.num_layers)
            choice = camera_choice(choice.blocks, streamed, room, cut.decode_push_gib, chunk_tokens, shape, self.dtype)
        self.camera_blocks, self.decode_after_loop, self.camera_until_decode = dataclasses.astuple(choice)
        if not self.graph_room:
            fitted = overlap_fit(self, usable, chunk_tokens, height, width, cache_for, spec, cut)
            if fitted is not None:
                self.graph_room, self.loop_left_gib = True, fitted.left_gib
        hold_planned_weights(self, self.loop_left_gib if usable is not None else spare, chunk_tokens, slot)
        if self.on_plan is not None:
            self.on_plan(self.describe_plan())
        return spec

    def keeps_forward_activations(self) -> bool:
        """Whether a chunk forward's activations outlive it (a CUDA graph's pool, asked for) or share the device
        with a decode (on a second stream: `fast_fit.overlap_fit` tries it): the plan then counts both at once. Under a
        budget only beside a bf16 VAE: with the float32 one the graph's pool ran out of memory at 24 GiB although
        the arithmetic had room (sessions 7 and 9); beside the bf16 one it ran (docs/benchmarks.md, "Session 9: Fast")."""
        asked = self.device.type == "cuda" and (self.use_chunk_graphs or self.overlap_trial)
        return asked and (self.plan.usable_gib is None or self.vae_dtype == torch.bfloat16)

    def _wants_block_graphs(self) -> bool:
        return self.device.type == "cuda" and self.use_block_graphs and not self.use_chunk_graphs

    def rank_rows(self, chunk_tokens: int) -> int:
        """The rows of a chunk this device's forward works on: all, or its rank's share (`sequence_parallel`; after
        the all-to-all it holds every token of its heads: the same bytes). Counted whole, v1 Fast's two-GPU blocks ran eager."""
        return -(-chunk_tokens // self.ranks)

    def loop_fixed_gib(self, chunk_tokens: int) -> tuple[float, float]:
        """-> (what the loop always holds: the DiT, its text keys/values, the VAE, the margin; those keys/values)."""
        cfg = self.dit_config
        elem = torch.empty(0, dtype=self.dtype).element_size()
        cross = 2 * cfg.num_layers * cfg.text_len * cfg.dim * elem / GiB
        return self.dit_gib(chunk_tokens) + cross + VAE_WEIGHTS_GIB + LOOP_MARGIN_GIB, cross

    def dit_gib(self, tokens: int) -> float:
        """The DiT on the device through the chunk loop of `tokens` a chunk, under this pipeline's compute
        (`resident_dit_gib`)."""
        p = self.plan
        return resident_dit_gib(p.expert_gib, p.checkpoint_kind, self.compute, self.dit_config, self.dtype, tokens)

    def _decode_stream(self, live: bool = False) -> torch.cuda.Stream | None:
        """A second CUDA stream for the chunk decodes when they may run beside the DiT: on CUDA, asked
        for (`overlap_decode`), and with room in the plan for a decode beside a forward's activations; never for a
        live job (each chunk decodes at once, alone: see `decode_overlap`)."""
        if live or self.device.type != "cuda" or not (self.overlap_decode and self.graph_room):
            return None
        return decode_overlap.side_stream(self.device)

    def describe_plan(self) -> str:
        """The base plan's lines with the denoise line for the chunk loop and the KV cache added."""
        return describe_fast_plan(self)

    def new_cache(self, latent_frames: int, frame_tokens: int, options: FastOptions, dtype: torch.dtype) -> KVCache:
        """The job's cache, allocated for one chunk at first (`KVCache.grow` makes it whole)."""
        cfg = self.dit_config
        spec = self.cache_spec
        if spec is None or spec.frame_tokens != frame_tokens:  # no plan for this size: the reference's cache
            spec = full_cache_spec(latent_frames, frame_tokens, options)
        start = options.chunk_frames * frame_tokens
        if self.scale_out is not None:  # each rank's cache holds half the heads (worldgen.pipelines.two_gpu)
            return self.scale_out.new_cache(self.residency.use("fast"), spec, cfg, dtype, self.device, start)
        return KVCache(spec, cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype, self.device, start_tokens=start)

    # -- denoise -----------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout_chunks(
        self,
        noise: torch.Tensor,
        y: torch.Tensor | Callable[[int], torch.Tensor],
        context: torch.Tensor,
        plucker: torch.Tensor | Callable[[int], torch.Tensor | None] | None,
        options: FastOptions,
        generator: torch.Generator | None = None,
        renoise_draws: torch.Tensor | None = None,
        progress: Progress = _no_progress,
    ) -> Iterator[torch.Tensor]:
        """Yield each chunk's final latent [16, chunk_frames, lat_h, lat_w] (float32, on the device) in order.

        `y` is the whole conditioning [20, lat_f, lat_h, lat_w], or a function giving chunk c's
        [20, chunk_frames, lat_h, lat_w] (called in order, chunk 1's call while the cache still holds
        one chunk: see `ChunkConditioning`). Re-noising draws come from `generator` (CPU, so the
        result does not depend on the device), or from `renoise_draws`
        [chunks, steps-1, 16, chunk_frames, lat_h, lat_w] when given. `plucker` may also be a function
        giving chunk c's camera [1, 384, chunk_frames, lat_h, lat_w] (called in order, before anything of
        chunk c runs; it may wait for poses: a live job, `worldgen.pipelines.fast_live`), or None when
        there is no chunk c: the rollout then ends after the chunks made so far.
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
        # steady chunks replay a captured CUDA graph (worldgen.models.chunk_graph): the same numbers
        forward = self.chunk_graphs = ChunkGraphs(model, allowed=self.use_chunk_graphs and self.graph_room)
        if not forward.allowed:  # the blocks between self-attentions replayed (worldgen.models.block_graphs)
            model.block_graphs = self.block_graphs = BlockGraphs(allowed=self.block_graph_room)
        # a chunk's 5 forwards share its camera's modulation where the plan has room (not with graphs: eager)
        if plucker is not None and self.camera_blocks and not forward.allowed:
            model.camera_cache = CameraCache(self.camera_blocks, slab=self.camera_until_decode)
        device, steps = self.device, len(schedule.timesteps)
        # one tensor per timestep, the refresh's 0 last: their time conditioning is computed once (eager)
        timesteps = [torch.tensor([t], dtype=torch.int64, device=device) for t in (*schedule.timesteps, 0)]
        if not forward.allowed:
            model.time_cache = {}
        context = [context.to(device)]
        total = chunks * (steps + 1) - 1  # no refresh after the last chunk
        progress("denoise", 0, total)
        try:
            for c in range(chunks):
                frames = slice(c * n, (c + 1) * n)
                if model.camera_cache is not None:  # the last chunk's modulation: freed before y's encode
                    model.camera_cache.clear()
                # y before the camera: a live job's encode runs while its poses are on their way
                y_c = to_device(y(c) if callable(y) else y[:, frames], device)[None]
                cam_c = plucker(c) if callable(plucker) else None if plucker is None else plucker[:, :, frames]
                if cam_c is None and callable(plucker):  # a live camera waits for chunk c's poses; None: the job ended
                    break
                cam_c = None if cam_c is None else to_device(cam_c, device)
                if c > 0:  # chunk 0 runs in a one-chunk cache (the rest of the conditioning encodes beside it)
                    cache.grow()
                start = c * n * frame_tokens
                x_t = to_device(noise[:, frames].float(), device)
                for s in range(steps):
                    with torch.profiler.record_function("denoise forward"):  # named on a profile
                        flow = forward(x_t[None], timesteps[s], context, y_c, cam_c, cache=cache, current_start=start)
                    flow = flow[0]
                    x0 = (x_t.double() - schedule.sigmas_x0[s] * flow.double()).to(torch.float32)
                    del flow
                    if s + 1 < steps:
                        if renoise_draws is not None:
                            draw = renoise_draws[c, s].to(device, torch.float32)
                        else:
                            draw = torch.randn(x0.shape, generator=generator, dtype=torch.float32)
                            draw = to_device(draw, device)  # pinned, not waited for
                        x_t = renoise(x0, draw, schedule.sigmas_add_noise[s + 1])
                    progress("denoise", c * (steps + 1) + s + 1, total)
                # the chunk is final: out before the refresh (only the cache changes; the last chunk's is skipped)
                if self.camera_until_decode and model.camera_cache is not None:
                    model.camera_cache.clear()  # its room is the decoder's
                if self.scale_out is not None:  # no chunk out of a forward whose peer was lost under it
                    self.scale_out.verify()
                yield x0
                if c + 1 < chunks:
                    # refresh: the cache gets the clean chunk's keys/values (the last block only writes them)
                    with torch.profiler.record_function("cache refresh"):
                        refresh = dict(cache=cache, current_start=start, keys_only=True)
                        forward(x0[None], timesteps[-1], context, y_c, cam_c, **refresh)
                    progress("denoise", (c + 1) * (steps + 1), total)
        finally:  # also when the consumer stops early (a cancelled job)
            forward.close()
            if model.block_graphs is not None:
                model.block_graphs.close()
            cache.close()
            model.camera_cache = model.time_cache = model.block_graphs = None
            free_device_memory(device)
        model = forward.model = None
        self.residency.phase_done("denoise")

    def warm_up(self, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None) -> float:
        """Run the DiT's forward of a job of `settings` (image `image_size`, H x W) once per chunk before any
        job, every kernel and cache filled (`worldgen.pipelines.fast_warm_up.warm_up`); -> seconds taken."""
        from worldgen.pipelines.fast_warm_up import warm_up

        return warm_up(self, settings, image_size)

    def compile_ahead(
        self, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None
    ) -> float:
        """Compile the Triton kernels and cuDNN graphs a job of `settings` runs, side by side, before any job
        (`worldgen.pipelines.fast_warm_up.compile_ahead`); -> seconds taken."""
        from worldgen.pipelines.fast_warm_up import compile_ahead

        return compile_ahead(self, settings, image_size)

    def first_use_ahead(
        self, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None
    ) -> float:
        """Run umT5 and the VAE once at a job's shapes before any job, as a server starts
        (`worldgen.pipelines.fast_warm_up.first_use_ahead`); -> seconds taken."""
        from worldgen.pipelines.fast_warm_up import first_use_ahead

        return first_use_ahead(self, settings, image_size)

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
        camera: Callable[[int], torch.Tensor | None] | None = None,
        stream: bool | None = None,
        keep: Keep | None = None,
        sink: Sink | None = None,
    ) -> torch.Tensor:
        """-> video [3, F, H, W] float32 in [-1, 1] on the CPU (see `Pipeline.generate`); with `keep`, each chunk as
        `keep` returns it (made on the device, before the copy to the host), frames first (the mp4's uint8 frames:
        `worldgen.video_out.mp4_frames`); `on_chunk` then gets each chunk so kept. With `sink`, each kept chunk goes
        there in order and none is held: the video returned has the frames' size and none of them
        (`decoded_video.DecodedVideo`).

        `settings` gives size, frame_num, seed, shift and the Fast knobs (steps, guidance, boundary and
        the negative prompt do not apply); `options`, when given, replaces those knobs. `on_chunk(i, n, frames)` gets every chunk's decoded
        frames [3, f, H, W] (as `keep` makes them) as soon as they exist (the first chunk has 9 frames, the others 12).
        `camera(c)`, instead of `poses`/`intrinsics`: chunk c's camera as it becomes known (a live job,
        `worldgen.pipelines.fast_live.LiveCamera`); `settings.frame_num` is then the planned length and
        the video ends early when `camera` returns None. `stream=False` (a batch job: nobody takes the
        chunks as they come; the default without `on_chunk`) lets the plan decode them after the loop,
        where that room speeds the loop up (`plan_job`): the same video, `on_chunk` then called as they decode.
        """
        settings = settings or GenerationSettings(model="fast")
        progress = progress or _no_progress
        clock = LapClock(self.device)
        if camera is not None and poses is not None:
            raise InputError("a live camera replaces poses: give one or the other")
        poses, intrinsics = validate_camera(poses, intrinsics)
        chunk_frames = options.chunk_frames if options else self.family.chunk_frames
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
        options = options or FastOptions.from_settings(settings, (lat_h // 2) * (lat_w // 2), self.family)
        streamed = on_chunk is not None if stream is None else stream
        self.plan_job(frames.latent_frames, lat_h, lat_w, options, streamed=streamed)
        num_chunks = frames.latent_frames // options.chunk_frames
        decodes = ChunkDecodes(
            self, clock, frames.frames, num_chunks, on_chunk, progress, camera is not None, keep, sink
        )
        # a live job's waits for poses are not DiT time
        plucker = None if camera is None else clock.around(camera, "poses", before="dit")
        if camera is None and poses is not None:  # chunk c's camera made when the loop starts chunk c
            plucker = FastCamera(poses, intrinsics, frames, h, w, options.chunk_frames, settings.translation_scale)

        if self.stream_encode:  # chunk 0's frames inside the loop, the rest after chunk 0's preview
            live = {"whole_first": camera is not None, "ready": getattr(camera, "ready", None)}  # a live job's
            y = ChunkConditioning(self, image_resized, frames.frames, options.chunk_frames, clock, progress, **live)
        else:
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

        with self.meter.phase("loop"):  # the DiT chunk loop, each chunk decoded as the plan says (`ChunkDecodes`)
            decodes.start()
            with decodes.loop_first():  # a batch job's DiT kernels before the decode's
                for latent in self.rollout_chunks(noise, y, context, plucker, options, generator, progress=progress):
                    decodes.take(latent)
                decodes.finish()
            self.residency.phase_done("decode")
        clock.mark("total")
        self.timings = clock.seconds
        self.last_latents = decodes.latents  # each chunk's final latent (CPU), for comparisons (bench_fast)
        return decodes.video()


def y_from_latent(image_latent: torch.Tensor, frames: int) -> torch.Tensor:
    """[16, lat_f, lat_h, lat_w] VAE latent of the conditioning video -> y [20, ...] (mask first)."""
    _, _, lat_h, lat_w = image_latent.shape
    return torch.cat([condition_mask(frames, lat_h, lat_w), image_latent])
