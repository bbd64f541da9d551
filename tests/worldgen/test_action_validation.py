"""Bad action folders (poses.npy / intrinsics.npy) give an InputError naming the file, field and fix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from worldgen.errors import InputError
from worldgen.pipelines.camera import load_action, validate_action, validate_camera


def walking_poses(n: int = 9) -> np.ndarray:
    """Camera-to-world poses of a camera walking forward while turning (OpenCV axes)."""
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], n, axis=0)
    for i in range(n):
        yaw = 0.05 * i
        poses[i, :3, :3] = [[np.cos(yaw), 0, np.sin(yaw)], [0, 1, 0], [-np.sin(yaw), 0, np.cos(yaw)]]
        poses[i, :3, 3] = [0.1 * i, 0.0, 0.5 * i]
    return poses


def write_action(folder: Path, poses=None, intrinsics=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if poses is None:
        poses = walking_poses()
    if intrinsics is None:
        intrinsics = np.tile(np.array([502.9, 503.1, 415.8, 239.8], np.float32), (len(poses), 1))
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", intrinsics)
    return folder


def load_error(folder: Path, file_name: str, *patterns: str) -> str:
    """load_action(folder) must fail naming the folder, the file and each pattern."""
    with pytest.raises(InputError) as info:
        load_action(folder)
    message = str(info.value)
    assert str(folder) in message
    assert file_name in message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


def test_valid_folder_loads(tmp_path):
    folder = write_action(tmp_path / "ok", poses=walking_poses(9).astype(np.float64))
    poses, intrinsics = load_action(folder)
    assert poses.dtype == np.float32 and poses.shape == (9, 4, 4)
    assert intrinsics.dtype == np.float32 and intrinsics.shape == (9, 4)
    assert np.array_equal(poses, walking_poses(9))


def test_reference_examples_load(lingbot_examples):
    for example, n in (("00", 961), ("01", 561), ("02", 957)):
        poses, intrinsics = load_action(lingbot_examples / example)
        assert poses.shape == (n, 4, 4) and intrinsics.shape == (n, 4)


@pytest.mark.parametrize("missing", ["poses.npy", "intrinsics.npy"])
def test_missing_file(tmp_path, missing):
    folder = write_action(tmp_path / "a")
    (folder / missing).unlink()
    load_error(folder, missing, "file not found", "numpy.save")


def test_missing_folder(tmp_path):
    load_error(tmp_path / "nowhere", "poses.npy", "file not found")


def test_garbage_file(tmp_path):
    folder = write_action(tmp_path / "a")
    (folder / "poses.npy").write_bytes(b"these are not the poses you are looking for")
    load_error(folder, "poses.npy", "not a readable .npy", "numpy.save")


def test_pickled_object_array_is_refused(tmp_path):
    folder = write_action(tmp_path / "a")
    np.save(folder / "intrinsics.npy", np.array([{"fx": 500}], dtype=object), allow_pickle=True)
    load_error(folder, "intrinsics.npy", "not a readable .npy")


def test_npz_archive_is_refused(tmp_path):
    folder = write_action(tmp_path / "a")
    with open(folder / "poses.npy", "wb") as f:
        np.savez(f, poses=walking_poses())
    load_error(folder, "poses.npy", "npz")


def test_text_array_is_refused(tmp_path):
    folder = write_action(tmp_path / "a", poses=np.full((9, 4, 4), "1.0"))
    load_error(folder, "poses.npy", "dtype")


@pytest.mark.parametrize("shape", [(9, 3, 4), (4, 4), (9, 16), (9, 4, 4, 1)])
def test_poses_wrong_shape(tmp_path, shape):
    folder = write_action(
        tmp_path / "a", poses=np.zeros(shape, np.float32), intrinsics=np.array([500, 500, 416, 240], np.float32)
    )
    load_error(folder, "poses.npy", re.escape(str(list(shape))), r"\[N, 4, 4\]")


def test_poses_not_finite(tmp_path):
    poses = walking_poses()
    poses[6, 1, 3] = np.nan
    load_error(write_action(tmp_path / "a", poses=poses), "poses.npy", "pose 6", "NaN or infinite")
    poses[6, 1, 3] = np.inf
    load_error(write_action(tmp_path / "b", poses=poses), "poses.npy", "pose 6")


def test_poses_last_row(tmp_path):
    poses = walking_poses()
    poses[3, 3] = [0, 0, 1, 1]
    load_error(write_action(tmp_path / "a", poses=poses), "poses.npy", "pose 3", r"last row", re.escape("[0, 0, 0, 1]"))


def test_rotation_not_orthonormal(tmp_path):
    poses = walking_poses()
    poses[2, :3, :3] *= 1.01  # a scale sneaked into the rotation
    load_error(write_action(tmp_path / "a", poses=poses), "poses.npy", "pose 2", "not orthonormal")


def test_rotation_small_float32_noise_is_accepted(tmp_path):
    poses = walking_poses()
    poses[2, :3, :3] *= 1.0001  # within the 1e-3 tolerance
    load_action(write_action(tmp_path / "a", poses=poses))


def test_rotation_is_a_reflection(tmp_path):
    poses = walking_poses()
    poses[:, :3, 1] *= -1  # y axis flipped: a left-handed frame
    load_error(write_action(tmp_path / "a", poses=poses), "poses.npy", "pose 0", r"det < 0", "right-handed")


def test_too_few_poses(tmp_path):
    load_error(write_action(tmp_path / "a", poses=walking_poses(4)), "poses.npy", "4 poses", "at least 5")


@pytest.mark.parametrize("shape", [(9, 3), (9, 4, 1), (3,), (9, 5)])
def test_intrinsics_wrong_shape(tmp_path, shape):
    folder = write_action(tmp_path / "a", intrinsics=np.full(shape, 100.0, np.float32))
    load_error(folder, "intrinsics.npy", re.escape(str(list(shape))), "480x832")


def test_intrinsics_single_row_forms_are_accepted(tmp_path):
    row = np.array([500, 501, 416, 240], np.float32)
    _, intrinsics = load_action(write_action(tmp_path / "a", intrinsics=row))
    assert intrinsics.shape == (1, 4) and np.array_equal(intrinsics[0], row)
    _, intrinsics = load_action(write_action(tmp_path / "b", intrinsics=row[None]))
    assert intrinsics.shape == (1, 4)


def test_intrinsics_row_count(tmp_path):
    folder = write_action(tmp_path / "a", intrinsics=np.full((7, 4), 300.0, np.float32))
    load_error(folder, "intrinsics.npy", "7 rows", "9 poses")


@pytest.mark.parametrize("column", [0, 1])
@pytest.mark.parametrize("value", [0.0, -500.0])
def test_intrinsics_non_positive_focal(tmp_path, column, value):
    intrinsics = np.tile(np.array([500, 500, 416, 240], np.float32), (9, 1))
    intrinsics[5, column] = value
    load_error(write_action(tmp_path / "a", intrinsics=intrinsics), "intrinsics.npy", "row 5", "> 0")


def test_intrinsics_not_finite(tmp_path):
    intrinsics = np.tile(np.array([500, 500, 416, 240], np.float32), (9, 1))
    intrinsics[1, 2] = np.nan
    load_error(write_action(tmp_path / "a", intrinsics=intrinsics), "intrinsics.npy", "row 1", "NaN")


def test_validate_arrays_names_the_source():
    with pytest.raises(InputError, match=r"^episode payload: poses has 3 poses"):
        validate_action(walking_poses(3), np.array([500, 500, 416, 240]), source="episode payload")
    with pytest.raises(ValueError, match=r"^episode payload: intrinsics has shape \[2\]"):
        validate_action(walking_poses(), np.array([500, 500]), source="episode payload")
    poses, intrinsics = validate_action(walking_poses().tolist(), [500, 500, 416, 240])
    assert poses.dtype == np.float32 and intrinsics.shape == (1, 4)


def test_validate_does_not_alias_the_input():
    poses = walking_poses()
    checked, _ = validate_action(poses, np.array([500, 500, 416, 240], np.float32))
    checked[0, 0, 3] = 123.0
    assert poses[0, 0, 3] == 0.0


def test_a_generate_camera_is_both_poses_and_intrinsics_or_neither():
    """The one rule of both pipelines' `generate` (base and Fast)."""
    assert validate_camera(None, None) == (None, None)
    poses, intrinsics = validate_camera(walking_poses().tolist(), [500, 500, 416, 240])
    assert poses.dtype == np.float32 and intrinsics.shape == (1, 4)
    for args in ((walking_poses(), None), (None, np.array([500, 500, 416, 240]))):
        with pytest.raises(InputError, match=r"^camera control needs both poses\.npy and intrinsics\.npy"):
            validate_camera(*args)
    with pytest.raises(InputError, match=r"poses has 3 poses"):  # then the action's own rules
        validate_camera(walking_poses(3), np.array([500, 500, 416, 240]))
