"""Read what the comparison needs from an episode folder (docs/episode-format.md).

Read directly with numpy/OpenCV rather than through `lingbot_isaac.episode`, so the comparison
runs anywhere the `compare` extra is installed and only checks what it uses:
`poses.npy` [N, 4, 4] OpenCV camera-to-world, `intrinsics.npy` [N, 4] fx, fy, cx, cy for a
480 x 832 frame, optional `prompt.txt`, optional `episode.json` (its `sim_frames` field says where
the sim frames are), and the sim frames as `sim.mp4` or a `frames/` folder of JPEG/PNG images
(optional: without them only the camera-trajectory part runs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comparison.video_io import read_frame_folder, read_video


class EpisodeError(ValueError):
    """An episode folder that is missing a file or holds one of the wrong shape."""


@dataclass
class EpisodeInput:
    path: Path
    poses: np.ndarray  # [N, 4, 4] float64 camera-to-world
    intrinsics: np.ndarray  # [N, 4] float64, 480 x 832 convention
    prompt: str
    meta: dict
    sim_frames: np.ndarray | None  # uint8 [F, H, W, 3] or None
    sim_source: str | None  # "sim.mp4", "frames/" or None


def _load_array(path: Path, expected: str) -> np.ndarray:
    if not path.is_file():
        raise EpisodeError(f"{path}: missing; an episode folder needs {expected}")
    try:
        return np.load(path, allow_pickle=False).astype(np.float64)
    except (ValueError, OSError) as exc:
        raise EpisodeError(f"{path}: not a readable .npy array ({exc}); expected {expected}") from exc


def read_episode_input(episode_dir: str | Path) -> EpisodeInput:
    """Load and check an episode folder; raises EpisodeError naming the file and the fix."""
    folder = Path(episode_dir)
    if not folder.is_dir():
        raise EpisodeError(f"{folder}: not a folder; pass an episode folder (poses.npy, intrinsics.npy, ...)")
    poses = _load_array(folder / "poses.npy", "poses.npy [N, 4, 4] camera-to-world matrices")
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or len(poses) == 0:
        raise EpisodeError(f"{folder / 'poses.npy'}: shape {poses.shape}, expected [N, 4, 4] camera-to-world")
    if not np.all(np.isfinite(poses)):
        raise EpisodeError(f"{folder / 'poses.npy'}: holds NaN or inf values")
    intrinsics = _load_array(folder / "intrinsics.npy", "intrinsics.npy [N, 4] fx, fy, cx, cy")
    if intrinsics.ndim == 1 and intrinsics.shape == (4,):
        intrinsics = np.tile(intrinsics, (len(poses), 1))
    if intrinsics.ndim != 2 or intrinsics.shape[1] != 4 or len(intrinsics) < len(poses):
        raise EpisodeError(
            f"{folder / 'intrinsics.npy'}: shape {intrinsics.shape}, expected [N, 4] fx, fy, cx, cy "
            f"with N = {len(poses)} (one row per pose)"
        )
    if not np.all(np.isfinite(intrinsics)) or np.any(intrinsics[:, :2] <= 0):
        raise EpisodeError(f"{folder / 'intrinsics.npy'}: focal lengths must be positive and finite")
    meta: dict = {}
    meta_path = folder / "episode.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise EpisodeError(f"{meta_path}: not valid JSON ({exc})") from exc
    prompt_path = folder / "prompt.txt"
    prompt = prompt_path.read_text().strip() if prompt_path.is_file() else ""
    sim_frames, sim_source = None, None
    named = meta.get("sim_frames")  # "sim.mp4", "frames" or null in episode.json
    if named not in (None, "sim.mp4", "frames", "frames/"):
        raise EpisodeError(f"{meta_path}: sim_frames is {named!r}; expected \"sim.mp4\", \"frames\" or null")
    if named == "sim.mp4" and not (folder / "sim.mp4").is_file():
        raise EpisodeError(f"{meta_path}: says sim_frames \"sim.mp4\" but {folder / 'sim.mp4'} is missing")
    if named in ("frames", "frames/") and not (folder / "frames").is_dir():
        raise EpisodeError(f"{meta_path}: says sim_frames \"frames\" but {folder / 'frames'} is missing")
    if (folder / "sim.mp4").is_file() and named in (None, "sim.mp4"):
        sim_frames, _ = read_video(folder / "sim.mp4")
        sim_source = "sim.mp4"
    elif (folder / "frames").is_dir():
        sim_frames = read_frame_folder(folder / "frames")
        sim_source = "frames/"
    return EpisodeInput(folder, poses, intrinsics[: len(poses)], prompt, meta, sim_frames, sim_source)
