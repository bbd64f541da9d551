"""Videos and frame folders as uint8 RGB arrays [F, H, W, 3].

mp4 files are read and written by the project's one video module (`contracts.video`: H.264
yuv420p, faststart, atomic, odd sizes padded by an edge row or column); this module adds folders
of PNG/JPEG frames (OpenCV), the other form an episode's sim frames take.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from contracts.video import DEFAULT_FPS, VideoError
from contracts.video import read_mp4 as read_video
from contracts.video import write_mp4 as write_video

__all__ = ["DEFAULT_FPS", "FRAME_SUFFIXES", "VideoError", "read_frame_folder", "read_video", "write_video"]

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
