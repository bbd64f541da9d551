"""Read what the comparison needs from an episode folder (docs/episode-format.md).

The arrays and `episode.json` are read and checked by the one episode reader (`contracts.episode`);
the comparison needs neither the first frame nor the prompt, so both are optional here. The sim
frames are `sim.mp4` or a `frames/` folder of JPEG/PNG images (optional: without them only the
camera-trajectory part runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comparison.video_io import read_frame_folder, read_video
from contracts import episode
from contracts.episode import EpisodeError

__all__ = ["EpisodeError", "EpisodeInput", "read_episode_input"]


@dataclass
class EpisodeInput:
    path: Path
    poses: np.ndarray  # [N, 4, 4] float64 camera-to-world
    intrinsics: np.ndarray  # [N, 4] float64, 480 x 832 convention
    prompt: str
    meta: dict  # episode.json as written (empty without one)
    sim_frames: np.ndarray | None  # uint8 [F, H, W, 3] or None
    sim_source: str | None  # "sim.mp4", "frames/" or None


def read_episode_input(episode_dir: str | Path) -> EpisodeInput:
    """Load and check an episode folder; raises EpisodeError naming the file and the fix."""
    folder = Path(episode_dir)
    if not folder.is_dir():
        raise EpisodeError(f"{folder}: not a folder; pass an episode folder ({episode.LAYOUT})")
    poses, intrinsics = episode.load_action(folder)
    meta = episode.read_meta(folder, len(poses))
    prompt_path = folder / episode.PROMPT_FILE
    prompt = prompt_path.read_text(encoding="utf-8").strip() if prompt_path.is_file() else ""
    named = meta.sim_frames.rstrip("/") if meta and meta.sim_frames else None
    sim_frames, sim_source = None, None
    if (folder / episode.SIM_VIDEO).is_file() and named in (None, episode.SIM_VIDEO):
        sim_frames, _ = read_video(folder / episode.SIM_VIDEO)
        sim_source = episode.SIM_VIDEO
    elif (folder / episode.SIM_FRAMES_DIR).is_dir():
        sim_frames = read_frame_folder(folder / episode.SIM_FRAMES_DIR)
        sim_source = episode.SIM_FRAMES_DIR + "/"
    return EpisodeInput(
        folder,
        poses,
        episode.per_pose(intrinsics, len(poses)),
        prompt,
        meta.to_json(len(poses)) if meta else {},
        sim_frames,
        sim_source,
    )
