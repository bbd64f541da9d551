"""One rollout from an action folder (the LingBot-World example layout, or our episode folder).

The folder holds `poses.npy`, `intrinsics.npy`, `image.jpg` (or `.png`) and `prompt.txt`. Every
rollout gets its provenance record (`contracts.provenance`) beside the mp4; `rollout_record` builds
it from the pipeline that made the video, whichever path ran it.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any

from contracts import episode
from contracts.model_families import V1_BASE
from contracts.provenance import checkpoint_fingerprint, make_record, write_record
from contracts.settings import GenerationSettings
from contracts.video import Mp4Stream
from worldgen.errors import InputError
from worldgen.pipelines.base import Pipeline, Progress
from worldgen.pipelines.camera import load_action
from worldgen.pipelines.image_input import load_image
from worldgen.pipelines.request import ResolvedRequest, resolve_request
from worldgen.video_out import frames_shape, mp4_frames, write_mp4


def find_image(folder: Path) -> Path:
    try:
        return episode.find_image(folder)
    except episode.EpisodeError as exc:
        raise InputError(str(exc)) from None


def read_prompt(folder: Path) -> str:
    try:
        return episode.read_prompt(folder)
    except episode.EpisodeError as exc:
        raise InputError(f"{exc} (or pass --prompt)") from None


def _fingerprint(pipe: Pipeline) -> dict[str, Any]:
    """The checkpoint's fingerprint, computed once per pipeline (a warm worker serves many jobs)."""
    cached = getattr(pipe, "_fingerprint", None)
    if cached is None:
        cached = pipe._fingerprint = checkpoint_fingerprint(pipe.identity["checkpoint"])
    return cached


def _device_name(pipe: Pipeline) -> str:
    import platform

    import torch

    if pipe.device.type == "cuda":
        return torch.cuda.get_device_name(pipe.device)
    return platform.processor() or platform.machine()


# Warnings of the engine that `resolve_request` already turned into an adjustment line.
_SAID = re.compile(r"frame_num \d+ is not 4n\+1")


def generate_noting(pipe: Pipeline, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """`pipe.generate(...)`, with the engine's UserWarnings (a Fast video cut to whole chunks, a prompt
    truncated ...) caught as plain sentences for the user and the record, not raw warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        video = pipe.generate(*args, **kwargs)
    notes = []
    for warning in caught:
        text = str(warning.message)
        if issubclass(warning.category, UserWarning) and not _SAID.search(text) and text not in notes:
            notes.append(text)
        elif not issubclass(warning.category, UserWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return video, notes


def _chunk_seconds(pipe: Pipeline) -> dict[str, Any]:
    """A Fast rollout's seconds per chunk (DiT, encode, decode, overlap, wall, and a live job's wait for the
    chunk's poses: `FastPipeline.chunk_timings`),
    where a live job's time went on the worker's side of the wire; nothing for the base model."""
    chunks = getattr(pipe, "chunk_timings", None)
    return {"chunks": [{k: round(v, 3) for k, v in t.items()} for t in chunks]} if chunks else {}


def rollout_record(
    pipe: Pipeline,
    settings: GenerationSettings,
    resolved: ResolvedRequest,
    *,
    producer: str,
    phases: list[Any],
    video_shape: tuple[int, int, int],
    notes: list[str] = (),
    inputs: dict[str, Any] | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The provenance record of a rollout `pipe` just made with `settings` (as asked): `resolved` is what
    was planned, `video_shape` (frames, height, width) what came out, `notes` what the engine changed."""
    import torch

    identity = pipe.identity
    frames, height, width = video_shape
    used = {**settings.to_dict(), "frame_num": frames}
    phase_seconds = {f"{record.name}_s": round(record.seconds, 3) for record in phases}
    peaks = {
        "peak_rss_gib": max((r.peak_rss_gib or 0.0 for r in phases), default=None),
        "peak_vram_gib": max((r.peak_vram_gib or 0.0 for r in phases), default=None)
        if pipe.device.type == "cuda"
        else None,
    }
    compute = pipe.compute if identity.get("variant") in ("fast", "causal") else pipe.job_compute(settings)
    return make_record(
        producer=producer,
        model={
            "family": identity.get("family", V1_BASE.name),  # contracts.model_families
            "variant": identity.get("variant", "base"),
            "size": identity.get("size"),
            "weights": identity.get("weights", "real"),
            "random_weights": bool(pipe.is_random_weights),
            "name": pipe.name,
        },
        checkpoint={"path": identity.get("checkpoint"), "layout": identity.get("layout"), **_fingerprint(pipe)},
        compute={
            "device": str(pipe.device),
            "device_name": _device_name(pipe),
            "dtype": identity.get("dtype"),
            # the path this job's matmuls took (exact | fp8 | int8) beside the dtype they ran in: a job's own
            # compute overrides the engine's; the Fast DiT keeps the one it was loaded with
            "compute": compute,
            "attention": identity.get("attention"),
            # fp8 jobs: whether self-attention ran in FP8 too (cuDNN's kernel) or stayed bf16, and why
            "self_attention": fp8_self_attention(pipe.device, identity.get("variant", "base"))
            if compute == "fp8"
            else None,
            "text_encoder": identity.get("text_encoder"),
            "second_device": _second_device(pipe),
            "compute_reason": getattr(pipe, "engine", {}).get("compute_reason"),  # as asked, or what auto chose and why
            # causal models: the chunk decodes on a second CUDA stream beside the next chunk's forwards, or not
            "decode_overlap": getattr(pipe, "decode_overlapped", None),
            "vae_dtype": str(pipe.vae_dtype).removeprefix("torch.") if hasattr(pipe, "vae_dtype") else None,
        },
        settings=used,
        requested=settings.to_dict(),
        adjustments=[*resolved.adjustments, *notes],
        output={"frames": frames, "height": height, "width": width, "fps": settings.fps},
        inputs=inputs,
        timings={
            **(timings or {}),
            **phase_seconds,
            **{k: round(v, 3) for k, v in peaks.items() if v is not None},
            **_chunk_seconds(pipe),
        },
        memory_plan=pipe.describe_plan(),
        torch_version=torch.__version__,
    )


def _second_device(pipe) -> str | None:
    """The device a rollout's second half ran on: the base model's guidance device, or a causal model's rank 1
    (`worldgen.pipelines.two_gpu`); None with one device."""
    if getattr(pipe, "second_device", None) is not None:
        return str(pipe.second_device.device)
    if getattr(pipe, "scale_out", None) is not None:
        return str(pipe.scale_out.devices[1])
    return None


def generate_episode(
    pipe: Pipeline,
    episode_dir: Path | str,
    settings: GenerationSettings,
    output_path: Path | str,
    progress: Progress | None = None,
    prompt: str | None = None,
    producer: str = "worker",
    on_chunk=None,
    stream: bool = True,
) -> Path:
    """Generate the rollout of an action/episode folder; write the mp4 and its provenance record
    beside it (each atomically: the record first, so a video never exists without one).

    `on_chunk(i, n, frames)` sees each finished chunk (Fast pipelines only: the mp4's uint8 frames [f, H, W, 3],
    `mp4_only`): as each is made,
    or, with `stream=False` (nobody watches them come), maybe all after the loop (`FastPipeline.generate`)."""
    folder = Path(episode_dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (expected poses.npy, intrinsics.npy, image.jpg, prompt.txt)")
    poses, intrinsics = load_action(folder)
    image_path = find_image(folder)
    image = load_image(image_path)
    prompt = prompt or read_prompt(folder)
    resolved = resolve_request(settings, (image.height, image.width), len(poses))
    extra = {} if on_chunk is None else {"on_chunk": on_chunk, "stream": stream}
    path = Path(output_path)
    mp4 = Mp4Stream(path, fps=settings.fps)
    try:
        extra.update(mp4_only(pipe, mp4))
        first_phase, started = len(pipe.meter.records), time.perf_counter()
        video, notes = generate_noting(pipe, image, prompt, poses, intrinsics, settings, progress=progress, **extra)
        if progress:
            progress("write", 0, 1)
        shape = streamed_shape(mp4) or frames_shape(video)
        record = rollout_record(
            pipe,
            settings,
            resolved,
            producer=producer,
            phases=pipe.meter.records[first_phase:],
            video_shape=shape,
            notes=notes,
            inputs={
                "episode": folder.name,
                "image": image_path.name,
                "image_size": [image.width, image.height],
                "poses": len(poses),
                "prompt": prompt,
            },
            timings={"generate_s": round(time.perf_counter() - started, 3)},
        )
        write_record(path, record)  # the record first: a video never exists without one
        path = mp4.commit() if streamed_shape(mp4) else write_mp4(video, path, fps=settings.fps)
    finally:
        mp4.abort()  # after a failure: nothing half-written (a no-op once committed)
    if progress:
        progress("write", 1, 1)
    return path


def mp4_only(pipe: Pipeline, mp4: Mp4Stream | None = None) -> dict[str, Any]:
    """`generate`'s arguments for a caller that only writes the mp4: a causal pipeline then keeps each chunk as the
    mp4's uint8 frames (`worldgen.video_out.mp4_frames`), not the float32 video (1.67 GB at 349 frames of 464x832),
    and with `mp4` sends them there as they come, holding none (a 4,097-frame live job's are 4.7 GB)."""
    from worldgen.pipelines.fast import FastPipeline

    if not isinstance(pipe, FastPipeline):
        return {}
    return {"keep": mp4_frames} if mp4 is None else {"keep": mp4_frames, "sink": mp4.append}


def streamed_shape(mp4: Mp4Stream) -> tuple[int, int, int] | None:
    """(frames, height, width) of what went into `mp4` chunk by chunk (`mp4_only`), None where nothing did."""
    return None if mp4.frame_shape is None else (mp4.frames, *mp4.frame_shape[:2])


def fp8_self_attention(device: Any, variant: str = "base") -> str:
    """What `--compute fp8` does with the DiT's self-attention on `device`, for the record (the Fast
    model's too: its queries attend to the KV cache's window through the same kernel)."""
    import torch

    from worldgen.kernels import attention, cudnn_attention

    reason = cudnn_attention.fp8_unsupported_reason(torch.device(device))
    if reason is None and attention.FP8_ATTENTION:
        return "fp8 (cuDNN sdpa_fp8, per-tensor scales)"
    return f"bf16 ({reason or 'FP8 attention switched off'})"
