"""Chunk c's conditioning of a Fast rollout, made as the chunk loop asks for it: its y, encoded as the
loop goes (`FastPipeline` with `stream_encode`), and its camera (`FastCamera`). Their own module: the
encoder's bookkeeping and the camera's rays are concerns apart from the loop."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from worldgen.pipelines.base import Pipeline, Progress, condition_mask
from worldgen.pipelines.camera import plucker_embedding, relative_poses, resample_poses, scale_intrinsics
from worldgen.pipelines.conditioning_video import ImageThenBlack
from worldgen.pipelines.fast_plan import FastFrames
from worldgen.runtime.cuda_memory import free_device_memory


class ChunkConditioning:
    """y [20, chunk_frames, lat_h, lat_w] of chunk c, encoded as the loop goes (`StreamingEncoder`:
    the same latents as encoding the whole video at once): chunk 0 encodes its own 4(n-1)+1 frames,
    chunk 1 encodes every remaining frame and frees the encoder's caches, so the first preview waits
    for 9 frames' encoding instead of the whole video's and the loop does not carry the caches.
    `whole_first` (a live job) goes on encoding at chunk 0, the same pushes in the same order, while chunk 0's
    poses are on their way: the loop asks before it waits for them, and a later chunk that carries the rest
    delays that chunk (at 320x576, 152 frames took 0.5 s of chunk 1, lag a live view never made up;
    docs/benchmarks.md, "Session 25: Fast"). It stops at the first push after `ready()` says they are all
    there (a live camera's `LiveCamera.ready`): LingBot-World 2.0's whole conditioning at 480x832 took 1.17 s in
    the float32 VAE, longer than its chunk 0's 14 poses take to come at 16 a second, and chunk 0 started late
    ("Session 30"); chunk 1 then encodes what is left. Without `ready`, every frame at chunk 0. The black tail
    past the encoder's settling needs no VAE (`conditioning_video.ImageThenBlack`)."""

    def __init__(
        self,
        pipe: Pipeline,
        image: torch.Tensor,
        frames: int,
        chunk_frames: int,
        clock,
        progress: Progress,
        whole_first: bool = False,
        ready: Callable[[int], bool] | None = None,
    ):
        self.pipe, self.clock, self.progress = pipe, clock, progress
        self.image, self.frames, self.n, self.whole_first = image, frames, chunk_frames, whole_first
        self.ready = ready  # ready(0): chunk 0's poses are all there (a live job)
        _, _, h, w = image.shape
        self.mask = condition_mask(frames, h // 8, w // 8)
        self.latents: list[torch.Tensor] = []
        self.video: ImageThenBlack | None = None
        self.encoded = 0  # frames of the conditioning video pushed so far

    def _encode(self, count: int) -> None:
        """Push the conditioning video's next `count` frames (the image, then black)."""
        settled = self.video.settled
        self.latents.append(self.video.push(count)[0])
        self.encoded += count
        if self.video.settled and not settled:  # the encoder's caches went: hand their memory back
            free_device_memory(self.pipe.device)

    def _encode_rest(self, stop: Callable[[], bool] | None) -> None:
        """Push the frames not pushed yet, a chunk's at a time, until `stop()` (not once the rest needs no VAE);
        the encoder's caches go once all are."""
        while self.encoded < self.frames and not (stop is not None and not self.video.settled and stop()):
            self._encode(min(4 * self.n, self.frames - self.encoded))
        if self.encoded >= self.frames and self.video.encoder is not None:
            self.video.close()  # its caches go now, before the KV cache grows
            free_device_memory(self.pipe.device)

    def __call__(self, c: int) -> torch.Tensor:
        n = self.n
        if c == 0 or (c == 1 and self.encoded < self.frames):
            self.clock.lap("dit")
            # no meter phase here: it would reset the CUDA peak of the loop it runs inside
            self.progress("encode", c, 2)
            if c == 0:
                vae = self.pipe.residency.use("vae")
                self.video = ImageThenBlack(vae, self.image, self.pipe.encode_tile_pixels, self.pipe.device)
                self._encode(4 * (n - 1) + 1)
                if self.whole_first:
                    self._encode_rest(None if self.ready is None else lambda: self.ready(0))
            else:
                self._encode_rest(None)
            self.progress("encode", 2 if self.encoded >= self.frames else c + 1, 2)
            self.clock.lap("encode")
        latent = torch.cat(self.latents, dim=1)
        frames = slice(c * n, (c + 1) * n)
        return torch.cat([self.mask[:, frames], latent[:, frames]])


class FastCamera:
    """A batch job's Plücker camera, made chunk by chunk as the loop asks for it: chunk c's
    [1, 384, n, height/8, width/8] (`fast_camera`'s frames of chunk c, bit for bit: each frame's rays are
    its own). Made whole up front, the clip's rays held up the first chunk (~0.2 s on the lent H100's
    host, ~1 s on a 2-core machine); chunk by chunk they are made while the GPU runs the previous chunk."""

    def __init__(
        self,
        poses: np.ndarray,
        intrinsics: np.ndarray,
        frames: FastFrames,
        height: int,
        width: int,
        chunk_frames: int,
        translation_scale: float | None = None,
    ):
        resampled = resample_poses(poses[: frames.pose_frames], frames.latent_frames)
        self.relative = relative_poses(resampled, translation_scale)
        self.K = scale_intrinsics(torch.from_numpy(intrinsics[:1]), height, width)[0]
        self.height, self.width, self.chunk_frames = height, width, chunk_frames

    def __call__(self, chunk: int) -> torch.Tensor:
        frames = self.relative[chunk * self.chunk_frames : (chunk + 1) * self.chunk_frames]
        return plucker_embedding(frames, self.K, self.height, self.width)


def fast_camera(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    frames: FastFrames,
    height: int,
    width: int,
    translation_scale: float | None = None,
) -> torch.Tensor:
    """Plücker [1, 384, lat_f, height/8, width/8]: the poses of `pose_frames` resampled to lat_f."""
    return FastCamera(poses, intrinsics, frames, height, width, frames.latent_frames, translation_scale)(0)
