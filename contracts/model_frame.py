"""The model frame: LingBot-World's intrinsics are expressed for a 480x832 (H x W) frame.

Whatever the real image size, `intrinsics.npy` holds fx, fy, cx, cy in pixels of this frame (the
model's training resolution), and generation sizes are written "H*W". Defined here once.
"""

from __future__ import annotations

import numpy as np

MODEL_HEIGHT = 480
MODEL_WIDTH = 832
MODEL_FRAME = (MODEL_HEIGHT, MODEL_WIDTH)  # (H, W)
MODEL_SIZE = f"{MODEL_HEIGHT}*{MODEL_WIDTH}"  # the frame as a generation size string
MIN_SIDE = 16  # a size smaller than this on either side is refused


class SizeError(ValueError):
    """A size string that is not "H*W" with both sides >= MIN_SIDE."""


def parse_size(text: str, where: str = "size") -> tuple[int, int]:
    """ "480*832" (or "480x832") -> (480, 832): height, width."""
    if not isinstance(text, str):
        raise SizeError(f"{where} must be a string like {MODEL_SIZE!r} (H*W), got {text!r}")
    try:
        height, width = (int(v) for v in text.lower().replace("x", "*").split("*"))
    except ValueError:
        raise SizeError(f"{where} must look like {MODEL_SIZE!r} (H*W), got {text!r}") from None
    if height < MIN_SIDE or width < MIN_SIDE:
        raise SizeError(f"{where} {text!r} is too small: both sides must be >= {MIN_SIDE}")
    return height, width


def format_size(height: int, width: int) -> str:
    return f"{int(height)}*{int(width)}"


def to_model_intrinsics(intrinsics, height: int, width: int) -> np.ndarray:
    """fx, fy, cx, cy in pixels of a height x width image -> pixels of the model frame."""
    scale = np.array([MODEL_WIDTH / width, MODEL_HEIGHT / height] * 2)
    return np.asarray(intrinsics, dtype=np.float64) * scale


def from_model_intrinsics(intrinsics, height: int, width: int) -> np.ndarray:
    """Inverse of `to_model_intrinsics`: model-frame pixels -> pixels of height x width."""
    scale = np.array([width / MODEL_WIDTH, height / MODEL_HEIGHT] * 2)
    return np.asarray(intrinsics, dtype=np.float64) * scale
