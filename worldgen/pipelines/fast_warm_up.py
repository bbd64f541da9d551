"""Before any job: the Fast DiT's kernels compiled (`compile_ahead`, at load) or run once (`warm_up`),
and the phases around it run once (`first_use_ahead`, at a server's start).

Both drive the DiT's forward once per chunk of a job of the given settings, on random inputs at the
job's shapes, under the plan the job gets (each chunk a new KV-window length: the FP8 cache's window
kernels and cuDNN's attention graphs of each length are made):
- `compile_ahead` (every Fast pipeline on CUDA, when it loads): under
  `worldgen.kernels.triton_lang.compiling_ahead`, so the hand-written Triton kernels the forward meets
  are compiled on a pool of threads side by side instead of one after another inside the first job's
  first forward, and only the DiT's first block runs (every block launches the same variants). What
  is not Triton runs for real: the GEMMs, cuDNN's attention (its graphs for these shapes are built and
  kept), the fused groups torch.compile takes (`fused.KERNELS = "compile"`). Seconds at load instead of
  many more in the first chunk (docs/benchmarks.md, "Session 11: Fast").
- `warm_up` (a server's `--warm-up`): every block runs, then once more on the last chunk (the CUDA-graph
  capture), with nothing deferred: it also fills the torch.compile cache.
- `first_use_ahead` (a worker's start, `worldgen.worker`): what a process pays the first time only around
  the DiT, at a job's shapes: umT5 on a placeholder prompt (the tokenizer, its GEMMs' kernels, the pinned
  staging), the VAE's streamed encode of chunk 0's frames and the decode of two chunks as the job decodes them
  (cuDNN's plans and kernels for these shapes; where the plan parks the tiles' caches, their pinned host memory,
  which the job's decoder then reuses from PyTorch's host allocator). A second process's first chunk paid ~0.8 s more than a warm one for these
  (docs/benchmarks.md, "Session 11: Fast"). Not at every load: a one-shot `generate` would pay them
  anyway, once, and the placeholder's work on top.
No job's numbers change: the cache, the camera modulations and the outputs made here are thrown away.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from contracts.engine_options import EngineOptions
from contracts.settings import GenerationSettings, SettingsError
from worldgen.errors import CheckpointError, InputError
from worldgen.kernels.triton_lang import compiling_ahead
from worldgen.models.chunk_graph import ChunkGraphs
from worldgen.pipelines.fast_plan import FastOptions, fast_frames
from worldgen.runtime.cuda_memory import free_device_memory, release_pinned_cache

# Fast pipelines compile ahead when they load on CUDA (bench_fast.py --compile-ahead off turns it off)
COMPILE_AHEAD = True
PLACEHOLDER_PROMPT = "a robot camera moves through a room"  # first_use_ahead's; its embedding is thrown away


def job_defaults(options: EngineOptions) -> GenerationSettings | None:
    """The job a worker compiles ahead, runs its models ahead and warms up for: `warm_up_settings` (the
    server's generation preset, which it fills in) as a Fast job; None: the default settings' job."""
    if options.warm_up_settings is None:
        return None
    where = "engine options: warm_up_settings"
    try:
        settings = GenerationSettings.from_dict(options.warm_up_settings, where)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}" if where not in str(exc) else str(exc)) from None
    return dataclasses.replace(settings, model="fast")


def compile_workers() -> int:
    """Threads compiling side by side: Triton's compile is part Python (the GIL), part LLVM and ptxas."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


@torch.no_grad()
def compile_ahead(pipe, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None) -> float:
    """Compile the Triton kernels a job of `settings` runs, in parallel, and build its cuDNN graphs;
    -> seconds taken (0 off CUDA)."""
    if pipe.device.type != "cuda":
        return 0.0
    start = time.perf_counter()
    try:
        with compiling_ahead(compile_workers()):
            _forward_each_chunk(pipe, settings, image_size, full=False)
    except (CheckpointError, InputError):
        raise  # the checkpoint or the settings: no job could run either
    except Exception as exc:  # noqa: BLE001  (only a head start: a job compiles what it meets, and fails on its own)
        warnings.warn(f"compiling ahead failed ({type(exc).__name__}: {exc}); the first job compiles its kernels",
                      stacklevel=2)  # fmt: skip
        free_device_memory(pipe.device)
    return time.perf_counter() - start


@torch.no_grad()
def warm_up(pipe, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None) -> float:
    """Run the DiT's forward of a job of `settings` with an image of `image_size` (H, W; default the model
    frame) once per chunk, then once more on the last (the CUDA-graph capture); -> seconds taken."""
    start = time.perf_counter()
    _forward_each_chunk(pipe, settings, image_size, full=True)
    return time.perf_counter() - start


@torch.no_grad()
def first_use_ahead(
    pipe, settings: GenerationSettings | None = None, image_size: tuple[int, int] | None = None
) -> float:
    """Run umT5 once on a placeholder prompt and the VAE once at the shapes of a job of `settings` (image
    `image_size`, H x W), so the first job's text, encode and decode run as a warm process's do; -> seconds
    taken. The text-embedding cache is neither read nor written; umT5 on the CPU beside a GPU pipeline is
    left alone. Worth it on CUDA only (`load_pipeline` calls it there): the CPU has no kernels or plans
    to prepare."""
    from worldgen.models.vae_tiling import StreamingEncoder
    from worldgen.pipelines.chunk_decodes import job_decoder

    start = time.perf_counter()
    try:
        # not umT5 on the CPU beside a GPU pipeline (--t5-on-cpu): tens of seconds, and no kernel to prepare
        if pipe.tokenizer is not None and pipe.plan.text_encoder_device.type == pipe.device.type:
            pipe.encode_ids(*pipe.tokenizer([PLACEHOLDER_PROMPT], pipe.text_len))
        lat_h, lat_w, _, options, frames = _planned_job(pipe, settings, image_size)
        n = options.chunk_frames
        vae = pipe.residency.use("vae")
        device = next(vae.parameters()).device
        encoder = StreamingEncoder(vae, pipe.encode_tile_pixels)
        encoder.push(torch.zeros(1, 3, min(4 * (n - 1) + 1, frames.frames), lat_h * 8, lat_w * 8, device=device))
        del encoder, vae
        pipe.residency.phase_done("encode")
        # umT5's staging and the encode's pinned blocks go; the decoder's parked tiles, pinned next, stay cached for the
        # first job's decoder to take at the same sizes (`host_slab`)
        release_pinned_cache()
        decoder = job_decoder(pipe, pipe.decode_tile_pixels)  # its tiles and parking (the plan may let the VAE go)
        for _ in range(2):  # chunk 0 decodes its first frame alone, the chunks after it do not
            decoder.push(torch.zeros(1, 16, n, lat_h, lat_w, device=next(decoder.vae.parameters()).device))
        del decoder
        pipe.residency.phase_done("decode")
        if pipe.device.type == "cuda":
            torch.cuda.synchronize(pipe.device)
    except (CheckpointError, InputError):
        raise  # the checkpoint or the settings: no job could run either
    except Exception as exc:  # noqa: BLE001  (only a head start: the first job pays what is left)
        warnings.warn(f"running text and VAE ahead failed ({type(exc).__name__}: {exc})", stacklevel=2)
    finally:
        free_device_memory(pipe.device)
    return time.perf_counter() - start


@contextmanager
def _first_block_only(model: nn.Module) -> Iterator[None]:
    blocks = model.blocks
    model.blocks = blocks[:1]
    try:
        yield
    finally:
        model.blocks = blocks


def _planned_job(pipe, settings: GenerationSettings | None, image_size: tuple[int, int] | None):
    """The latent size, frame tokens, options and frames of a job of `settings` (default: the default
    settings' job, the model frame), with the pipeline's plan made for it (told to no one)."""
    from contracts.model_frame import MODEL_FRAME
    from worldgen.pipelines.request import latent_size

    settings = settings or GenerationSettings(model="fast")
    lat_h, lat_w = latent_size(image_size or MODEL_FRAME, settings.max_area)
    frame_tokens = (lat_h // 2) * (lat_w // 2)
    options = FastOptions.from_settings(settings, frame_tokens, pipe.family)
    with warnings.catch_warnings():  # the job says it when its frames get rounded
        warnings.simplefilter("ignore")
        frames = fast_frames(settings.frame_num, None, options.chunk_frames)
    on_plan, pipe.on_plan = pipe.on_plan, None
    try:
        pipe.plan_job(frames.latent_frames, lat_h, lat_w, options)
    finally:
        pipe.on_plan = on_plan
    return lat_h, lat_w, frame_tokens, options, frames


def _forward_each_chunk(pipe, settings: GenerationSettings | None, image_size: tuple[int, int] | None, full: bool):
    lat_h, lat_w, frame_tokens, options, frames = _planned_job(pipe, settings, image_size)
    model = pipe.residency.use("fast")
    cache = pipe.new_cache(frames.latent_frames, frame_tokens, options, model.compute_dtype)
    forward = ChunkGraphs(model, allowed=full and pipe.use_chunk_graphs and pipe.graph_room)
    device, n = pipe.device, options.chunk_frames
    generator = torch.Generator("cpu").manual_seed(0)
    context = [torch.zeros(pipe.text_len, model.text_embedding[0].in_features, device=device)]
    x = torch.randn(1, 16, n, lat_h, lat_w, generator=generator).to(device)
    y = torch.zeros(1, 20, n, lat_h, lat_w, device=device)
    cam = torch.zeros(1, 384, n, lat_h, lat_w, device=device)
    t = torch.full((1,), 999, dtype=torch.int64, device=device)
    chunks = frames.latent_frames // n
    camera_cache = model.camera_cache
    try:
        # two ranks (worldgen.pipelines.two_gpu) run whole forwards: rank 1 runs every block of each call it
        # is handed, so a first-block-only forward here would leave the ranks' collectives out of step
        whole = full or pipe.scale_out is not None
        with nullcontext() if whole else _first_block_only(model):
            for c in range(chunks):
                if c > 0:
                    cache.grow()
                for _ in range(2 if full and c == chunks - 1 else 1):
                    forward(x, t, context, y, cam, cache=cache, current_start=c * n * frame_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        forward.close()
        cache.close()
        if camera_cache is not None:
            camera_cache.clear()  # this camera's modulations (of one block only, when compiling ahead)
        free_device_memory(device)
