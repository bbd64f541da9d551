"""The engine's own rules on a job, applied at the server's door so that what the server accepts
can run: the frame and size rules (`contracts.generation_request`, the very functions the engine
applies, in its words) and what this server's engine said it cannot run (`compute = "fp8"` where
the workers' devices have no FP8 tensor cores: the reason a worker reports in its `ready`), and the
episode's pose minimum for generation (`contracts.episode.GENERATE_MIN_POSES`). Batch (`submit`) and
live (`live`, then each `poses` batch through `contracts.episode.check_poses`) jobs pass the same
rules with the same codes: nothing the worker would refuse reaches it.

`gpus = 2` on a server that cannot give a job two GPUs (two workers for model base, one worker on two
GPUs for a causal model) is the pool's to say (`bridge.workers.worker_pool.WorkerPool.refusal`).
"""

from __future__ import annotations

import numpy as np

from bridge.wire.protocol import ProtocolError
from contracts import episode
from contracts.episode import EpisodeError, image_hw
from contracts.errors import InputError
from contracts.generation_request import resolve_request
from contracts.settings import GenerationSettings


def check_first_frame(settings: GenerationSettings, image: bytes, where: str) -> tuple[int, int]:
    """The rules a batch and a live job share, before any pose: the first frame decodes (`bad_input`),
    and the settings on their own give a video of it (`bad_settings`: frame_num below the model's
    minimum, a size too small for the image). Returns the image's (height, width)."""
    try:
        hw = image_hw(image, where)
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None
    try:
        resolve_request(settings, hw, None)  # the settings on their own (frame_num, size)
    except InputError as exc:
        raise ProtocolError(f"settings: {exc}", "bad_settings") from None
    return hw


def check_engine_rules(settings: GenerationSettings, image: bytes, poses: np.ndarray, intrinsics: np.ndarray) -> None:
    """Raise ProtocolError unless the engine can make a video of these settings from this image and
    these poses: `bad_settings` for frames or size the settings alone rule out, `bad_input` for an
    image that cannot be decoded or poses too few for any video."""
    hw = check_first_frame(settings, image, "submit image")
    try:
        # the engine reads the episode with generation's minimum (worldgen.pipelines.camera)
        episode.check_action(poses, intrinsics, min_poses=episode.GENERATE_MIN_POSES,
                             poses_name="poses (poses.npy)", intrinsics_name="intrinsics (intrinsics.npy)")  # fmt: skip
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None
    try:
        resolve_request(settings, hw, len(poses))  # ... and with what the poses cover
    except InputError as exc:
        raise ProtocolError(str(exc), "bad_input") from None


def check_compute(settings: GenerationSettings, fp8_unsupported: str | None) -> None:
    """`compute = "fp8"` where a worker said why it cannot run it: ProtocolError `bad_settings`."""
    if settings.compute == "fp8" and fp8_unsupported:
        raise ProtocolError(f"settings: compute fp8 cannot run on this server: {fp8_unsupported}", "bad_settings")
