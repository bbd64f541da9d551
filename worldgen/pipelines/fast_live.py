"""A live Fast rollout: the camera path arrives pose by pose while the video is made, chunk by chunk.

LingBot-World-Fast is causal: chunk k's denoising reads the first frame, the prompt, the KV cache of
chunks < k and chunk k's own camera. What a batch job (`FastPipeline.generate` with every pose)
takes from the *whole* path, and what a live job does instead:

1. The noise and the re-noising draws: drawn from the seed for the job's planned length
   (`settings.frame_num`), in the batch job's order. A live job plans its length up front (its frame
   limit), so its draws are the batch job's draws for that length, bit for bit.
2. Where each latent frame samples the camera path (`fast_plan.fast_frames`, `camera.resample_poses`):
   latent frame j sits at pose index t_j = j * (P - 1) / (L - 1), P the poses the planned length
   spans, L its latent frames (t_j = 4 j when the planned length is whole chunks: 12 m - 3 frames,
   e.g. 33, 57, 81). The interpolation is local (linear translation, slerp rotation between the two
   poses around t_j), so chunk k needs the poses up to ceil(t_{last latent frame of chunk k}) only:
   12 k + 9 poses for whole-chunk lengths (9, 21, 33 ...).
3. The translation scale (`camera.relative_poses`): every frame-to-frame translation is divided by
   one scale, fixed for the whole job so that the same motion is rendered at the same speed in every
   chunk. Given (`settings.translation_scale`, e.g. from the robot's top speed), a live job and a batch
   job use it alike. Not given, a batch job takes the largest step over the WHOLE path (so its chunk 0
   already depends on the last pose); a live job cannot know that and takes the largest step of its
   first chunk that moves, then holds it (`LiveCamera.scale`; a path standing still before it has zero
   translations, which no scale changes).

So the live video equals the batch video of the same poses and settings (same frames, same seed) bit
for bit when both are given the same `translation_scale`, or when neither is and the path's largest
latent step lies in its first chunk that moves (a path that starts at its top speed); otherwise a
later, faster step is rendered faster than the first chunk's (above 1 in the model's units), where the
batch job would have slowed the whole video down to it. A live job that ends early (fewer poses than
planned) is the first chunks of the batch video.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from worldgen.errors import InputError
from worldgen.pipelines.camera import (
    TEMPORAL_STRIDE,
    plucker_embedding,
    relative_poses,
    resample_poses_at,
    scale_intrinsics,
    validate_action,
)
from worldgen.pipelines.fast_plan import FastFrames, fast_frames

# wait_poses(count): block until at least `count` poses are held, then return every pose held so far
# ([N, 4, 4], N >= count); None when the job ended with fewer (no more will come). It may raise to stop
# the job (a cancel).
WaitPoses = Callable[[int], "np.ndarray | None"]


def live_frames(frame_num: int, chunk_frames: int = 3) -> FastFrames:
    """The planned frames of a live job of `frame_num` frames (as a batch job with enough poses)."""
    return fast_frames(frame_num, None, chunk_frames)


def latent_pose_index(frames: FastFrames) -> np.ndarray:
    """t_j: where latent frame j samples the camera path (float64, as `camera.resample_poses` places it)."""
    return np.linspace(0, frames.pose_frames - 1, frames.latent_frames)


def poses_needed(frames: FastFrames, chunk: int, chunk_frames: int = 3) -> int:
    """Poses chunk `chunk` waits for: up to the one at or after its last latent frame's t_j."""
    last = latent_pose_index(frames)[(chunk + 1) * chunk_frames - 1]
    return min(frames.pose_frames, math.ceil(last - 1e-9) + 1)


def live_chunk_camera(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    frames: FastFrames,
    chunk: int,
    height: int,
    width: int,
    chunk_frames: int = 3,
    scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunk `chunk`'s Plücker camera [1, 384, chunk_frames, height/8, width/8] from the poses held
    (at least `poses_needed`): the batch job's resampling, translations divided by the job's `scale`
    (None: by the largest step of chunks 0..`chunk`, what `LiveCamera` holds from the first moving chunk)."""
    c2w = _chunk_c2w(poses, frames, chunk, chunk_frames)
    end = (chunk + 1) * chunk_frames
    relative = relative_poses(c2w, scale)[end - chunk_frames : end]
    K = scale_intrinsics(torch.from_numpy(np.asarray(intrinsics[:1], dtype=np.float32)), height, width)[0]
    return plucker_embedding(relative, K, height, width)


def _chunk_c2w(poses: np.ndarray, frames: FastFrames, chunk: int, chunk_frames: int) -> torch.Tensor:
    """The latent frames of chunks 0..`chunk`, resampled from the poses held (at least `poses_needed`)."""
    need = poses_needed(frames, chunk, chunk_frames)
    if len(poses) < need:
        raise InputError(f"chunk {chunk} needs {need} poses; {len(poses)} held")
    end = (chunk + 1) * chunk_frames
    return resample_poses_at(poses[:need], latent_pose_index(frames)[:end])


def largest_step(poses: np.ndarray, frames: FastFrames, chunk: int, chunk_frames: int = 3) -> torch.Tensor:
    """The largest latent step of chunks 0..`chunk` (float32 scalar, 0 when they stand still): the
    scale a batch job of those poses alone divides by, and the one a live job holds."""
    translations = relative_poses(_chunk_c2w(poses, frames, chunk, chunk_frames), 1.0)[:, :3, 3]
    return torch.norm(translations, dim=-1).max()


class LiveCamera:
    """`FastPipeline.generate(camera=...)`: chunk c's camera once its poses are held (`wait_poses`),
    None once the job ended before them. Records when each chunk's poses were all there."""

    def __init__(
        self,
        wait_poses: WaitPoses,
        intrinsics: np.ndarray,
        frames: FastFrames,
        height: int,
        width: int,
        chunk_frames: int = 3,
        on_start: Callable[[int, int], None] | None = None,
        translation_scale: float | None = None,
        held: Callable[[], int] | None = None,
    ) -> None:
        self.wait_poses, self.frames = wait_poses, frames
        self.held = held  # how many poses are there now, without waiting (`ready`)
        self.height, self.width, self.chunk_frames = height, width, chunk_frames
        self.on_start = on_start  # (chunk, poses it was made from): it starts now
        # the job's one translation scale: given, or the first moving chunk's largest step once it comes
        self.scale: float | torch.Tensor | None = translation_scale
        # the intrinsics are checked once, with a stand-in pose (the poses are checked as they come)
        _, self.intrinsics = validate_action(
            np.tile(np.eye(4, dtype=np.float32), (5, 1, 1)), np.asarray(intrinsics)[:1], source="live job"
        )
        self.lock = threading.Lock()

    def ready(self, chunk: int) -> bool:
        """Whether chunk `chunk`'s poses are all there now (False when nothing says how many are: `held`)."""
        return self.held is not None and self.held() >= poses_needed(self.frames, chunk, self.chunk_frames)

    def __call__(self, chunk: int) -> torch.Tensor | None:
        need = poses_needed(self.frames, chunk, self.chunk_frames)
        poses = self.wait_poses(need)
        if poses is None or len(poses) < need:
            if chunk == 0:  # nothing to show: the job's bad input, not an empty video
                raise InputError(f"the live job ended before the {need} poses its first chunk needs came")
            return None
        poses = np.asarray(poses[:need], dtype=np.float32)
        if not np.isfinite(poses).all():
            raise InputError(f"live job: poses before {need} are not finite")
        if self.on_start is not None:
            self.on_start(chunk, need)
        if self.scale is None:
            step = largest_step(poses, self.frames, chunk, self.chunk_frames)
            if step > 0:  # before the camera moves no scale applies (zero steps); from then on, this one
                self.scale = step
        return live_chunk_camera(
            poses, self.intrinsics, self.frames, chunk, self.height, self.width, self.chunk_frames, self.scale
        )


def batch_video_frames(poses_held: int, frame_num: int, chunk_frames: int = 3) -> int:
    """Video frames a live job of planned `frame_num` makes from `poses_held` poses in all (whole
    chunks whose poses came): 0 when not even the first chunk's."""
    frames = live_frames(frame_num, chunk_frames)
    chunks = 0
    while chunks < frames.latent_frames // chunk_frames and poses_needed(frames, chunks, chunk_frames) <= poses_held:
        chunks += 1
    return 0 if chunks == 0 else (chunks * chunk_frames - 1) * TEMPORAL_STRIDE + 1
