"""Files nobody here wrote: unreadable USD, sheared cameras, gaps in recordings, empty Isaac Lab
datasets; each one line naming the file (real usd-core stages, real subprocesses of the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
h5py = pytest.importorskip("h5py", reason="h5py is not installed")
from pxr import Gf, Usd, UsdGeom  # noqa: E402

from contracts.episode import EpisodeError, read_episode  # noqa: E402
from lingbot_isaac.camera import CameraError, camera_pose, numpy_to_gf  # noqa: E402
from lingbot_isaac.recording import write_recording_episode  # noqa: E402
from lingbot_isaac.resample import RecordingGapWarning  # noqa: E402
from lingbot_isaac.sources import SourceOptions, kind_of, open_source  # noqa: E402
from lingbot_isaac.usd_file import UsdFileError  # noqa: E402
from tests.conftest import pythonpath_with_repo  # noqa: E402
from tests.isaac.test_sources import animated_stage, reference_trajectory, write_isaacsim_session  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": pythonpath_with_repo()}
    command = [sys.executable, "-m", "lingbot_cli", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def unreadable_usd_files(folder: Path) -> dict[str, Path]:
    """A syntax error, a 0-byte .usd, a truncated .usdc (a real crate file cut in half), garbage."""
    files = {}
    files["syntax"] = folder / "syntax.usda"
    files["syntax"].write_text('#usda 1.0\ndef Xform "World" {\n  def Camera "Cam" {\n')
    files["empty"] = folder / "empty.usd"
    files["empty"].write_bytes(b"")
    good = folder / "good.usdc"
    animated_stage(good)
    files["truncated"] = folder / "truncated.usdc"
    files["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["garbage"] = folder / "garbage.usd"
    files["garbage"].write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    return files


def test_every_unreadable_usd_is_one_error_naming_the_file(tmp_path):
    for kind, path in unreadable_usd_files(tmp_path).items():
        with pytest.raises(UsdFileError) as raised:
            open_source(path, SourceOptions())
        message = str(raised.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, (kind, message)
        assert "pxrInternal" not in message and "stage.cpp" not in message, message
    with pytest.raises(UsdFileError, match="truncated"):
        open_source(tmp_path / "truncated.usdc", SourceOptions())
    with pytest.raises(UsdFileError, match=r"syntax.usda:\d+:\d+"):  # the parser's line and column
        open_source(tmp_path / "syntax.usda", SourceOptions())


def test_replay_of_an_unreadable_stage_or_stage_snapshot_ends_in_one_line(tmp_path):
    files = unreadable_usd_files(tmp_path)
    result = cli("replay", str(files["truncated"]), "--export-only", "--prompt", "p")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"error: {files['truncated']}: not a readable USD stage")

    t, poses = reference_trajectory()
    session = tmp_path / "rec" / "episode.hdf5"
    session.parent.mkdir()
    write_isaacsim_session(session, t, poses)
    Image.fromarray(np.zeros((360, 640, 3), np.uint8)).save(tmp_path / "first.png")
    common = ["--export-only", "--prompt", "p", "--image", str(tmp_path / "first.png")]
    result = cli("replay", str(session), "--stage", str(files["garbage"]), *common)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{files['garbage']}: not a readable USD stage" in result.stderr and "--meters-per-unit" in result.stderr
    (session.parent / "stage_snapshot.usd").write_bytes(b"")  # what a crash mid-export leaves
    result = cli("replay", str(session), *common)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "stage_snapshot.usd: an empty file (0 bytes)" in result.stderr


def sheared_camera() -> tuple[Usd.Stage, Usd.Prim]:
    """A camera rotated under a parent scaled (1, 1, 3): every axis of the camera's world transform
    has the same length sqrt(11/3), but they are not square to each other."""
    stage = Usd.Stage.CreateInMemory()
    parent = UsdGeom.Xform.Define(stage, "/Stretched")
    parent.AddScaleOp().Set(Gf.Vec3f(1, 1, 3))
    camera = UsdGeom.Camera.Define(stage, "/Stretched/Cam")
    rotation = np.eye(4)
    # Rows (1,-1,0)/sqrt2, (1,1,-2)/sqrt6, (1,1,1)/sqrt3: its third row is the same size in every column.
    rotation[:3, :3] = [
        np.array([1, -1, 0]) / np.sqrt(2),
        np.array([1, 1, -2]) / np.sqrt(6),
        np.array([1, 1, 1]) / np.sqrt(3),
    ]
    camera.AddTransformOp().Set(numpy_to_gf(rotation))
    return stage, camera.GetPrim()


def test_a_camera_under_a_sheared_parent_is_refused_like_non_uniform_scale():
    _stage, prim = sheared_camera()
    world = np.array(UsdGeom.Xformable(prim).ComputeLocalToWorldTransform(Usd.TimeCode.Default())).T
    norms = np.linalg.norm(world[:3, :3], axis=0)
    np.testing.assert_allclose(norms, np.sqrt(11 / 3))  # the column norms alone see nothing wrong
    with pytest.raises(CameraError, match="shears the camera") as raised:
        camera_pose(prim)
    assert "/Stretched/Cam" in str(raised.value) and "uniform scale" in str(raised.value)
    # A uniformly scaled parent over the same rotation is fine.
    stage, prim = sheared_camera()
    UsdGeom.Xformable(stage.GetPrimAtPath("/Stretched")).GetOrderedXformOps()[0].Set(Gf.Vec3f(3, 3, 3))
    assert np.allclose(camera_pose(prim)[:3, :3].T @ camera_pose(prim)[:3, :3], np.eye(3))


def test_a_gap_in_a_recorder_session_is_named_in_one_plain_warning_line(tmp_path):
    t, poses = reference_trajectory(n=120)
    keep = np.r_[0:40, 60:120]  # 20 recorder steps (1/3 s at 60 Hz) missing
    session = tmp_path / "gappy.hdf5"
    write_isaacsim_session(session, t[keep], poses[keep])
    recording = open_source(session, SourceOptions(meters_per_unit=1.0))[0].recording
    with pytest.warns(RecordingGapWarning, match=r"no camera samples for 0\.350 s .*~20 samples missing"):
        write_recording_episode(recording, tmp_path / "ep", "p", image=np.zeros((360, 640, 3), np.uint8))
    # Without the gap: no warning.
    write_isaacsim_session(tmp_path / "whole.hdf5", t, poses)
    whole = open_source(tmp_path / "whole.hdf5", SourceOptions(meters_per_unit=1.0))[0].recording
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordingGapWarning)
        write_recording_episode(whole, tmp_path / "ep-whole", "p", image=np.zeros((360, 640, 3), np.uint8))

    Image.fromarray(np.zeros((360, 640, 3), np.uint8)).save(tmp_path / "first.png")
    result = cli(
        "replay", str(session), "--export-only", "--prompt", "p", "--image", str(tmp_path / "first.png"),
        "--meters-per-unit", "1", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    gap_lines = [line for line in result.stderr.splitlines() if "no camera samples" in line]
    assert len(gap_lines) == 2, result.stderr  # one line for each of the session's two episodes
    assert all(line.startswith(f"warning: {session}:episodes/episode_0000") for line in gap_lines)
    assert "warnings.warn" not in result.stderr and "RecordingGapWarning" not in result.stderr
    assert len(result.stdout.split()) == 2 and read_episode(Path(result.stdout.split()[0])).frame_count > 5


def test_the_square_pixel_warning_is_one_plain_line(tmp_path):
    stage = animated_stage(tmp_path / "stage.usda")
    stage.GetPrimAtPath("/World/Rig/Cam").GetAttribute("verticalAperture").Set(20.955)  # square film
    stage.GetRootLayer().Save()
    Image.fromarray(np.zeros((480, 832, 3), np.uint8)).save(tmp_path / "first.png")
    result = cli(
        "replay", str(tmp_path / "stage.usda"), "--export-only", "--prompt", "p",
        "--image", str(tmp_path / "first.png"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: /World/Rig/Cam: apertures 20.955 x 20.955"), lines


def test_an_isaac_lab_dataset_without_demos_is_named_as_an_empty_dataset(tmp_path):
    from tests.isaac.isaaclab_real import isaaclab

    for generation in ("2", "3"):
        lab = isaaclab(generation)
        path = tmp_path / f"empty{generation}.hdf5"
        handler = lab.handler.HDF5DatasetFileHandler()  # created, closed before any demo was written
        handler.create(str(path), env_name="Isaac-Stack-Cube-Franka-IK-Rel-Visuomotor-v0")
        handler.flush()
        handler.close()
        with pytest.raises(EpisodeError, match="an empty Isaac Lab dataset") as raised:
            kind_of(path)
        assert str(raised.value).startswith(f"{path}: ") and "neither" not in str(raised.value)
