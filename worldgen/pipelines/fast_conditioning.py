"""Chunk c's conditioning of a Fast rollout, made as the chunk loop asks for it: its y, encoded as the
loop goes (`FastPipeline` with `stream_encode`), and its camera (`FastCamera`). Their own module: the
encoder's bookkeeping and the camera's rays are concerns apart from the loop."""

from __future__ import annotations

import numpy as np
import torch

from worldgen.models.vae_tiling import StreamingEncoder
from worldgen.pipelines.base import Pipeline, Progress, condition_mask
from worldgen.pipelines.camera import plucker_embedding, relative_poses, resample_poses, scale_intrinsics
from worldgen.pipelines.fast_plan import FastFrames
from worldgen.runtime.cuda_memory import free_device_memory


class ChunkConditioning:
    """y [20, chunk_frames, lat_h, lat_w] of chunk c, encoded as the loop goes (`StreamingEncoder`:
    the same latents as encoding the whole video at once): chunk 0 encodes its own 4(n-1)+1 frames,
    chunk 1 encodes every remaining frame and frees the encoder's caches, so the first preview waits
    for 9 frames' encoding instead of the whole video's and the loop does not carry the caches.
    `whole_first` (a live job) encodes every frame at chunk 0, the same pushes in the same order: the
    loop asks before it waits for chunk 0's poses, which take longer to come (9 poses at 16/s) than the
    encode takes, and no later chunk carries the rest (at 320x576, 152 frames took 0.5 s of chunk 1,
    lag a live view never made up; docs/benchmarks.md, "Session 25: Fast")."""

    def __init__(
        self,
        pipe: Pipeline,
        image: torch.Tensor,
        frames: int,
        chunk_frames: int,
        clock,
        progress: Progress,
        whole_first: bool = False,
    ):
        self.pipe, self.clock, self.progress = pipe, clock, progress
        self.image, self.frames, self.n, self.whole_first = image, frames, chunk_frames, whole_first
        _, _, h, w = image.shape
        self.mask = condition_mask(frames, h // 8, w // 8)
        self.latents: list[torch.Tensor] = []
        self.encoder: StreamingEncoder | None = None

    def _encode(self, first: int, count: int) -> None:
        """Push frames [first, first + count) of the conditioning video (the image, then black)."""
        device = self.pipe.device
        video = torch.zeros(1, 3, count, *self.image.shape[-2:], device=device)
        if first == 0:
            video[0, :, :1] = self.image.to(device)
        self.latents.append(self.encoder.push(video)[0].float().cpu())

    def __call__(self, c: int) -> torch.Tensor:
        n = self.n
        if c == 0 or (c == 1 and self.encoder is not None):
            self.clock.lap("dit")
            # no meter phase here: it would reset the CUDA peak of the loop it runs inside
            self.progress("encode", c, 2)
            if c == 0:
                vae = self.pipe.residency.use("vae")
                self.encoder = StreamingEncoder(vae, self.pipe.encode_tile_pixels)
                self._encode(0, 4 * (n - 1) + 1)
            if c == 1 or self.whole_first:
                step = 4 * n
                for first in range(4 * (n - 1) + 1, self.frames, step):
                    self._encode(first, min(step, self.frames - first))
                self.encoder = None  # its caches go now, before the KV cache grows
                free_device_memory(self.pipe.device)
            self.progress("encode", 2 if self.whole_first else c + 1, 2)
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
