"""A generated video tensor as the project's mp4 (the format and the writer: contracts.video)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from contracts import video as contracts_video

FRAMES_AT_ONCE = 8  # frames converted together: the float temporaries stay small


def uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8 on the CPU. On the CPU a few frames at a time (at 161 frames of
    464x832 each float temporary of the whole video is 0.7 GiB, and a whole-video expression held three at once); from
    a GPU one frame at a time, each copied into page-locked memory as it is made: the device holds no more than one
    frame's temporaries (a 16-frame 464x832 chunk's are 74 MB of float32, beside a tight budget's KV cache and DiT),
    and the copy moves a quarter of the float32 bytes (9.7 ms a chunk on the H200, against 18-24 ms converting on its
    host's 16 cores after a float32 copy; docs/benchmarks.md, "Session 34"). The same bytes either way: a clamp, an add and a multiply in
    float32 (each exact to IEEE rounding, one kernel each), round half to even. Frames already so ([F, H, W, 3] uint8)
    are returned as they are."""
    if video.dtype == torch.uint8:
        return video
    channels, frames, height, width = video.shape
    if video.device.type == "cuda":
        out = torch.empty((frames, height, width, channels), dtype=torch.uint8, pin_memory=True)
        for i in range(frames):
            frame = video[:, i].clamp(-1, 1).float()  # a copy (clamping is exact in any dtype): changed in place below
            pixels = frame.add_(1.0).mul_(127.5).round_().to(torch.uint8).permute(1, 2, 0).contiguous()
            out[i].copy_(pixels, non_blocking=True)  # ordered on this stream before its blocks are used again
        torch.cuda.current_stream(video.device).synchronize()
        return out
    out = torch.empty((frames, height, width, channels), dtype=torch.uint8)
    for start in range(0, frames, FRAMES_AT_ONCE):
        part = video[:, start : start + FRAMES_AT_ONCE].float().clamp(-1, 1)  # a copy: changed in place below
        out[start : start + FRAMES_AT_ONCE] = part.add_(1.0).mul_(127.5).round_().to(torch.uint8).permute(1, 2, 3, 0)
    return out


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """`uint8_frames` as an array (what the mp4 writer takes)."""
    return uint8_frames(video).cpu().numpy()


def mp4_frames(piece: torch.Tensor) -> torch.Tensor:
    """A decoded chunk [3, f, H, W] in [-1, 1] as the mp4 takes it, [f, H, W, 3] uint8, where the chunk is: what a
    Fast rollout keeps of each chunk for a caller that only writes the video (`FastPipeline.generate(keep=
    mp4_frames)`), made on the GPU as it is copied to the host (a quarter of the bytes to copy, no host work)."""
    return uint8_frames(piece)


def frames_shape(video: torch.Tensor | np.ndarray) -> tuple[int, int, int]:
    """(frames, height, width) of a video [3, F, H, W] in [-1, 1] or of uint8 frames [F, H, W, 3]."""
    return tuple(video.shape[:3]) if video.dtype in (np.uint8, torch.uint8) else tuple(video.shape[1:])


def write_mp4(
    video: torch.Tensor | np.ndarray, path: Path | str, fps: int = contracts_video.DEFAULT_FPS, quick: bool = False
) -> Path:
    """Video tensor [3,F,H,W] in [-1,1] (or uint8 frames [F,H,W,3], an array or a tensor) -> the project's mp4
    (contracts.video; `quick`: a chunk someone waits for)."""
    if isinstance(video, torch.Tensor) and video.dtype == torch.uint8:
        video = video.numpy()
    frames = video if isinstance(video, np.ndarray) else to_uint8_frames(video)
    return contracts_video.write_mp4(path, frames, fps=fps, quick=quick)
