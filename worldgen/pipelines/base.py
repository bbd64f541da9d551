"""Image + prompt + camera -> video: the LingBot-World image-to-video path, phase by phase.

Phases run in order and each holds on the device only what it needs. The memory plan
(`worldgen.runtime.memory`) decides and the residency policy (`worldgen.runtime.residency`) loads, prefetches and
frees: the pipeline only tells the policy which model it is about to run and which phase is done.

  text   umT5 (or a cache hit: no model at all) -> prompt and negative-prompt embeddings
  encode VAE: the resized image plus F-1 black frames -> the 20-channel condition y
  denoise the two DiT experts, switched at t = boundary*1000, classifier-free guidance
  decode VAE: latent -> video [3, F, H, W] in [-1, 1]

Each step is a public method so tests can compare every intermediate with the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from contracts.engine_options import canonical_compute
from contracts.settings import GenerationSettings
from worldgen.errors import InputError
from worldgen.models.camera_cache import CameraCaches
from worldgen.models.tokenizer import PromptTokenizer
from worldgen.pipelines.camera import camera_conditioning, frames_for_poses, validate_camera
from worldgen.pipelines.image_input import load_image
from worldgen.pipelines.multi_gpu import GuidanceDevice
from worldgen.pipelines.request import latent_size  # noqa: F401  (re-exported: the rule is defined there)
from worldgen.pipelines.scheduler import FlowUniPCScheduler
from worldgen.pipelines.text_cache import TextCache
from worldgen.runtime.memory import MemoryPlan
from worldgen.runtime.metering import PhaseMeter
from worldgen.runtime.residency import ModelSlot, ResidencyPolicy

Progress = Callable[[str, int, int], None]
VAE_STRIDE = (4, 8, 8)
PATCH = (1, 2, 2)
NEGATIVE_PROMPT_FILE = Path(__file__).with_name("negative_prompt.txt")


def _no_progress(phase: str, step: int, total: int) -> None:
    pass


def prepare_image(image: Image.Image | np.ndarray | str | Path, max_area: int) -> torch.Tensor:
    """-> [3, 1, h, w] float32 in [-1, 1]: mapped to [-1, 1], then bicubic-resized (no clamp)."""
    rgb = load_image(image)
    pixels = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255.0)
    pixels = pixels.sub(0.5).div(0.5)
    lat_h, lat_w = latent_size(pixels.shape[1:], max_area)
    h, w = lat_h * VAE_STRIDE[1], lat_w * VAE_STRIDE[2]
    return F.interpolate(pixels[None], size=(h, w), mode="bicubic").transpose(0, 1)


def condition_mask(frames: int, lat_h: int, lat_w: int) -> torch.Tensor:
    """[4, lat_f, lat_h, lat_w]: 1 for the 4 sub-frames of latent frame 0 (the given image), else 0."""
    lat_f = (frames - 1) // VAE_STRIDE[0] + 1
    mask = torch.zeros(4, lat_f, lat_h, lat_w)
    mask[:, 0] = 1.0
    return mask


def default_negative_prompt() -> str:
    return NEGATIVE_PROMPT_FILE.read_text(encoding="utf-8").strip()


class Pipeline:
    """The loaded (or loadable) models of one checkpoint; `residency` (default: a `ResidencyPolicy`
    following `plan`) decides when each is in memory."""

    def __init__(
        self,
        *,
        tokenizer: PromptTokenizer | None,
        text_encoder: ModelSlot,
        vae: ModelSlot,
        experts: dict[str, ModelSlot],
        device: torch.device,
        text_len: int,
        name: str,
        plan: MemoryPlan | None = None,
        text_cache: TextCache | None = None,
        is_random_weights: bool = False,
        text_dtype: torch.dtype | None = None,
        residency: ResidencyPolicy | None = None,
        compute: str = "exact",
        second_device: GuidanceDevice | None = None,
        vae_dtype: torch.dtype = torch.float32,
    ):
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder
        self.text_dtype = text_dtype  # the dtype umT5 computes in (None: as loaded)
        self.vae = vae
        self.vae_dtype = vae_dtype  # what the VAE slot loads it in (`worldgen.pipelines.fast_plan.vae_dtype`)
        self.experts = experts
        self.device = torch.device(device)
        self.text_len = text_len
        self.name = name
        self.residency = residency or ResidencyPolicy(
            plan or MemoryPlan.unlimited(self.device), text_encoder, vae, experts
        )
        self.text_cache = text_cache
        self.is_random_weights = is_random_weights
        self.meter = PhaseMeter(self.device)
        self.on_plan: Callable[[str], None] | None = None  # told the plan whenever a job changes it
        self.engine: dict[str, Any] = {}  # what load_pipeline applied (dtype, compute, attention, ...)
        self._frame_pixels = 0
        self.identity: dict[str, str] = {}  # set by load_pipeline: variant, checkpoint, layout, dtype ...
        self.compute = compute  # the experts' compute unless a job's settings say otherwise (worldgen.kernels.fp8)
        self.second_device = second_device  # the unconditional passes' GPU (worldgen.pipelines.multi_gpu), or None

    @property
    def plan(self) -> MemoryPlan:
        return self.residency.plan

    def describe_plan(self) -> str:
        """The memory plan as printed and recorded (the Fast pipeline adds its DiT loop and KV cache)."""
        return self.plan.describe()

    # -- text -------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_ids(self, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Token ids [B, L] + mask -> per-prompt embeddings [len_i, dim] (float32, on the CPU)."""
        from worldgen.models.t5 import encode_prompts
        from worldgen.runtime.streamed_text_encoder import encode_prompts_streamed

        encoder = self.residency.use("text_encoder")
        if self.plan.stream_text_encoder:
            contexts = encode_prompts_streamed(encoder, ids, mask, self.plan.text_encoder_device, self.text_dtype)
        else:
            device = next(encoder.parameters()).device
            contexts = encode_prompts(encoder, ids.to(device), mask.to(device))
        del encoder
        self.residency.phase_done("text")
        return [c.float().cpu() for c in contexts]

    def encode_text(self, prompts: list[str]) -> list[torch.Tensor]:
        """Prompts -> embeddings, from the on-disk cache when it has them (T5 is then never loaded)."""
        if self.tokenizer is None:
            raise InputError("this pipeline has no tokenizer: pass precomputed `context` embeddings")
        cached = [self.text_cache.get(p, self.text_len) if self.text_cache else None for p in prompts]
        todo = [p for p, c in zip(prompts, cached, strict=True) if c is None]
        if todo:
            ids, mask = self.tokenizer(todo, self.text_len)
            fresh = iter(self.encode_ids(ids, mask))
            for i, c in enumerate(cached):
                if c is None:
                    cached[i] = next(fresh)
                    if self.text_cache:
                        self.text_cache.put(prompts[i], self.text_len, cached[i])
        return cached

    # -- encode -----------------------------------------------------------------------------------
    @torch.no_grad()
    def condition(self, image_resized: torch.Tensor, frames: int) -> torch.Tensor:
        """[3, 1, h, w] image -> y [20, lat_f, lat_h, lat_w]: mask (4) + VAE latent of image + black frames, pushed
        through the VAE a tile and 16 frames at a time, the black tail past the encoder's settling not at all
        (`conditioning_video.encode_conditioning`: the numbers of `encode_tiled` of the whole video)."""
        _, _, h, w = image_resized.shape
        from worldgen.pipelines.conditioning_video import encode_conditioning

        vae = self.residency.use("vae")
        device = next(vae.parameters()).device
        latent = self._vae_with_fallback(lambda tile: encode_conditioning(vae, image_resized, frames, tile, device))[0]
        self.residency.phase_done("encode")
        mask = condition_mask(frames, h // VAE_STRIDE[1], w // VAE_STRIDE[2])
        return torch.cat([mask, latent])

    # -- denoise ----------------------------------------------------------------------------------
    @torch.no_grad()
    def denoise(
        self,
        noise: torch.Tensor,
        y: torch.Tensor,
        context: torch.Tensor,
        negative_context: torch.Tensor,
        plucker: torch.Tensor | None,
        settings: GenerationSettings,
        progress: Progress = _no_progress,
    ) -> torch.Tensor:
        """Flow-matching UniPC with two experts and classifier-free guidance -> final latent (float32)."""
        compute = self.job_compute(settings)
        scheduler = FlowUniPCScheduler()
        scheduler.set_timesteps(settings.steps, shift=settings.shift)
        device = self.device
        latent = noise.to(device, torch.float32)
        y = y.to(device)[None]
        context, negative_context = context.to(device), negative_context.to(device)
        cam = None if plucker is None else plucker.to(device)
        second = self.second_device
        if second is not None:
            second.start_job(negative_context, y, cam)
        boundary = settings.boundary * 1000
        low_scale, high_scale = settings.guide_scale
        total = len(scheduler.timesteps)
        progress("denoise", 0, total)
        schedule = ["high" if t.item() >= boundary else "low" for t in scheduler.timesteps]
        model = None
        # each block's camera modulation, once per expert, where the plan has room (worldgen.models.camera_cache)
        cameras = CameraCaches(enabled=self.plan.camera_cache and cam is not None)
        try:
            for i, t in enumerate(scheduler.timesteps):
                which = schedule[i]
                model = None  # drop our reference so an expert the policy frees is really freed
                model = self.residency.use(which, upcoming=schedule[i + 1 :])
                model.set_compute(compute)
                cameras.attach(which, model)
                scale = high_scale if which == "high" else low_scale
                timestep = t.reshape(1).to(device)
                x = latent[None]
                if second is not None:  # the unconditional pass on the other GPU, at the same time
                    pending = second.submit(which, schedule[i + 1 :], x, timestep, compute)
                    cond = model(x, timestep, [context], y, cam)[0]
                    uncond = pending.result()
                elif self.plan.batch_guidance:
                    both = model(
                        x.expand(2, -1, -1, -1, -1),
                        timestep.expand(2),
                        [context, negative_context],
                        y.expand(2, -1, -1, -1, -1),
                        cam,
                    )
                    cond, uncond = both[0], both[1]
                else:
                    cond = model(x, timestep, [context], y, cam)[0]
                    uncond = model(x, timestep, [negative_context], y, cam)[0]
                guided = uncond + scale * (cond - uncond)
                del cond, uncond
                latent = scheduler.step(guided[None], t, latent[None])[0]
                progress("denoise", i + 1, total)
        finally:
            cameras.release()  # a job's camera cache never outlives it (tens of GiB at 480p)
        model = None
        self.residency.phase_done("denoise")
        if second is not None:
            second.end_job()
        return latent

    def job_compute(self, settings: GenerationSettings) -> str:
        """The experts' compute for this job ('exact', or 'fp8' / 'int8', approximate), refused where unsupported."""
        from worldgen.kernels.fp8 import COMPUTES, check_dtype, check_supported

        compute = canonical_compute(getattr(settings, "compute", None) or self.compute)
        if compute not in COMPUTES:
            raise InputError(f"compute {compute!r} is unknown: use one of {', '.join(COMPUTES)}")
        if compute == "fp8":
            for device in [self.device] + ([self.second_device.device] if self.second_device else []):
                check_supported(device)
            check_dtype(self.identity.get("dtype"))  # what load_pipeline recorded (None: not known)
        if compute == "int8":
            from worldgen.kernels.compute_choice import check_supported as check_compute

            for device in [self.device] + ([self.second_device.device] if self.second_device else []):
                check_compute(compute, device)
        return compute

    # -- decode -----------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        from worldgen.models.vae_tiling import decode_tiled

        vae = self.residency.use("vae")
        device = next(vae.parameters()).device
        latent = latent[None].to(device)
        video = self._vae_with_fallback(lambda tile: decode_tiled(vae, latent, tile))[0].float().cpu()
        self.residency.phase_done("decode")
        return video

    def _vae_with_fallback(self, run: Callable[[int | None], torch.Tensor]) -> torch.Tensor:
        """Run a VAE pass with the plan's tile size; on running out of device memory, retry with tiles of
        half the area (the plan's estimate is linear; real peaks are lumpier), down to the smallest tile."""
        from worldgen.runtime.cuda_memory import free_device_memory
        from worldgen.runtime.memory import MIN_TILE_PIXELS

        tile = self.plan.vae_tile_pixels
        while True:
            try:
                return run(tile)
            except torch.OutOfMemoryError:
                free_device_memory(self.device, collect_cycles=True)
                if tile is not None and tile <= MIN_TILE_PIXELS:
                    raise InputError(
                        "the VAE does not fit the VRAM budget even in the smallest tiles: raise --vram-budget"
                    ) from None
                tile = max(MIN_TILE_PIXELS, (tile or self._frame_pixels) // 2)
                self.plan.vae_tile_pixels = tile
                self.plan.notes += (f"the VAE ran out of memory: retried in tiles of {tile:,} pixels",)

    # -- all of it --------------------------------------------------------------------------------
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
    ) -> torch.Tensor:
        """-> video [3, F, H, W] float32 in [-1, 1] on the CPU.

        Camera control needs both `poses` [N,4,4] (OpenCV camera-to-world) and `intrinsics` [N,4]
        (for a 480x832 frame); without them the model runs unconditioned on camera. `noise`
        [16, lat_f, lat_h, lat_w] replaces the seeded initial noise (reproducibility, tests);
        `context` / `negative_context` replace the text phase.
        """
        settings = settings or GenerationSettings()
        progress = progress or _no_progress
        self.job_compute(settings)  # an unusable compute (fp8 without FP8 tensor cores) is refused before any work
        poses, intrinsics = validate_camera(poses, intrinsics)
        frames = settings.frame_num
        if poses is not None:
            frames = frames_for_poses(frames, len(poses))
        elif (frames - 1) % 4:
            import warnings

            rounded = (frames - 1) // 4 * 4 + 1
            warnings.warn(f"frame_num {frames} is not 4n+1: using {rounded}", UserWarning, stacklevel=2)
            frames = rounded
        if frames < 5:
            raise InputError(f"frame_num {settings.frame_num} is too small: use at least 5 frames")

        with self.meter.phase("text"):
            progress("text", 0, 1)
            if context is None:
                negative = settings.negative_prompt or default_negative_prompt()
                if not prompt or not prompt.strip():
                    raise InputError("prompt is empty: describe the scene (prompt.txt or --prompt)")
                context, negative_context = self.encode_text([prompt, negative])
            elif negative_context is None:
                raise InputError("pass negative_context together with context")
            progress("text", 1, 1)

        image_resized = prepare_image(image, settings.max_area)
        _, _, h, w = image_resized.shape
        lat_f, lat_h, lat_w = (frames - 1) // 4 + 1, h // 8, w // 8
        self._frame_pixels = h * w
        if self.second_device is not None:
            self.second_device.fit(tokens_for(frames, h, w), h * w)
        if self.residency.fit(tokens_for(frames, h, w), h * w) and self.on_plan is not None:
            self.on_plan(self.describe_plan())
        plucker = None
        if poses is not None:
            plucker = camera_conditioning(poses, intrinsics, frames, h, w, settings.translation_scale).plucker

        with self.meter.phase("encode"):
            progress("encode", 0, 1)
            y = self.condition(image_resized, frames)
            progress("encode", 1, 1)

        if noise is None:
            generator = torch.Generator("cpu").manual_seed(settings.seed)
            noise = torch.randn(16, lat_f, lat_h, lat_w, generator=generator, dtype=torch.float32)
        elif tuple(noise.shape) != (16, lat_f, lat_h, lat_w):
            raise InputError(f"noise has shape {tuple(noise.shape)}, expected {(16, lat_f, lat_h, lat_w)}")

        with self.meter.phase("denoise"):
            latent = self.denoise(noise, y, context, negative_context, plucker, settings, progress)

        with self.meter.phase("decode"):
            progress("decode", 0, 1)
            video = self.decode(latent)
            progress("decode", 1, 1)
        return video


def tokens_for(frames: int, height: int, width: int) -> int:
    """Sequence length of the DiT for a video size (what drives activation memory)."""
    return ((frames - 1) // 4 + 1) * math.ceil(height / 16) * math.ceil(width / 16)
