"""Resample a camera trajectory from any sim rate to the episode rate (16 fps) and 4n+1 frames.

LingBot-World generates 4n+1 frames at 16 fps, one pose per frame. Sims step at 60 Hz, 120 Hz or
irregularly, so the recorded samples are interpolated at t0 + k/fps: translations linearly,
rotations by slerp (scipy's `Slerp`), intrinsics linearly (a zoom is a smooth change). Samples
missing in the middle (`find_gaps`) are interpolated across as well; the caller warns about them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation, Slerp

EPISODE_FPS = 16
MIN_FRAMES = 5  # one latent step beyond the first frame


# A step this many times the recording's usual one is a gap (dropped samples), when it also
# spans more than one episode frame (so at least one episode frame is interpolated across it).
GAP_STEPS = 4


class ResampleError(ValueError):
    """The samples cannot be resampled (too few, unordered, not finite)."""


class RecordingGapWarning(UserWarning):
    """Samples are missing in the middle of a recording; the camera is interpolated across the gap."""


@dataclass(frozen=True)
class Gap:
    start: float  # seconds: the last sample before the gap
    end: float  # the first sample after it
    missing: int  # samples missing at the recording's usual step


def find_gaps(times: np.ndarray, fps: float = EPISODE_FPS) -> list[Gap]:
    """Steps longer than GAP_STEPS usual steps (the median) and longer than one episode frame."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) < 3:
        return []
    steps = np.diff(times)
    usual = float(np.median(steps))
    if usual <= 0:
        return []
    wide = np.flatnonzero((steps > GAP_STEPS * usual) & (steps > 1.0 / fps))
    return [Gap(float(times[i]), float(times[i + 1]), int(round(steps[i] / usual)) - 1) for i in wide]


def gap_message(gaps: list[Gap], fps: float = EPISODE_FPS) -> str:
    """One line naming the longest gap (and how many there are)."""
    longest = max(gaps, key=lambda g: g.end - g.start)
    span = longest.end - longest.start
    others = f" ({len(gaps) - 1} more gap(s) besides)" if len(gaps) > 1 else ""
    return (
        f"no camera samples for {span:.3f} s between {longest.start:.3f} s and {longest.end:.3f} s of the "
        f"recording (~{longest.missing} samples missing){others}: the ~{int(span * fps)} episode frame(s) "
        "there are interpolated across the gap, not recorded; record without dropped frames if the camera "
        "moved then"
    )


@dataclass(frozen=True)
class Trajectory:
    times: np.ndarray  # [N] seconds
    poses: np.ndarray  # [N, 4, 4] camera-to-world
    intrinsics: np.ndarray  # [N, 4]


def frames_4n1(count: int) -> int:
    """The largest 4n+1 that is <= count (count >= 1)."""
    if count < 1:
        raise ResampleError(f"need at least one frame (got {count})")
    return (count - 1) // 4 * 4 + 1


def resample_trajectory(
    times: np.ndarray,
    poses: np.ndarray,
    intrinsics: np.ndarray,
    fps: float = EPISODE_FPS,
    max_frames: int | None = None,
) -> Trajectory:
    """Interpolate samples at `times` (seconds, increasing) onto t0 + k/fps, k < 4n+1 frames.

    The frame count is the largest 4n+1 that fits in the recorded duration (and in `max_frames`).
    """
    times = np.asarray(times, dtype=np.float64)
    poses = np.asarray(poses, dtype=np.float64)
    intrinsics = np.asarray(intrinsics, dtype=np.float64)
    n = times.shape[0]
    if poses.shape != (n, 4, 4) or intrinsics.shape != (n, 4):
        raise ResampleError(
            f"need times [N], poses [N,4,4], intrinsics [N,4]; got {times.shape}, {poses.shape}, {intrinsics.shape}"
        )
    if n < 2:
        raise ResampleError(f"need at least 2 samples to resample (got {n}); record for longer")
    if not (np.all(np.isfinite(times)) and np.all(np.isfinite(poses)) and np.all(np.isfinite(intrinsics))):
        raise ResampleError("times, poses and intrinsics must be finite")
    if np.any(np.diff(times) <= 0):
        raise ResampleError("sample times must be strictly increasing (drop repeated sim steps first)")
    if fps <= 0:
        raise ResampleError(f"fps must be > 0 (got {fps})")

    duration = times[-1] - times[0]
    # A tiny tolerance so that 961 samples at exactly 1/16 s give 961 frames despite float sums.
    count = int(np.floor(duration * fps + 1e-6)) + 1
    if max_frames is not None:
        count = min(count, max_frames)
    count = frames_4n1(count)
    if count < MIN_FRAMES:
        raise ResampleError(
            f"the recording spans {duration:.3f} s: {count} frame(s) at {fps:g} fps; record at least "
            f"{(MIN_FRAMES - 1) / fps:.3f} s for {MIN_FRAMES} frames"
        )
    new_times = times[0] + np.arange(count) / fps
    new_times[-1] = min(new_times[-1], times[-1])  # never extrapolate past the last sample
    return interpolate_at(times, poses, intrinsics, new_times)


def interpolate_at(times: np.ndarray, poses: np.ndarray, intrinsics: np.ndarray, new_times: np.ndarray) -> Trajectory:
    """Checked samples (`resample_trajectory`) interpolated at `new_times`, within times[0]..times[-1].
    Each target reads only the samples around it, so a prefix of the samples gives the same values for
    the targets it spans (a live stream: `lingbot_isaac.live_stream`)."""
    n, count = len(times), len(new_times)
    rotations = Rotation.from_matrix(poses[:, :3, :3])
    new_rotations = Slerp(times, rotations)(new_times).as_matrix()
    new_translations = np.stack([np.interp(new_times, times, poses[:, i, 3]) for i in range(3)], axis=1)
    new_intrinsics = np.stack([np.interp(new_times, times, intrinsics[:, i]) for i in range(4)], axis=1)
    new_poses = np.tile(np.eye(4), (count, 1, 1))
    new_poses[:, :3, :3] = new_rotations
    new_poses[:, :3, 3] = new_translations
    # Where a target time hits a sample exactly, keep the sample bit-for-bit (no slerp round-off).
    exact = np.searchsorted(times, new_times)
    exact = np.minimum(exact, n - 1)
    hit = times[exact] == new_times
    new_poses[hit] = poses[exact[hit]]
    new_intrinsics[hit] = intrinsics[exact[hit]]
    return Trajectory(times=new_times, poses=new_poses, intrinsics=new_intrinsics)
