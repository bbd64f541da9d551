"""Resampling a sim-rate trajectory to 16 fps and 4n+1 frames (lerp + slerp)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from lingbot_isaac.resample import ResampleError, frames_4n1, resample_trajectory


def pose_at(t: np.ndarray) -> np.ndarray:
    """A camera turning at 40 deg/s about a tilted axis while moving on a line."""
    axis = np.array([0.2, -0.3, 0.93]) / np.linalg.norm([0.2, -0.3, 0.93])
    poses = np.tile(np.eye(4), (len(t), 1, 1))
    poses[:, :3, :3] = Rotation.from_rotvec(np.radians(40) * t[:, None] * axis).as_matrix()
    poses[:, :3, 3] = np.array([0.5, 1.0, -0.2]) * t[:, None] + [1, 2, 3]
    return poses


def test_60hz_to_16fps_is_exact_for_constant_rate_motion():
    t = np.arange(121) / 60  # 2 s at 60 Hz
    k = np.tile([500.0, 500.0, 416.0, 240.0], (121, 1))
    k[:, 0] += t * 10  # a slow zoom
    out = resample_trajectory(t, pose_at(t), k)
    assert len(out.times) == 33  # 2 s * 16 + 1 = 33 = 4*8 + 1
    np.testing.assert_allclose(out.times, np.arange(33) / 16)
    np.testing.assert_allclose(out.poses, pose_at(out.times), atol=1e-12)
    np.testing.assert_allclose(out.intrinsics[:, 0], 500 + out.times * 10)


def test_irregular_steps_and_4n1_truncation():
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.uniform(0.005, 0.03, size=120))
    t -= t[0]
    out = resample_trajectory(t, pose_at(t), np.tile([1.0, 1, 0, 0], (120, 1)))
    count = int(np.floor(t[-1] * 16 + 1e-6)) + 1
    assert len(out.times) == frames_4n1(count) and (len(out.times) - 1) % 4 == 0
    assert out.times[-1] <= t[-1]
    np.testing.assert_allclose(out.poses[:, :3, 3], pose_at(out.times)[:, :3, 3], atol=1e-12)
    # Slerp between irregular samples of a constant-rate rotation about a fixed axis is exact.
    np.testing.assert_allclose(out.poses[:, :3, :3], pose_at(out.times)[:, :3, :3], atol=1e-9)
    capped = resample_trajectory(t, pose_at(t), np.tile([1.0, 1, 0, 0], (120, 1)), max_frames=11)
    assert len(capped.times) == 9


def test_samples_at_target_times_are_kept_bit_for_bit():
    t = np.arange(17) / 16
    poses = pose_at(t).astype(np.float32).astype(np.float64)
    out = resample_trajectory(t, poses, np.tile([1.0, 1, 0, 0], (17, 1)))
    assert np.array_equal(out.poses, poses)


def test_slerp_takes_the_short_way_round():
    t = np.array([0.0, 1.0])
    poses = np.tile(np.eye(4), (2, 1, 1))
    poses[0, :3, :3] = Rotation.from_euler("z", 170, degrees=True).as_matrix()
    poses[1, :3, :3] = Rotation.from_euler("z", -170, degrees=True).as_matrix()
    out = resample_trajectory(t, poses, np.tile([1.0, 1, 0, 0], (2, 1)))
    yaw = Rotation.from_matrix(out.poses[8, :3, :3]).as_euler("zyx", degrees=True)[0]
    assert abs(abs(yaw) - 180) < 1e-9  # halfway is 180 deg, not 0 deg


@pytest.mark.parametrize(
    "times,match",
    [
        (np.array([0.0]), "at least 2 samples"),
        (np.array([0.0, 0.1]), "record at least"),
        (np.array([0.0, 1.0, 0.5]), "strictly increasing"),
        (np.array([0.0, np.nan, 1.0]), "finite"),
    ],
)
def test_bad_samples(times, match):
    n = len(times)
    with pytest.raises(ResampleError, match=match):
        resample_trajectory(times, np.tile(np.eye(4), (n, 1, 1)), np.tile([1.0, 1, 0, 0], (n, 1)))
