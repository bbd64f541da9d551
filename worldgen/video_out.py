"""A generated video tensor as the project's mp4 (the format and the writer: contracts.video)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from contracts import video as contracts_video


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    frames = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().numpy()


def write_mp4(video: torch.Tensor | np.ndarray, path: Path | str, fps: int = contracts_video.DEFAULT_FPS) -> Path:
    """Video tensor [3,F,H,W] in [-1,1] (or uint8 frames [F,H,W,3]) -> the project's mp4 (contracts.video)."""
    frames = video if isinstance(video, np.ndarray) else to_uint8_frames(video)
    return contracts_video.write_mp4(path, frames, fps=fps)
