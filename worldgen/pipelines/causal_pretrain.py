"""LingBot-World 2.0's causal-pretrain model: the causal chunk loop with classifier-free guidance.

The reference's `WanI2VCausal._generate_causal_pretrain`, on the Fast pipeline's phases (text, encode,
plan, chunk-by-chunk decode: `worldgen.pipelines.fast`); only the denoise loop differs:
  for each chunk of `chunk_frames` latent frames:
    the UniPC scheduler is set again (`steps` steps at `shift`: its history starts empty every chunk)
    for each timestep t: cond   = DiT(x, t, prompt,          conditional KV cache)
                         uncond = DiT(x, t, negative prompt, unconditional KV cache)
                         x = step(uncond + guide * (cond - uncond))
    the chunk is the final x; one more forward of it at t = 0 in each cache (conditional, then
    unconditional) refreshes both with clean keys and values.
Both caches hold the whole video, as the reference's (an attention window rolls both alike). The
reference hard-codes 40 steps, guidance 5.0 and its negative prompt (`NEGATIVE_PROMPT`); the
[v2-pretrain] preset gives the first two as settings (`steps`, `guide_scale`), so other values run too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from worldgen.errors import InputError
from worldgen.pipelines.base import Progress, _no_progress
from worldgen.pipelines.fast import FastPipeline
from worldgen.pipelines.fast_plan import FastOptions
from worldgen.pipelines.scheduler import FlowUniPCScheduler
from worldgen.runtime.cuda_memory import free_device_memory, to_device

# `_generate_causal_pretrain`'s own (image2video.py l.749): config's sample_neg_prompt without its last terms
NEGATIVE_PROMPT = (
    "画面突变，色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
    "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
    "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)


class CausalPretrainPipeline(FastPipeline):
    """The Fast pipeline with the guided chunk loop: two KV caches, `steps` UniPC steps a chunk."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kv_caches = 2  # conditional and unconditional: each planned in half the room
        self.steps, self.guide_scale = self.family.guidance_steps, self.family.guide_scale
        self.negative_context: torch.Tensor | None = None

    def generate(
        self, image, prompt, poses=None, intrinsics=None, settings=None, *args, negative_context=None, **kwargs
    ):
        """`FastPipeline.generate` with the job's steps and guidance (`settings.steps`, `settings.guide_scale`'s
        first value) and the negative prompt's embedding (`settings.negative_prompt`, else the reference's)."""
        if settings is not None:
            self.steps, self.guide_scale = settings.steps, settings.guide_scale[0]
        if negative_context is None:
            text = settings.negative_prompt if settings is not None and settings.negative_prompt else NEGATIVE_PROMPT
            (negative_context,) = self.encode_text([text])
        self.negative_context = negative_context
        try:
            return super().generate(image, prompt, poses, intrinsics, settings, *args, **kwargs)
        finally:
            self.negative_context = None

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
        negative_context: torch.Tensor | None = None,
    ) -> Iterator[torch.Tensor]:
        """Yield each chunk's final latent [16, chunk_frames, lat_h, lat_w] in order (as `FastPipeline`'s; the
        only random draw is `noise`, so `generator` and `renoise_draws` are unused)."""
        negative = self.negative_context if negative_context is None else negative_context
        if negative is None:
            raise InputError("the guided causal model needs the negative prompt's embedding (negative_context)")
        _, lat_f, lat_h, lat_w = noise.shape
        n = options.chunk_frames
        if lat_f % n:
            raise InputError(f"latent frames {lat_f} are not whole chunks of {n}")
        chunks, frame_tokens = lat_f // n, (lat_h // 2) * (lat_w // 2)
        model = self.residency.use("fast")
        device = self.device
        caches = [self.new_cache(lat_f, frame_tokens, options, model.compute_dtype) for _ in range(2)]
        contexts = [[context.to(device)], [negative.to(device)]]
        total = chunks * (self.steps + 2) - 2  # no refresh after the last chunk
        progress("denoise", 0, total)
        done = 0
        try:
            for c in range(chunks):
                frames = slice(c * n, (c + 1) * n)
                y_c = to_device(y(c) if callable(y) else y[:, frames], device)[None]
                cam_c = plucker(c) if callable(plucker) else None if plucker is None else plucker[:, :, frames]
                if cam_c is None and callable(plucker):  # a live camera ended before chunk c
                    break
                cam_c = None if cam_c is None else to_device(cam_c, device)
                if c > 0:
                    for cache in caches:
                        cache.grow()
                start = c * n * frame_tokens
                scheduler = FlowUniPCScheduler()
                scheduler.set_timesteps(self.steps, shift=options.shift)  # history reset every chunk
                x = to_device(noise[:, frames].float(), device)
                for t in scheduler.timesteps:
                    timestep = to_device(t.reshape(1), device)
                    cond, uncond = (
                        model(x[None], timestep, ctx, y_c, cam_c, cache=cache, current_start=start)[0].float()
                        for ctx, cache in zip(contexts, caches, strict=True)
                    )
                    guided = uncond + self.guide_scale * (cond - uncond)
                    x = scheduler.step(guided[None], t, x[None])[0]
                    done += 1
                    progress("denoise", done, total)
                if self.scale_out is not None:  # no chunk out of a forward whose peer was lost under it
                    self.scale_out.verify()
                yield x
                if c + 1 < chunks:  # refresh both caches with the clean chunk (conditional first)
                    zero = torch.zeros(1, dtype=torch.int64, device=device)
                    for ctx, cache in zip(contexts, caches, strict=True):
                        model(x[None], zero, ctx, y_c, cam_c, cache=cache, current_start=start)
                    done += 2
                    progress("denoise", done, total)
        finally:
            for cache in caches:
                cache.close()
            free_device_memory(device)
        self.residency.phase_done("denoise")
