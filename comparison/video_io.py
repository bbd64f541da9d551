"""Read and write videos as uint8 RGB arrays [F, H, W, 3] with imageio-ffmpeg.

Writes are H.264 in yuv420p (plays in every browser), 16 fps by default (LingBot's output rate),
and atomic: the mp4 is written to a temporary file beside the target and renamed, so a reader
never sees half a video. yuv420p needs even sizes, so odd frames are padded by one edge row or
column rather than rescaled.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import imageio_ffmpeg
import numpy as np

from contracts import atomic

DEFAULT_FPS = 16


class VideoError(ValueError):
    """A video file or frame folder that cannot be read, or frames that cannot be written."""


def read_video(path: str | Path) -> tuple[np.ndarray, float]:
    """Decode every frame of `path`; returns (frames uint8 [F, H, W, 3] RGB, fps)."""
    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such video file")
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        meta = next(reader)
        width, height = meta["size"]
        frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    except (RuntimeError, OSError, StopIteration) as exc:
        # ffmpeg's message is its whole banner; its last line says what went wrong.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(exc).__name__
        raise VideoError(f"{path}: cannot decode video ({reason}); expected an mp4 video file") from exc
    if not frames:
        raise VideoError(f"{path}: the video has no frames")
    return np.stack(frames), float(meta.get("fps") or DEFAULT_FPS)


FRAME_SUFFIXES = (".png", ".jpg", ".jpeg")


def read_frame_folder(folder: str | Path) -> np.ndarray:
    """Read the PNG/JPEG frames of `folder` in name order (zero-padded names sort right) -> [F, H, W, 3]."""
    folder = Path(folder)
    found = folder.glob("*") if folder.is_dir() else []
    paths = sorted(path for path in found if path.suffix.lower() in FRAME_SUFFIXES)
    if not paths:
        raise VideoError(f"{folder}: no PNG or JPEG frames in the folder")
    frames = []
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise VideoError(f"{path}: cannot read the image frame")
        frames.append(cv2.cvtColor(image, cv2.COLOR_BGR2RGB))
    shapes = {frame.shape for frame in frames}
    if len(shapes) != 1:
        raise VideoError(f"{folder}: frames differ in size {sorted(shapes)}; all frames must be one size")
    return np.stack(frames)


def pad_to_even(frame: np.ndarray) -> np.ndarray:
    """Replicate the last row/column where a side is odd (H.264 yuv420p needs even sizes)."""
    height, width = frame.shape[:2]
    return np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def write_video(
    path: str | Path, frames: np.ndarray | list[np.ndarray], fps: float = DEFAULT_FPS, quality: float = 8
) -> Path:
    """Write uint8 RGB frames [F, H, W, 3] to an H.264 yuv420p mp4 atomically; returns the path."""
    path = Path(path)
    frames = [np.asarray(frame) for frame in frames]
    if not frames:
        raise VideoError(f"{path}: no frames to write")
    first = frames[0]
    if first.ndim != 3 or first.shape[2] != 3 or first.dtype != np.uint8:
        raise VideoError(f"{path}: frames must be uint8 [H, W, 3] RGB, got {first.dtype} {first.shape}")
    if any(frame.shape != first.shape for frame in frames):
        raise VideoError(f"{path}: all frames must have the shape {first.shape}")
    height, width = pad_to_even(first).shape[:2]
    with atomic.atomic_path(path) as tmp:
        writer = imageio_ffmpeg.write_frames(
            str(tmp),
            (width, height),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=quality,
            macro_block_size=1,
            output_params=["-movflags", "+faststart"],
        )
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(pad_to_even(frame)))
        writer.close()
    return path
