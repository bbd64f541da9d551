"""Camera conditioning (resampling, relative poses, Plücker rays) against the reference's golden files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.worldgen.golden import golden_cases
from tests.worldgen.numerics import rel_l2
from worldgen.errors import InputError
from worldgen.pipelines.camera import (
    CameraCondition,
    camera_conditioning,
    frames_for_poses,
    load_action,
    relative_poses,
    resample_poses,
)

TAGS = [f"ex{example}_{size}" for example in ("00", "01", "02") for size in ("f81_32x48", "f33_48x64", "f161_16x32")]
TOLERANCE = 1e-5  # relative L2, the golden README's camera tolerance


@pytest.fixture(scope="module")
def camera_golden(golden):
    return golden_cases(golden / "camera")


def test_golden_cases_are_the_ones_tested(camera_golden):
    cases, _ = camera_golden
    assert sorted(cases) == sorted(TAGS)


@pytest.mark.parametrize("tag", TAGS)
def test_matches_golden(camera_golden, lingbot_examples, tag):
    cases, tensors = camera_golden
    case = cases[tag]
    poses, intrinsics = load_action(lingbot_examples / case["example"])
    cond = camera_conditioning(poses, intrinsics, case["frame_num_requested"], case["height"], case["width"])

    assert isinstance(cond, CameraCondition)
    assert cond.frame_num == case["frame_num_used"]
    latent_frames = (cond.frame_num - 1) // 4 + 1
    assert cond.relative_poses.shape == (latent_frames, 4, 4)
    assert cond.plucker.shape == (1, 384, latent_frames, case["height"] // 8, case["width"] // 8)
    for name in ("relative_poses", "K", "plucker"):
        got, want = getattr(cond, name), tensors[f"{tag}_{name}"]
        assert got.dtype == torch.float32
        assert got.shape == want.shape
        assert rel_l2(got, want) <= TOLERANCE, f"{name}: rel-L2 {rel_l2(got, want):.3g}"


def test_pipeline_golden_plucker(golden, lingbot_examples):
    case = json.loads((golden / "pipeline" / "case.json").read_text())
    poses, intrinsics = load_action(lingbot_examples / "00")
    cond = camera_conditioning(poses, intrinsics, case["frame_num"], case["height"], case["width"])
    want = load_file(golden / "pipeline" / "io.safetensors")["plucker"]
    assert rel_l2(cond.plucker, want) <= TOLERANCE


def test_float64_relative_poses_would_miss_example_02(camera_golden, lingbot_examples):
    """Why the float32 order matters: translations in the thousands lose digits differently."""
    _, tensors = camera_golden
    poses, _ = load_action(lingbot_examples / "02")
    c2w = resample_poses(poses[:81], 21)
    want = tensors["ex02_f81_32x48_relative_poses"]
    assert rel_l2(relative_poses(c2w), want) <= TOLERANCE
    assert rel_l2(relative_poses(c2w.double()), want) > 10 * TOLERANCE


def test_conditioning_geometry(lingbot_examples):
    poses, intrinsics = load_action(lingbot_examples / "01")
    cond = camera_conditioning(poses, intrinsics, 33, 48, 64)
    rel = cond.relative_poses
    assert torch.equal(rel[0], torch.eye(4))
    norms = rel[:, :3, 3].norm(dim=-1)
    assert norms.max().item() == pytest.approx(1.0, abs=1e-6)
    rays = cond.plucker[0].reshape(6, 8, 8, 9, 6, 8)  # (c, row, col, f, lat_h, lat_w)
    origin, direction = rays[:3], rays[3:]
    assert torch.allclose(direction.norm(dim=0), torch.ones(()), atol=1e-6)
    # The origin of every ray of latent frame i is that frame's (relative) camera position.
    assert torch.equal(origin[:, 0, 0, :, 0, 0].T, rel[:, :3, 3])
    # Pixel (row 0, col 0) of frame 0 (identity pose) looks along ((0.5-cx)/fx, (0.5-cy)/fy, 1).
    fx, fy, cx, cy = cond.K.tolist()
    d = torch.tensor([(0.5 - cx) / fx, (0.5 - cy) / fy, 1.0])
    assert torch.allclose(direction[:, 0, 0, 0, 0, 0], d / d.norm(), atol=1e-6)
    # K scaled from 480x832 to 48x64.
    assert cond.K.tolist() == pytest.approx(
        [
            intrinsics[0, 0] * 64 / 832,
            intrinsics[0, 1] * 48 / 480,
            intrinsics[0, 2] * 64 / 832,
            intrinsics[0, 3] * 48 / 480,
        ],
        rel=1e-6,
    )


def test_static_camera_is_not_normalised():
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 9, axis=0)
    cond = camera_conditioning(poses, np.array([500.0, 500.0, 416.0, 240.0]), 9, 16, 16)
    assert torch.equal(cond.relative_poses, torch.eye(4).repeat(3, 1, 1))
    assert torch.isfinite(cond.plucker).all()


def test_frames_for_poses():
    assert frames_for_poses(81, 961) == 81
    assert frames_for_poses(161, 561) == 161
    assert frames_for_poses(161, 100) == 97  # cut to what 100 poses cover: ((100-1)//4)*4+1
    assert frames_for_poses(81, 5) == 5
    with pytest.warns(UserWarning, match=r"frame_num 80 is not 4n\+1; using 77 frames"):
        assert frames_for_poses(80, 961) == 77
    with pytest.raises(InputError, match="frame_num"):
        frames_for_poses(0, 961)


def test_conditioning_uses_the_frames_the_poses_cover(lingbot_examples):
    poses, intrinsics = load_action(lingbot_examples / "00")
    with pytest.warns(UserWarning, match="frame_num 20"):
        cond = camera_conditioning(poses[:30], intrinsics[:30], 20, 16, 32)
    assert cond.frame_num == 17
    assert cond.plucker.shape == (1, 384, 5, 2, 4)
    cond = camera_conditioning(poses[:30], intrinsics[:30], 81, 16, 32)
    assert cond.frame_num == 29
    assert cond.relative_poses.shape == (8, 4, 4)


def test_size_must_be_a_multiple_of_8(lingbot_examples):
    poses, intrinsics = load_action(lingbot_examples / "00")
    with pytest.raises(InputError, match="multiples of 8"):
        camera_conditioning(poses, intrinsics, 9, 20, 32)
