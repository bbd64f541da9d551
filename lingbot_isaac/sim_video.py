"""Sim frames -> an H.264 mp4 (yuv420p, plays everywhere) through imageio-ffmpeg.

imageio-ffmpeg is optional on the Isaac side (`pip install imageio-ffmpeg`): without it the
recorder keeps sim frames as a folder of JPEGs instead (`episode.write_episode` does that).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from contracts import atomic


def have_mp4_writer() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def write_mp4(path: os.PathLike | str, frames: Iterable[np.ndarray], fps: float = 16, crf: int = 20) -> Path:
    """Encode uint8 RGB frames [H, W, 3] (even H and W) to `path`, atomically."""
    import imageio_ffmpeg

    path = Path(path)
    frames = iter(frames)
    first = np.asarray(next(frames))
    height, width = first.shape[:2]
    if first.dtype != np.uint8 or first.ndim != 3 or first.shape[2] != 3 or height % 2 or width % 2:
        raise ValueError(f"frames must be uint8 RGB [H, W, 3] with even H and W (got {first.dtype} {first.shape})")
    with atomic.atomic_path(path) as partial:
        writer = imageio_ffmpeg.write_frames(
            str(partial),
            (width, height),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=1,
            output_params=["-crf", str(crf), "-preset", "medium", "-movflags", "+faststart"],
        )
        try:
            writer.send(None)  # start ffmpeg
            writer.send(np.ascontiguousarray(first))
            for frame in frames:
                frame = np.asarray(frame)
                if frame.shape != first.shape or frame.dtype != np.uint8:
                    raise ValueError(f"frame of shape {frame.shape} {frame.dtype} after frames of {first.shape}")
                writer.send(np.ascontiguousarray(frame))
        finally:
            writer.close()
    return path


def read_mp4(path: os.PathLike | str) -> np.ndarray:
    """Decode an mp4 to uint8 RGB frames [F, H, W, 3]."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    width, height = meta["size"]
    frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames)
