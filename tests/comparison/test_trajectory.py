"""The camera-motion estimator: conventions on exact geometry, accuracy on rendered frames (the
acceptance test: median rotation error below 1 degree), and large errors or reported failures when
the video does not follow the command."""

from __future__ import annotations

import numpy as np
import pytest

from comparison.trajectory import (
    EstimatorConfig,
    commanded_relative_pose,
    direction_error_deg,
    estimate_relative_pose,
    evaluate_trajectory,
    intrinsics_matrix,
    rotation_angle_deg,
    rotation_error_deg,
)
from tests.comparison.conftest import FRAMES, HEIGHT, WIDTH
from tests.comparison.scene import INTRINSICS_480x832, camera_path, render_frames
from tests.room_render import look_at

INTRINSICS = np.tile(INTRINSICS_480x832, (FRAMES, 1))


def project(c2w: np.ndarray, points: np.ndarray, K: np.ndarray) -> np.ndarray:
    w2c = np.linalg.inv(c2w)
    cam = points @ w2c[:3, :3].T + w2c[:3, 3]
    uv = cam @ K.T
    return uv[:, :2] / uv[:, 2:]


def test_intrinsics_rescale_from_the_480x832_convention():
    K = intrinsics_matrix([400.0, 410.0, 416.0, 240.0], 240, 832)
    assert np.allclose(K, [[400.0, 0, 416.0], [0, 205.0, 120.0], [0, 0, 1]])


def test_convention_matches_recover_pose_on_exact_geometry():
    """Project known 3D points into two cameras: the estimate must equal the commanded motion."""
    rng = np.random.default_rng(0)
    c2w_a = look_at((0.0, 0.0, 1.5), (0.3, 3.0, 1.2))
    c2w_b = look_at((0.35, 0.25, 1.55), (-0.4, 3.0, 1.0))
    points = rng.uniform((-2.5, 2.0, 0.0), (2.5, 6.0, 2.8), (300, 3))
    K_a = intrinsics_matrix(INTRINSICS_480x832, 480, 832)
    K_b = intrinsics_matrix(INTRINSICS_480x832 * [1.1, 1.1, 1.0, 1.0], 480, 832)  # per-frame K differs
    uv_a = project(c2w_a, points, K_a) + rng.normal(0, 0.2, (300, 2))
    uv_b = project(c2w_b, points, K_b) + rng.normal(0, 0.2, (300, 2))
    rotation, translation, inliers, reason = estimate_relative_pose(uv_a, uv_b, K_a, K_b, EstimatorConfig())
    assert reason is None and inliers > 250
    cmd_rot, cmd_t = commanded_relative_pose(c2w_a, c2w_b)
    assert rotation_angle_deg(cmd_rot) > 10
    assert rotation_error_deg(rotation, cmd_rot) < 0.1
    assert direction_error_deg(translation, cmd_t) < 1.0
    # and a wrong convention (the inverse motion) would be far off
    assert rotation_error_deg(rotation, cmd_rot.T) > 10


def test_rendered_frames_recover_the_commanded_motion(commanded_poses, rendered):
    """Acceptance: frames with exactly known poses -> median rotation error below 1 degree."""
    result = evaluate_trajectory(rendered, commanded_poses, INTRINSICS)
    summary = result.summary()
    print(f"\nestimator on rendered frames ({result.feature}, {WIDTH}x{HEIGHT}, {FRAMES} frames): {summary}")
    for kind in ("consecutive", "first_to_k"):
        assert summary[kind]["pairs"] == FRAMES - 1 and summary[kind]["failed"] == 0
        assert summary[kind]["rotation_error_deg"]["median"] < 1.0
    assert summary["first_to_k"]["translation_error_deg"]["median"] < 5.0
    assert summary["consecutive"]["translation_error_deg"]["median"] < 10.0
    assert result.first_to_k[-1].commanded_rotation_deg > 15, "the test path really turns"


def test_a_rollout_that_turns_the_other_way_scores_badly(commanded_poses, rendered_mirrored):
    summary = evaluate_trajectory(rendered_mirrored, commanded_poses, INTRINSICS).summary()
    # commanded: +20 degrees of pan over the clip; rendered: -20 -> errors near twice the pan
    assert summary["first_to_k"]["rotation_error_deg"]["median"] > 8.0
    assert summary["consecutive"]["rotation_error_deg"]["median"] > 1.5


def test_noise_fails_visibly_and_no_pair_is_dropped(commanded_poses, rendered):
    rng = np.random.default_rng(3)
    frames = rendered.copy()
    frames[5] = 0  # a black frame: no features at all
    frames[9:] = rng.integers(0, 256, frames[9:].shape, dtype=np.uint8)
    result = evaluate_trajectory(frames, commanded_poses, INTRINSICS)
    assert [(p.i, p.j) for p in result.consecutive] == [(k, k + 1) for k in range(FRAMES - 1)]
    assert [(p.i, p.j) for p in result.first_to_k] == [(0, k) for k in range(1, FRAMES)]
    by_pair = {(p.i, p.j): p for p in result.consecutive + result.first_to_k}
    for pair in [(4, 5), (5, 6), (0, 5)]:
        assert by_pair[pair].status == "failed" and "too few matches" in by_pair[pair].reason
        assert by_pair[pair].rotation_error_deg is None and by_pair[pair].translation_error_deg is None
    noisy_pairs = [p for p in result.consecutive if p.i >= 9]
    assert all(p.status == "failed" or p.rotation_error_deg > 2.0 for p in noisy_pairs)
    assert sum(p.status == "failed" for p in noisy_pairs) >= len(noisy_pairs) // 2
    assert result.summary()["consecutive"]["failed"] >= 2 + len(noisy_pairs) // 2
    assert by_pair[(1, 2)].status == "ok" and by_pair[(1, 2)].rotation_error_deg < 2.0


def test_translation_direction_is_undefined_without_translation():
    eye = np.array([0.0, -0.5, 1.4])
    poses = np.stack([look_at(eye, eye + [np.sin(a), np.cos(a), -0.1]) for a in np.radians([0.0, 4.0, 8.0])])
    frames = render_frames(poses, HEIGHT // 2, WIDTH // 2)
    result = evaluate_trajectory(frames, poses, np.tile(INTRINSICS_480x832, (3, 1)))
    for pair in result.consecutive + result.first_to_k:
        assert pair.commanded_translation == pytest.approx(0.0, abs=1e-12)
        assert pair.translation_error_deg is None
    assert result.summary()["first_to_k"]["translation_error_deg"]["median"] is None


@pytest.mark.slow
def test_rendered_frames_at_the_full_480x832_size():
    """The same acceptance at LingBot's own frame size (slower: rendering dominates)."""
    poses = camera_path(FRAMES)
    frames = render_frames(poses, 480, 832)
    summary = evaluate_trajectory(frames, poses, INTRINSICS).summary()
    print(f"\nestimator on rendered frames (832x480, {FRAMES} frames): {summary}")
    for kind in ("consecutive", "first_to_k"):
        assert summary[kind]["failed"] == 0
        assert summary[kind]["rotation_error_deg"]["median"] < 1.0
    assert summary["first_to_k"]["translation_error_deg"]["median"] < 5.0


def test_same_frames_same_numbers(commanded_poses, rendered):
    """OpenCV's RNG (FLANN trees, RANSAC) is seeded per run: results do not depend on what ran before."""
    first = evaluate_trajectory(rendered[:5], commanded_poses, INTRINSICS).to_dict()
    evaluate_trajectory(rendered[5:9], commanded_poses[5:9], INTRINSICS)  # moves OpenCV's RNG on
    assert evaluate_trajectory(rendered[:5], commanded_poses, INTRINSICS).to_dict() == first
