"""Compose the side-by-side frames: sim | world model | difference, each with a label bar.

The world-model frame is already resized to the sim resolution by the caller. The difference
panel is the per-pixel mean absolute RGB difference, scaled by `DIFF_GAIN` and coloured with
OpenCV's inferno map (black = equal, yellow = far apart), so small drifts stay visible.
"""

from __future__ import annotations

import cv2
import numpy as np

GAP = 4
DIFF_GAIN = 4.0


def difference_image(sim: np.ndarray, model: np.ndarray, gain: float = DIFF_GAIN) -> np.ndarray:
    """Colour-mapped |sim - model| (mean over RGB, times `gain`), uint8 RGB of the same size."""
    diff = np.abs(sim.astype(np.int16) - model.astype(np.int16)).mean(axis=2)
    scaled = np.clip(diff * gain, 0, 255).astype(np.uint8)
    return cv2.cvtColor(cv2.applyColorMap(scaled, cv2.COLORMAP_INFERNO), cv2.COLOR_BGR2RGB)


def label_height(width: int) -> int:
    """Height of the label bar above a panel `width` pixels wide (the text grows with the panel)."""
    return max(20, round(width * 0.045))


def _labelled(panel: np.ndarray, text: str) -> np.ndarray:
    height = label_height(panel.shape[1])
    bar = np.full((height, panel.shape[1], 3), 24, np.uint8)
    scale = height / 50
    thickness = 2 if height >= 36 else 1
    cv2.putText(
        bar,
        text,
        (max(4, height // 4), height - height // 3),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        (235, 235, 235),
        thickness,
        cv2.LINE_AA,
    )
    return np.concatenate([bar, panel], axis=0)


def compose_frame(sim: np.ndarray | None, model: np.ndarray, index: int) -> np.ndarray:
    """One side-by-side frame; with no sim frame only the world-model panel is shown."""
    if sim is None:
        return _labelled(model, f"world model  frame {index}")
    if sim.shape != model.shape:
        raise ValueError(f"sim frame {sim.shape} and world-model frame {model.shape} differ; resize first")
    panels = [
        _labelled(sim, f"sim  frame {index}"),
        _labelled(model, "world model"),
        _labelled(difference_image(sim, model), f"|difference| x{DIFF_GAIN:g}"),
    ]
    gap = np.full((panels[0].shape[0], GAP, 3), 255, np.uint8)
    return np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=1)


def compose_video(sim_frames: np.ndarray | None, model_frames: np.ndarray) -> np.ndarray:
    """Side-by-side frames [F, H + label, 3W + gaps, 3] over the common frames."""
    count = len(model_frames) if sim_frames is None else min(len(sim_frames), len(model_frames))
    return np.stack(
        [compose_frame(None if sim_frames is None else sim_frames[k], model_frames[k], k) for k in range(count)]
    )
