"""A recorded camera trajectory, from any source, and how it becomes an episode folder.

Every source (the live recorder, a USD stage, an Isaac Sim or Isaac Lab HDF5 file) produces a
`CameraRecording`: sim time stamps, OpenCV camera-to-world poses in metres and pinhole
intrinsics in pixels of the recording's resolution. `write_recording_episode` resamples it to
16 fps / 4n+1 frames and writes the episode folder. A recording that holds the camera's own
frames (the live recorder with `keep_frames`, an Isaac Lab demo's image term) gets them as the
episode's sim frames, the recorded frame nearest each episode time (`frames_at_times`): the one
way every source turns its frames into what `lingbot-isaac compare` reads.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contracts.episode import EpisodeError, EpisodeMeta, write_episode
from lingbot_isaac.resample import (
    EPISODE_FPS,
    RecordingGapWarning,
    ResampleError,
    find_gaps,
    gap_message,
    resample_trajectory,
)


class FrameReader:
    """Frames kept on disk until an episode needs them: `read(indices)` returns those frames."""

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, indices: Sequence[int]) -> list[np.ndarray]:
        raise NotImplementedError


@dataclass
class CameraRecording:
    """A camera sampled at sim times; `resolution` is (H, W) of `intrinsics` and of `first_frame`."""

    times: np.ndarray  # [N] seconds of sim time
    poses: np.ndarray  # [N, 4, 4] OpenCV camera-to-world, metres
    intrinsics: np.ndarray  # [N, 4] fx, fy, cx, cy in pixels of `resolution`
    resolution: tuple[int, int]
    camera_prim: str | None = None
    meters_per_unit: float = 1.0  # of the stage the poses came from (poses are already in metres)
    source: str | None = None
    scene_id: str | None = None
    robot_id: str | None = None
    first_frame: np.ndarray | None = None  # uint8 RGB [H, W, 3] when the source has one
    # The camera's frames, one per entry of `times` (uint8 RGB [H, W, 3]): a list, or a reader with
    # `__len__` and `read(indices) -> frames` that loads only the frames an episode uses (HDF5).
    frames: Sequence[np.ndarray] | FrameReader | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.times)
        if np.shape(self.poses) != (n, 4, 4) or np.shape(self.intrinsics) != (n, 4):
            raise EpisodeError(
                f"{self.source or 'recording'}: need times [N], poses [N,4,4], intrinsics [N,4]; got "
                f"{np.shape(self.times)}, {np.shape(self.poses)}, {np.shape(self.intrinsics)}"
            )
        if self.frames is not None and len(self.frames) != n:
            raise EpisodeError(f"{self.source or 'recording'}: {len(self.frames)} frames for {n} recorded steps")


def nearest_samples(times: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Index of the sample time nearest to each target time (frames are picked, never interpolated)."""
    times = np.asarray(times, dtype=np.float64)
    count = len(times)
    nearest = np.clip(np.searchsorted(times, targets), 0, count - 1)
    previous = np.clip(nearest - 1, 0, count - 1)
    closer = np.abs(times[previous] - targets) < np.abs(times[nearest] - targets)
    return np.where(closer, previous, nearest)


def frames_at_times(recording: CameraRecording, targets: np.ndarray) -> list[np.ndarray] | None:
    """The recording's frame nearest to each episode time (None: the recording has no frames)."""
    frames = recording.frames
    if frames is None:
        return None
    indices = [int(i) for i in nearest_samples(recording.times, targets)]
    if isinstance(frames, FrameReader):
        return frames.read(indices)
    return [frames[i] for i in indices]


def write_recording_episode(
    recording: CameraRecording,
    directory: os.PathLike | str,
    prompt: str,
    image: Any = None,
    fps: float = EPISODE_FPS,
    max_frames: int | None = None,
    generation: dict[str, Any] | None = None,
    sim_frames: Any = None,
    overwrite: bool = False,
) -> Path:
    """Resample `recording` to `fps` and 4n+1 frames and write it as an episode folder.

    `image` (the first frame) defaults to `recording.first_frame`. Its size must be the
    recording's resolution. `sim_frames`, if given, must already match the resampled frames; by
    default they are the recording's own frames at the episode times (`frames_at_times`).
    """
    if image is None:
        image = recording.first_frame
    if image is None:
        raise EpisodeError(
            f"{recording.source or 'recording'}: has no first frame; give the first frame's image "
            "(e.g. `--image first_frame.png`)"
        )
    gaps = find_gaps(recording.times, fps)
    if gaps:
        warnings.warn(f"{recording.source or 'recording'}: {gap_message(gaps, fps)}", RecordingGapWarning, stacklevel=2)
    try:
        resampled = resample_trajectory(recording.times, recording.poses, recording.intrinsics, fps, max_frames)
    except ResampleError as exc:
        raise EpisodeError(f"{recording.source or 'recording'}: {exc}") from None
    if sim_frames is None:
        sim_frames = frames_at_times(recording, resampled.times)
    meta = EpisodeMeta(
        source_resolution=recording.resolution,
        fps=float(fps),
        meters_per_unit=float(recording.meters_per_unit),
        camera_prim=recording.camera_prim,
        sim_times=[float(t) for t in resampled.times],
        scene_id=recording.scene_id,
        robot_id=recording.robot_id,
        source=recording.source,
        generation=generation,
        extra=dict(recording.extra),
    )
    return write_episode(
        directory,
        resampled.poses,
        resampled.intrinsics,
        image,
        prompt,
        meta,
        sim_frames=sim_frames,
        overwrite=overwrite,
    )
