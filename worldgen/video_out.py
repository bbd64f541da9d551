"""Write a generated video as H.264 mp4 (imageio-ffmpeg), atomically: temp file, then rename."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from contracts import atomic


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    frames = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().numpy()


def write_mp4(video: torch.Tensor | np.ndarray, path: Path | str, fps: int = 16) -> Path:
    """Video tensor [3,F,H,W] in [-1,1] (or uint8 frames [F,H,W,3]) -> H.264 yuv420p mp4."""
    import imageio_ffmpeg  # only the writer needs it (a GPU box may lack it)

    frames = video if isinstance(video, np.ndarray) else to_uint8_frames(video)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames.shape[1:3]
    with atomic.atomic_path(path) as tmp:  # temp beside it, fsync, rename, fsync the folder
        # yuv420p needs even sizes; macro_block_size=1 keeps the exact frame size when it is even
        writer = imageio_ffmpeg.write_frames(
            str(tmp),
            (w, h),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=1,
            output_params=["-crf", "18"],
            quality=None,
        )
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
        writer.close()
    return path
