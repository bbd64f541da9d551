"""Episodes with exactly known camera poses, rendered by the project's own room renderer."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from comparison.trajectory import intrinsics_matrix
from comparison.video_io import write_video
from contracts.episode import EpisodeMeta
from tests.room_render import look_at, render_room

# fx, fy, cx, cy for a 480 x 832 frame (the LingBot convention); fx != fy on purpose.
INTRINSICS_480x832 = np.array([430.0, 440.0, 420.0, 236.0])


def camera_path(count: int, pan: float = 1.0) -> np.ndarray:
    """[count, 4, 4] camera-to-world: walk forward and sideways while panning about 20 degrees.

    `pan=-1` mirrors the pan (the camera turns the other way): a "rollout" that did not follow
    the command.
    """
    poses = []
    for k in range(count):
        s = k / max(count - 1, 1)
        eye = np.array([-0.3 + 0.6 * s, -0.9 + 1.2 * s, 1.4 + 0.08 * np.sin(3.0 * s)])
        yaw = np.radians(pan * 20.0 * s)
        forward = np.array([np.sin(yaw), np.cos(yaw), -0.12])
        poses.append(look_at(eye, eye + forward))
    return np.stack(poses)


def half_translation(poses: np.ndarray) -> np.ndarray:
    """The same rotations, every camera centre half as far from the first: a model moving at half speed."""
    half = poses.copy()
    half[:, :3, 3] = poses[0, :3, 3] + 0.5 * (poses[:, :3, 3] - poses[0, :3, 3])
    return half


def yaw_ramp(poses: np.ndarray, total_deg: float) -> np.ndarray:
    """Every camera turned about the world's up axis (z) by total_deg x k / (F - 1) at frame k, the centres
    unchanged: a model that drifts in heading. Frame k's RotErr is that angle; summed, total_deg x F / 2."""
    out = poses.copy()
    for k in range(len(poses)):
        angle = np.radians(total_deg * k / max(len(poses) - 1, 1))
        cos, sin = np.cos(angle), np.sin(angle)
        out[k, :3, :3] = np.array([[cos, -sin, 0.0], [sin, cos, 0.0], [0.0, 0.0, 1.0]]) @ poses[k, :3, :3]
    return out


def render_frames(poses: np.ndarray, height: int, width: int) -> np.ndarray:
    K = intrinsics_matrix(INTRINSICS_480x832, height, width)
    intrinsics = (K[0, 0], K[1, 1], K[0, 2], K[1, 2])
    return np.stack([render_room(pose, intrinsics, height, width) for pose in poses])


def write_episode(folder: Path, poses: np.ndarray, sim_frames: np.ndarray | None, frames_as: str = "mp4") -> Path:
    """An episode folder as docs/episode-format.md lays it out (written directly: test data)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "poses.npy", poses.astype(np.float32))
    np.save(folder / "intrinsics.npy", np.tile(INTRINSICS_480x832, (len(poses), 1)).astype(np.float32))
    (folder / "prompt.txt").write_text("a textured room with boxes; the camera walks and pans right")
    resolution = sim_frames.shape[1:3] if sim_frames is not None else (480, 832)
    meta = EpisodeMeta(source_resolution=tuple(resolution), fps=16, source="room_render test scene")
    (folder / "episode.json").write_text(json.dumps(meta.to_json(len(poses))))
    if sim_frames is not None:
        cv2.imwrite(str(folder / "image.jpg"), cv2.cvtColor(sim_frames[0], cv2.COLOR_RGB2BGR))
        if frames_as == "mp4":
            write_video(folder / "sim.mp4", sim_frames)
        else:
            (folder / "frames").mkdir(exist_ok=True)
            for k, frame in enumerate(sim_frames):
                cv2.imwrite(str(folder / "frames" / f"{k:05d}.png"), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    return folder
