"""Whole-clip camera fidelity with known answers: the metrics on exact geometry, then pycolmap on frames
rendered along known paths (small frames, few of them; the full size is marked slow).

Acceptance (issue 26): the control reconstructs within the stated tolerances, a rollout at half the
commanded translation gives a fitted scale of 0.5 +- 0.05, a path that pans the other way gives the
RotErr of that rotation, and noise is "not reconstructed" with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from comparison.camera_metrics import anchored_errors, fit_similarity, path_errors, rotation_angle_deg
from comparison.reconstruction import ReconstructionConfig, ReconstructionRun, RegisteredPoses, _pairs
from comparison.sfm_fidelity import evaluate_reconstruction, read_run
from tests.comparison.scene import INTRINSICS_480x832, camera_path, half_translation, render_frames, yaw_ramp
from tests.room_render import look_at

FRAMES = 10
HEIGHT, WIDTH = 144, 256  # small and quick; the intrinsics are rescaled to it
SMALL = ReconstructionConfig(trials=2, max_features=1024, overlap=4)
# Tolerances on perfect frames at 256x144 (measured: ~0.07 deg and ~3 mm per frame)
ROT_ERR_PER_FRAME_DEG = 0.3
TRANS_ERR_PER_FRAME_M = 0.02


def random_similarity(seed: int) -> tuple[float, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    rotation = q * np.sign(np.linalg.det(q))
    return float(rng.uniform(0.2, 5.0)), rotation, rng.normal(size=3)


# ---------------------------------------------------------------- the metrics on exact geometry


def test_similarity_fit_recovers_a_known_transform():
    scale, rotation, translation = random_similarity(1)
    points = np.random.default_rng(2).normal(size=(20, 3))
    fit = fit_similarity(points, scale * points @ rotation.T + translation)
    assert fit.scale == pytest.approx(scale, rel=1e-9)
    assert np.allclose(fit.rotation, rotation, atol=1e-9) and np.allclose(fit.translation, translation, atol=1e-9)
    assert fit_similarity(points[:2], points[:2]) is None  # three points at least
    assert fit_similarity(np.zeros((5, 3)), points[:5]) is None  # no spread: no fit


def test_a_path_in_another_frame_and_scale_has_no_error():
    """A reconstruction is the commanded path up to a similarity: every error is zero, the scale is known."""
    commanded = camera_path(FRAMES)
    scale, rotation, translation = random_similarity(3)
    estimated = commanded.copy()
    estimated[:, :3, :3] = rotation @ commanded[:, :3, :3]
    estimated[:, :3, 3] = scale * commanded[:, :3, 3] @ rotation.T + translation
    errors = path_errors(estimated, commanded, list(range(FRAMES)))
    assert errors.rot_err_deg < 1e-6 and errors.trans_err < 1e-9 and errors.cam_mc < 1e-6
    assert errors.ape_rmse < 1e-9 and errors.rpe_translation_rmse < 1e-9 and errors.rpe_rotation_deg_mean < 1e-6
    assert errors.fit_scale == pytest.approx(1.0 / scale, rel=1e-9)


def test_rot_err_is_the_sum_of_the_pan_difference():
    """The path panned the other way: frame k is turned by 2 x 20 deg x k/(F-1) against the command."""
    commanded, mirrored = camera_path(FRAMES), camera_path(FRAMES, pan=-1.0)
    errors = path_errors(mirrored, commanded, list(range(FRAMES)))
    expected = [40.0 * k / (FRAMES - 1) for k in range(FRAMES)]
    assert np.allclose(errors.rotation_errors_deg, expected, atol=1e-6)
    assert errors.rot_err_deg == pytest.approx(40.0 * FRAMES / 2, abs=1e-5)
    assert errors.per_frame_means()["rot_err_deg_per_frame"] == pytest.approx(20.0, abs=1e-6)


@pytest.mark.parametrize("error_deg", [0.001, 0.005, 0.02])
def test_small_rotation_errors_are_measured_exactly(error_deg):
    """Issue 54: every frame after the first off by a known small angle (about a different axis each
    frame), both paths stored as float32 as poses.npy stores them: RotErr recovers the sum within 1%
    (arccos of the trace read 76 of 80 frames at 0.005 degrees as exactly 0)."""
    frames = 81
    commanded = camera_path(frames)
    axes = np.random.default_rng(5).normal(size=(frames, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    estimated = commanded.copy()
    for k in range(1, frames):  # relative to frame 0: R_rel_est = R_rel_cmd @ E_k, E_k of angle error_deg
        estimated[k, :3, :3] = commanded[k, :3, :3] @ Rotation.from_rotvec(np.radians(error_deg) * axes[k]).as_matrix()
    errors = path_errors(estimated.astype(np.float32), commanded.astype(np.float32), list(range(frames)))
    expected = error_deg * (frames - 1)
    assert errors.rot_err_deg == pytest.approx(expected, rel=0.01)
    assert errors.rotation_errors_deg[0] == 0.0
    assert np.allclose(errors.rotation_errors_deg[1:], error_deg, rtol=0.05)  # no frame reads as 0


def test_anchored_scale_and_distances_of_a_half_speed_path():
    commanded = camera_path(FRAMES)
    distances, total, scale = anchored_errors(half_translation(commanded), commanded)
    centres = commanded[:, :3, 3]
    assert np.allclose(distances, 0.5 * np.linalg.norm(centres - centres[0], axis=1))
    assert total == pytest.approx(sum(distances)) and scale == pytest.approx(0.5, abs=1e-9)


def test_no_translation_leaves_the_translation_metrics_undefined():
    eye = np.array([0.0, -0.5, 1.4])
    poses = np.stack([look_at(eye, eye + [np.sin(a), np.cos(a), -0.1]) for a in np.radians([0, 3, 6, 9])])
    errors = path_errors(poses, poses, [0, 1, 2, 3])
    assert errors.rot_err_deg < 1e-6 and errors.trans_err is None and errors.fit_scale is None
    assert "does not translate" in errors.undefined_reason


# ---------------------------------------------------------------- pycolmap on rendered frames


@pytest.fixture(scope="module")
def half_speed():
    """Sim frames along the commanded path, the rollout along half its translation, reconstructed."""
    commanded = camera_path(FRAMES)
    sim = render_frames(commanded, HEIGHT, WIDTH)
    rollout = render_frames(half_translation(commanded), HEIGHT, WIDTH)
    intrinsics = np.tile(INTRINSICS_480x832, (FRAMES, 1))
    return commanded, evaluate_reconstruction(sim, rollout, commanded, intrinsics, SMALL)


def test_the_control_reconstructs_within_tolerance(half_speed):
    commanded, result = half_speed
    control = result["control"]
    print(f"\ncontrol ({WIDTH}x{HEIGHT}, {FRAMES} frames): {control['summary']}; seconds {result['run']['seconds']}")
    assert control["status"] == "reconstructed" and control["trials_reconstructed"] == SMALL.trials
    assert [t["registered"] for t in control["trials"]] == [FRAMES] * SMALL.trials
    summary = control["summary"]
    assert summary["rot_err_deg_per_frame"]["max"] < ROT_ERR_PER_FRAME_DEG
    assert summary["trans_err_per_frame"]["max"] < TRANS_ERR_PER_FRAME_M
    assert summary["ape_rmse"]["max"] < TRANS_ERR_PER_FRAME_M
    assert summary["rot_err_deg"]["trials"] == SMALL.trials and summary["rot_err_deg"]["std"] >= 0.0
    assert len(control["per_frame"]["rotation_error_deg"]) == FRAMES


def test_half_the_commanded_translation_gives_scale_one_half(half_speed):
    commanded, result = half_speed
    rollout = result["rollout"]
    print(f"\nhalf-speed rollout: {rollout['summary']}")
    assert rollout["status"] == "reconstructed"
    for trial in rollout["trials"]:
        assert trial["registered"] == FRAMES
        assert trial["anchored"]["scale_vs_command"] == pytest.approx(0.5, abs=0.05)
    # its own Sim(3) fit absorbs the size: the path's shape is right ...
    assert rollout["summary"]["trans_err_per_frame"]["max"] < TRANS_ERR_PER_FRAME_M
    # ... and in the sim's metric frame every camera is half its commanded distance short
    centres = commanded[:, :3, 3]
    expected = 0.5 * np.linalg.norm(centres - centres[0], axis=1)
    measured = np.array(rollout["per_frame"]["anchored_translation_error"])
    assert np.abs(measured - expected).max() < 0.05 * np.abs(expected).max() + 0.01


def test_a_path_that_pans_the_other_way_gives_the_expected_rot_err():
    commanded = camera_path(FRAMES)
    rollout = render_frames(camera_path(FRAMES, pan=-1.0), HEIGHT, WIDTH)
    config = ReconstructionConfig(trials=1, max_features=1024, overlap=4)
    result = evaluate_reconstruction(None, rollout, commanded, np.tile(INTRINSICS_480x832, (FRAMES, 1)), config)
    section = result["rollout"]
    assert result["control"] is None and section["status"] == "reconstructed"
    expected = sum(40.0 * k / (FRAMES - 1) for k in range(FRAMES))  # 200 degrees over 10 frames
    measured = section["summary"]["rot_err_deg"]["mean"]
    print(f"\nmirrored pan: RotErr {measured:.2f} deg, expected {expected:.2f}")
    assert measured == pytest.approx(expected, abs=ROT_ERR_PER_FRAME_DEG * FRAMES)
    assert "no sim frames" in section["trials"][0]["anchored"]["reason"]  # no metres without the sim
    assert section["summary"]["scale_vs_command"] is None


@pytest.mark.parametrize("mapper", ["global", "incremental"])
def test_either_mapper_reconstructs_the_same_path(mapper):
    """GLOMAP's global mapper (the default) and COLMAP's incremental one (`--sfm-mapper incremental`) on the
    commanded path: the same tolerances."""
    commanded = camera_path(FRAMES)
    frames = render_frames(commanded, HEIGHT, WIDTH)
    config = ReconstructionConfig(trials=1, max_features=1024, overlap=4, mapper=mapper)
    result = evaluate_reconstruction(None, frames, commanded, np.tile(INTRINSICS_480x832, (FRAMES, 1)), config)
    assert result["run"]["mapper_used"] == [{"rollout": mapper}] and result["status"] == "reconstructed"
    summary = result["rollout"]["summary"]
    assert summary["registered_ratio"]["mean"] == 1.0
    assert summary["rot_err_deg_per_frame"]["mean"] < ROT_ERR_PER_FRAME_DEG
    assert summary["trans_err_per_frame"]["mean"] < TRANS_ERR_PER_FRAME_M


def test_pairs_reach_far_enough_for_a_slow_camera():
    """Neighbours within the overlap, then frames 2^j apart, then frame k of the sim with frame k of the rollout."""
    images = [{"name": f"{s}/{k:05d}.png", "stream": s, "k": k} for s in ("sim", "rollout") for k in range(81)]
    pairs = _pairs(images, ["sim", "rollout"], overlap=10)
    from_first = [b for a, b in pairs if a == "sim/00000.png" and b.startswith("sim/")]
    assert from_first == [f"sim/{k:05d}.png" for k in (*range(1, 11), 16, 32, 64)]
    assert ("sim/00040.png", "rollout/00040.png") in pairs
    assert not any(a.split("/")[0] != b.split("/")[0] and a[-9:] != b[-9:] for a, b in pairs)


@pytest.mark.slow
def test_81_frames_of_a_slow_camera_all_register():
    """81 frames along the path (1.7 cm and 0.25 deg a frame): the neighbours alone gave the incremental
    mapper no first pair with enough parallax at 832x480 (0 of 81 registered); frames 2^j apart do."""
    commanded = camera_path(81)
    frames = render_frames(commanded, HEIGHT, WIDTH)
    config = ReconstructionConfig(trials=1, max_features=1024, mapper="incremental")
    result = evaluate_reconstruction(None, frames, commanded, np.tile(INTRINSICS_480x832, (81, 1)), config)
    summary = result["rollout"]["summary"]
    assert summary["registered_ratio"]["mean"] == 1.0
    assert summary["rot_err_deg_per_frame"]["mean"] < ROT_ERR_PER_FRAME_DEG
    assert summary["trans_err_per_frame"]["mean"] < TRANS_ERR_PER_FRAME_M


@pytest.mark.slow
def test_a_yaw_ramp_sums_to_its_drift_at_full_size():
    """Issue 54: the default recipe (global mapper, SfM at 416 px wide) on 81 frames at 480x832 whose heading
    drifts 0 to 10 degrees: RotErr sums to 405 degrees within 1% (one trial, no sim frames: the quick part). On one
    thread: COLMAP's threads make one trial vary run to run (404.7-405.3 degrees, once 412.1, on a 2-core host), which
    the report's several trials show as their spread; one thread gives the seed's one number (404.79, twice)."""
    commanded = camera_path(81)
    rollout = render_frames(yaw_ramp(commanded, 10.0), 480, 832)
    config = ReconstructionConfig(trials=1, threads=1)
    result = evaluate_reconstruction(None, rollout, commanded.astype(np.float32),
                                     np.tile(INTRINSICS_480x832, (81, 1)), config)  # fmt: skip
    summary = result["rollout"]["summary"]
    print(f"\nyaw ramp, 81 frames: RotErr {summary['rot_err_deg']['mean']:.2f} deg; {result['run']['seconds']}")
    assert result["run"]["frame_size"] == [240, 416] and result["run"]["mapper_used"] == [{"rollout": "global"}]
    assert summary["registered_ratio"]["mean"] == 1.0
    assert summary["rot_err_deg"]["mean"] == pytest.approx(10.0 * 81 / 2, rel=0.01)


def test_noise_is_not_reconstructed_and_says_why():
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    commanded = camera_path(FRAMES)
    config = ReconstructionConfig(trials=1, max_features=1024, overlap=4)
    result = evaluate_reconstruction(None, noise, commanded, np.tile(INTRINSICS_480x832, (FRAMES, 1)), config)
    section = result["rollout"]
    assert result["status"] == section["status"] == "not reconstructed"
    assert "geometric verification" in section["reason"] and "noise" in section["reason"]
    assert section["summary"] == {} and section["trials"][0]["registered"] == 0


def test_the_time_limit_is_kept_and_reported():
    frames = render_frames(camera_path(4), 64, 112)
    config = ReconstructionConfig(trials=1, timeout_s=0.05)
    result = evaluate_reconstruction(None, frames, camera_path(4), np.tile(INTRINSICS_480x832, (4, 1)), config)
    assert result["run"]["timed_out"] and result["seconds"] < 30
    assert result["rollout"]["status"] == "not reconstructed" and "time limit" in result["rollout"]["reason"]


def test_trials_a_time_limit_cut_off_are_said_and_the_finished_one_is_kept():
    """A run stopped after 1 of 3 trials (as `_collect` reads it back): that trial's numbers, and a note."""
    commanded = camera_path(FRAMES)
    scale, rotation, shift = random_similarity(3)
    model = commanded.copy()  # the map's own frame: the commanded cameras under a similarity
    model[:, :3, :3] = rotation @ commanded[:, :3, :3]
    model[:, :3, 3] = scale * commanded[:, :3, 3] @ rotation.T + shift
    registered = RegisteredPoses(0, dict(enumerate(model)))
    config = ReconstructionConfig(trials=3, timeout_s=60.0)
    run = ReconstructionRun(config, (HEIGHT, WIDTH), {}, trials=[{"control": {"sim": registered},
                            "joint": {"sim": registered, "rollout": registered}}], timed_out=True)  # fmt: skip
    result = read_run(run, commanded, FRAMES, with_sim=True)
    assert result["notes"] == ["time limit (60 s) reached: 1 of 3 trials finished"]
    assert result["status"] == "reconstructed" and result["control"]["trials_reconstructed"] == 1
    (trial,) = result["rollout"]["trials"]
    assert trial["registered"] == FRAMES and trial["anchored"]["scale_vs_command"] == pytest.approx(1.0)
    assert result["rollout"]["summary"]["rot_err_deg_per_frame"]["max"] < 1e-6


@pytest.mark.slow
def test_the_control_at_the_full_480x832_size():
    """The same acceptance at LingBot's frame size, 17 frames (slow: rendering and SIFT at full size)."""
    commanded = camera_path(17)
    sim = render_frames(commanded, 480, 832)
    rollout = render_frames(half_translation(commanded), 480, 832)
    result = evaluate_reconstruction(sim, rollout, commanded, np.tile(INTRINSICS_480x832, (17, 1)),
                                     ReconstructionConfig(trials=1, timeout_s=3600))  # fmt: skip
    print(f"\n832x480, 17 frames: control {result['control']['summary']}; rollout {result['rollout']['summary']}")
    assert result["control"]["summary"]["rot_err_deg_per_frame"]["max"] < 0.1
    assert result["control"]["summary"]["trans_err_per_frame"]["max"] < 0.01
    assert result["rollout"]["summary"]["scale_vs_command"]["mean"] == pytest.approx(0.5, abs=0.02)


def test_rotation_angle_is_in_degrees():
    assert rotation_angle_deg(look_at((0, 0, 0), (0, 1, 0)).T[:3, :3] @ look_at((0, 0, 0), (1, 1, 0))[:3, :3]) == (
        pytest.approx(45.0)
    )
