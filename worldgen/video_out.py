"""Write a generated video as H.264 mp4 (imageio-ffmpeg), atomically: temp file, then rename."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import torch


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
    # a fresh hidden name that ffmpeg creates itself, so the file gets the process umask (0644 under 022)
    tmp = str(path.with_name(f".{path.stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}.mp4"))
    try:
        # yuv420p needs even sizes; macro_block_size=1 keeps the exact frame size when it is even
        writer = imageio_ffmpeg.write_frames(
            tmp,
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
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
