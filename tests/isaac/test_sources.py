"""Trajectory sources -> episodes: USD stages, Isaac Sim 6 recorder sessions, Isaac Lab datasets."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.spatial.transform import Rotation

pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
h5py = pytest.importorskip("h5py", reason="h5py is not installed")
from pxr import Gf, Usd, UsdGeom  # noqa: E402

from contracts.episode import EpisodeError, read_episode  # noqa: E402
from contracts.model_frame import to_model_intrinsics  # noqa: E402
from lingbot_isaac.camera import (  # noqa: E402
    CameraError,
    camera_pose,
    gf_to_numpy,
    numpy_to_gf,
    opencv_to_usd_local_to_world,
    set_camera_intrinsics,
    usd_to_opencv_c2w,
)
from lingbot_isaac.lens import NonSquarePixelWarning  # noqa: E402
from lingbot_isaac.recording import write_recording_episode  # noqa: E402
from lingbot_isaac.sources import SourceOptions, kind_of, open_source  # noqa: E402
from lingbot_isaac.sources.usd_stage import read_usd_stage  # noqa: E402
from tests.room_render import look_at  # noqa: E402


def animated_stage(path, meters_per_unit=0.01, codes_per_second=60.0, seconds=2.0):
    """A rig that slides and yaws at constant rates with a tilted camera on it."""
    stage = Usd.Stage.CreateNew(str(path))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, meters_per_unit)
    stage.SetTimeCodesPerSecond(codes_per_second)
    end = seconds * codes_per_second
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(end)
    rig = UsdGeom.Xform.Define(stage, "/World/Rig")
    move, yaw = rig.AddTranslateOp(), rig.AddRotateZOp()
    move.Set(Gf.Vec3d(0, 0, 0), 0)
    move.Set(Gf.Vec3d(150, 50, 20), end)
    yaw.Set(0.0, 0)
    yaw.Set(60.0, end)
    camera = UsdGeom.Camera.Define(stage, "/World/Rig/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(0, 0, 140))
    camera.AddRotateXOp().Set(80.0)  # look roughly horizontal
    camera.GetFocalLengthAttr().Set(18.0)
    camera.GetHorizontalApertureAttr().Set(20.955)
    camera.GetVerticalApertureAttr().Set(20.955 * 480 / 832)
    stage.GetRootLayer().Save()
    return stage


def test_usd_stage_to_episode_round_trip(tmp_path):
    stage = animated_stage(tmp_path / "scene.usda")
    assert kind_of(tmp_path / "scene.usda") == "usd"
    recording = read_usd_stage(tmp_path / "scene.usda", (480, 832))
    assert recording.camera_prim == "/World/Rig/Cam"
    # Keys at codes 0 and 120 only; sampled at the episode's own times (60 codes/s, 16 fps).
    np.testing.assert_array_equal(recording.times, np.arange(33) / 16)
    image = np.zeros((480, 832, 3), np.uint8)
    out = write_recording_episode(recording, tmp_path / "ep", "A camera slides and turns.", image=image)
    episode = read_episode(out)
    assert episode.frame_count == 33  # 2 s at 16 fps -> 33 = 4*8 + 1
    prim = stage.GetPrimAtPath("/World/Rig/Cam")
    for i in (0, 5, 16, 32):
        expected = camera_pose(prim, Usd.TimeCode(i * 60 / 16))  # USD's own interpolation
        np.testing.assert_allclose(episode.poses[i], expected, atol=2e-6)
    assert episode.meta.sim_times == [i / 16 for i in range(33)]
    assert episode.meta.meters_per_unit == 0.01 and episode.meta.camera_prim == "/World/Rig/Cam"
    np.testing.assert_allclose(episode.intrinsics[0], [832 * 18 / 20.955] * 2 + [416, 240], rtol=1e-6)


def test_stage_following_lingbot_example_00_exports_that_example(tmp_path, lingbot_examples):
    example = lingbot_examples / "00"
    poses = np.load(example / "poses.npy")
    intrinsics = np.load(example / "intrinsics.npy")
    # The example's intrinsics are square-pixel for an 832x480 render (at the 1280x720 of its jpg they
    # would not be), so the stage renders 832x480 and the first frame is the jpg resized to that.
    width, height = 832, 480
    image = Image.open(example / "image.jpg").convert("RGB").resize((width, height), Image.BICUBIC)
    k_source = intrinsics[0].astype(np.float64)

    stage = Usd.Stage.CreateNew(str(tmp_path / "example00.usda"))
    UsdGeom.SetStageMetersPerUnit(stage, 0.01)  # centimetre stage: the example's units become cm
    stage.SetTimeCodesPerSecond(16)
    camera = UsdGeom.Camera.Define(stage, "/World/Cam")
    transform = camera.AddTransformOp()
    for code, pose in enumerate(poses.astype(np.float64)):
        # The example's translations are in "stage units" here, so author them as they are.
        transform.Set(numpy_to_gf(opencv_to_usd_local_to_world(pose, 1.0)), code)
    set_camera_intrinsics(camera, k_source, width, height)
    stage.GetRootLayer().Save()

    with warnings.catch_warnings():
        warnings.simplefilter("error", NonSquarePixelWarning)  # fx/fy differ by 4e-4 only
        recording = read_usd_stage(tmp_path / "example00.usda", (height, width))
    out = write_recording_episode(recording, tmp_path / "ep", (example / "prompt.txt").read_text(), image=image)
    episode = read_episode(out)
    assert episode.frame_count == 961
    np.testing.assert_allclose(episode.poses[:, :3, :3], poses[:, :3, :3], atol=2e-6)
    # Up to the unit scale: stage units are centimetres, episodes are in metres.
    np.testing.assert_allclose(episode.poses[:, :3, 3], poses[:, :3, 3] * 0.01, rtol=1e-6, atol=1e-6)
    # Isaac's square pixels: fx, cx, cy as the example's; fy = fx (the example's fy is 4e-4 off).
    np.testing.assert_allclose(episode.intrinsics[:, [0, 2, 3]], intrinsics[:, [0, 2, 3]], rtol=1e-6)
    np.testing.assert_array_equal(episode.intrinsics[:, 1], episode.intrinsics[:, 0])
    np.testing.assert_allclose(episode.intrinsics[:, 1], intrinsics[:, 1], rtol=5e-4)


@pytest.mark.filterwarnings("ignore::lingbot_isaac.lens.NonSquarePixelWarning")  # USD default apertures
def test_no_or_ambiguous_camera(tmp_path):
    stage = Usd.Stage.CreateNew(str(tmp_path / "two.usda"))
    UsdGeom.Camera.Define(stage, "/A")
    UsdGeom.Camera.Define(stage, "/B").AddTranslateOp().Set(Gf.Vec3d(0, 0, 0), 0)
    stage.GetRootLayer().Save()
    with pytest.raises(CameraError, match="several cameras"):
        open_source(tmp_path / "two.usda", SourceOptions())
    with pytest.raises(CameraError, match="not animated"):
        open_source(tmp_path / "two.usda", SourceOptions(camera="A"))


def reference_trajectory(n=90, rate=60.0):
    """OpenCV c2w poses in metres of a camera walking through the room, sampled at `rate`."""
    t = np.arange(n) / rate
    eyes = np.stack([0.5 * np.sin(t), -1.0 + 0.8 * t, 1.4 + 0.05 * t], axis=1)
    targets = eyes + np.stack([np.sin(0.6 * t), np.cos(0.6 * t), -0.1 * np.ones_like(t)], axis=1)
    return t, np.stack([look_at(e, g) for e, g in zip(eyes, targets, strict=True)])


def wxyz(rotations: np.ndarray) -> np.ndarray:
    return Rotation.from_matrix(rotations).as_quat()[:, [3, 0, 1, 2]]


def write_isaacsim_session(path, t, poses, resolution=(640, 360), time_offset=3.0, meters_per_unit=1.0):
    """An HDF5 file laid out as isaacsim.replicator.episode_recorder (schema 2) writes it.

    Follows that extension's own source (Isaac Sim, source/extensions/isaacsim.replicator.
    episode_recorder/isaacsim/replicator/episode_recorder/, read in the public mirror
    stevenf7/IsaacSim): `storage.py` (the "HDF5 V2 layout": root attrs schema_version, created_at,
    num_episodes; episodes/episode_NNNNN with attrs episode_index, started_at, ended_at,
    num_frames; one dataset per channel under the recordable's group), `manifest.py` (JSON
    strings manifest/tracks, session, sampling, coord_conventions, sort_keys=True),
    `recordables/sim_time.py` (group "meta/time": sim_time f8, physics_step i8, wall_time f8) and
    `recordables/camera.py` (position, orientation wxyz, focal_length, horizontal_aperture,
    vertical_aperture, clipping_range, all f4: no image channel). Positions are world positions
    in stage units (what the CameraRecordable samples from the stage): `meters_per_unit` sets the
    stage unit.
    """
    usd_rotations = poses[:, :3, :3] @ np.diag([1.0, -1.0, -1.0])  # OpenCV axes -> USD camera axes
    with h5py.File(path, "w") as h5:
        h5.attrs["schema_version"] = 2
        h5.attrs["created_at"] = "2026-01-01T12:00:00+00:00"
        h5.attrs["num_episodes"] = 2
        manifest = h5.create_group("manifest")
        tracks = [
            {"type": "sim_time", "group": "meta/time"},
            {
                "type": "camera",
                "group": "cameras/head",
                "prim_path": "/World/Robot/head_cam",
                "resolution": list(resolution),
            },
            {"type": "xform", "group": "state/box", "prim_path": "/World/Box"},
        ]
        for name, payload in {
            "tracks": tracks,
            "session": {},
            "sampling": {"mode": "physics"},
            "coord_conventions": {
                "quaternion_order": "wxyz",
                "position_units": "meters",
                "angle_units": "radians",
            },
        }.items():
            manifest.create_dataset(name, data=json.dumps(payload, sort_keys=True))
        for e in range(2):
            episode = h5.create_group(f"episodes/episode_{e:05d}")
            episode.attrs["episode_index"] = e
            episode.attrs["started_at"] = "2026-01-01T12:00:01+00:00"
            episode.attrs["ended_at"] = "2026-01-01T12:00:09+00:00"
            episode.attrs["num_frames"] = len(t)
            time = episode.create_group("meta/time")
            sim_time = t + time_offset
            sim_time[10] = sim_time[9]  # a paused step: repeated sim time
            time["sim_time"] = sim_time
            time["physics_step"] = np.arange(len(t), dtype=np.int64)
            time["wall_time"] = 1.767e9 + 2 * t
            cam = episode.create_group("cameras/head")
            cam["position"] = (poses[:, :3, 3] / meters_per_unit).astype(np.float32)
            cam["orientation"] = wxyz(usd_rotations).astype(np.float32)
            cam["focal_length"] = np.full(len(t), 18.14756, np.float32)
            cam["horizontal_aperture"] = np.full(len(t), 20.955, np.float32)
            cam["vertical_aperture"] = np.full(len(t), 20.955 * resolution[1] / resolution[0], np.float32)
            cam["clipping_range"] = np.tile(np.float32([0.01, 1e6]), (len(t), 1))
            episode.create_group("state/box")["position"] = np.zeros((len(t), 3), np.float32)


def test_isaacsim_episode_recorder_session(tmp_path):
    t, poses = reference_trajectory()
    write_isaacsim_session(tmp_path / "session.hdf5", t, poses)
    assert kind_of(tmp_path / "session.hdf5") == "isaacsim-hdf5"
    sources = open_source(tmp_path / "session.hdf5", SourceOptions(meters_per_unit=1.0))
    assert [s.name for s in sources] == ["episode_00000", "episode_00001"]
    recording = sources[0].recording
    assert recording.resolution == (360, 640) and recording.camera_prim == "/World/Robot/head_cam"
    assert len(recording.times) == len(t) - 1  # the repeated sim time was dropped
    keep = np.r_[0:10, 11 : len(t)]
    np.testing.assert_allclose(recording.times, t[keep], atol=1e-12)
    np.testing.assert_allclose(recording.poses, poses[keep], atol=1e-6)
    fx = 640 * 18.14756 / 20.955
    np.testing.assert_allclose(recording.intrinsics[0], [fx, fx, 320, 180], rtol=1e-6)
    out = write_recording_episode(recording, tmp_path / "ep", "p", image=np.zeros((360, 640, 3), np.uint8))
    episode = read_episode(out)
    assert episode.frame_count == 21  # 89/60 s -> 24 frames at 16 fps -> 21 = 4*5 + 1
    np.testing.assert_allclose(episode.intrinsics[0], to_model_intrinsics([fx, fx, 320, 180], 360, 640), rtol=1e-6)
    # Another image size: the apertures give intrinsics for it.
    bigger = open_source(tmp_path / "session.hdf5", SourceOptions(resolution=(720, 1280), meters_per_unit=1))[
        0
    ].recording
    np.testing.assert_allclose(bigger.intrinsics[0], [2 * fx, 2 * fx, 640, 360], rtol=1e-6)
    with pytest.raises(EpisodeError, match="same aspect ratio"):
        open_source(tmp_path / "session.hdf5", SourceOptions(resolution=(480, 640), meters_per_unit=1))
    with pytest.raises(EpisodeError, match="no camera track matching 'nope'"):
        open_source(tmp_path / "session.hdf5", SourceOptions(camera="nope", meters_per_unit=1))


def test_replay_says_once_that_recorder_sessions_hold_no_sim_frames(tmp_path, capsys):
    from lingbot_cli.main import main as cli

    t, poses = reference_trajectory()
    sessions = [tmp_path / "a.hdf5", tmp_path / "b.hdf5"]
    for session in sessions:
        write_isaacsim_session(session, t, poses)
    Image.fromarray(np.zeros((360, 640, 3), np.uint8)).save(tmp_path / "first.png")
    args = ["replay", *map(str, sessions), "--export-only", "--out", str(tmp_path / "out")]
    args += ["--image", str(tmp_path / "first.png"), "--prompt", "p", "--meters-per-unit", "1"]
    assert cli(args) == 0
    out, err = capsys.readouterr()
    folders = [Path(line) for line in out.splitlines()]
    assert len(folders) == 4  # two episodes in each session
    assert all(read_episode(f).sim_frames_path is None for f in folders)
    notes = [line for line in err.splitlines() if "holds no camera images" in line]
    assert len(notes) == 1, err  # once for the whole command, naming both files
    assert notes[0].startswith(f"note: {sessions[0]}, {sessions[1]}: an Isaac Sim episode-recorder session")
    assert "Keep every sim frame" in notes[0] and "--keep-frames" in notes[0] and "compare" in notes[0]


def test_centimetre_stage_recorder_session_exports_metres(tmp_path):
    t, poses = reference_trajectory()
    folder = tmp_path / "_out_episode_recorder"
    folder.mkdir()
    write_isaacsim_session(folder / "episode_20260101_120000.hdf5", t, poses, meters_per_unit=0.01)
    session = folder / "episode_20260101_120000.hdf5"
    # Nothing says the unit: refused (the manifest's "position_units": "meters" is only a label).
    with pytest.raises(EpisodeError, match="--meters-per-unit") as refused:
        open_source(session, SourceOptions())
    assert "--stage" in str(refused.value)
    # The stage it was recorded on, given with --stage ...
    stage = Usd.Stage.CreateNew(str(tmp_path / "warehouse.usda"))
    UsdGeom.SetStageMetersPerUnit(stage, 0.01)
    stage.GetRootLayer().Save()
    source, _second_episode = open_source(session, SourceOptions(stage=tmp_path / "warehouse.usda"))
    keep = np.r_[0:10, 11 : len(t)]  # the repeated sim time is dropped
    np.testing.assert_allclose(source.recording.poses, poses[keep], atol=1e-6)
    assert source.recording.meters_per_unit == 0.01
    # ... or the snapshot the recorder links beside its sessions (export_stage_snapshot(output_dir)).
    stage.GetRootLayer().Export(str(folder / "stage_snapshot.usd"))
    linked = open_source(session, SourceOptions())[0]
    np.testing.assert_allclose(linked.recording.poses, source.recording.poses)
    assert linked.recording.extra["meters_per_unit_from"].endswith("stage_snapshot.usd")
    # ... or stated: the flag wins over the snapshot.
    stated = open_source(session, SourceOptions(meters_per_unit=0.01))[0]
    np.testing.assert_allclose(stated.recording.poses, source.recording.poses)
    out = write_recording_episode(
        linked.recording, tmp_path / "ep", "A robot drives.", image=np.zeros((360, 640, 3), np.uint8)
    )
    episode = read_episode(out)
    assert np.abs(episode.poses[:, :3, 3]).max() < 3.0  # metres, not centimetres
    np.testing.assert_allclose(episode.poses[0], poses[0], atol=1e-6)


@pytest.mark.parametrize("convention", ["quat_w_ros", "quat_w_opengl", "quat_w_world"])
def test_isaaclab_dataset_with_camera_observations(tmp_path, convention):
    t, poses = reference_trajectory(n=50, rate=30.0)
    to_convention = {
        "quat_w_ros": np.eye(3),
        "quat_w_opengl": np.diag([1.0, -1.0, -1.0]),
        "quat_w_world": np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]]),  # inverse of ours
    }[convention]
    k = np.array([[400.0, 0, 320], [0, 400.0, 240], [0, 0, 1]])
    frames = np.random.default_rng(0).integers(0, 256, (50, 480, 640, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "dataset.hdf5", "w") as h5:
        data = h5.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Isaac-Stack-Cube-Franka-v0", "type": 2})
        demo = data.create_group("demo_0")
        demo.attrs["num_samples"] = 50
        demo["actions"] = np.zeros((50, 7), np.float32)
        obs = demo.create_group("obs")
        obs["joint_pos"] = np.zeros((50, 9), np.float32)
        obs["wrist_cam_pos_w"] = poses[:, :3, 3].astype(np.float32)[:, None]  # [N, 1, 3]: one sensor
        obs["wrist_cam_" + convention] = wxyz(poses[:, :3, :3] @ to_convention).astype(np.float32)
        obs["wrist_cam_intrinsic_matrices"] = np.broadcast_to(k, (50, 3, 3)).astype(np.float32)
        obs["wrist_cam_rgb"] = frames
    assert kind_of(tmp_path / "dataset.hdf5") == "isaaclab-hdf5"
    with pytest.raises(EpisodeError, match="--rate"):
        open_source(tmp_path / "dataset.hdf5", SourceOptions(quat_order="wxyz"))
    [source] = open_source(tmp_path / "dataset.hdf5", SourceOptions(rate=30.0, quat_order="wxyz"))
    recording = source.recording
    assert source.name == "demo_0" and recording.camera_prim == "wrist_cam"
    assert recording.scene_id == "Isaac-Stack-Cube-Franka-v0"
    np.testing.assert_allclose(recording.poses, poses, atol=1e-6)
    np.testing.assert_allclose(recording.times, t)
    assert recording.resolution == (480, 640)
    assert np.array_equal(recording.first_frame, frames[0])
    out = write_recording_episode(recording, tmp_path / "ep", "A wrist camera moves.")
    episode = read_episode(out)
    assert episode.frame_count == 25  # 49/30 s -> 27 frames at 16 fps -> 25
    np.testing.assert_allclose(episode.intrinsics[0], [400 * 1.3, 400, 416, 240], rtol=1e-6)


def test_unknown_sources_are_named(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(EpisodeError, match="unknown kind of source"):
        kind_of(tmp_path / "notes.txt")
    with h5py.File(tmp_path / "other.hdf5", "w") as h5:
        h5["x"] = 1
    with pytest.raises(EpisodeError, match="neither an Isaac Sim"):
        kind_of(tmp_path / "other.hdf5")
    with pytest.raises(EpisodeError, match="no such file"):
        kind_of(tmp_path / "missing.usda")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EpisodeError, match="not an episode folder"):
        kind_of(tmp_path / "empty")


def test_sparse_keys_on_a_parents_euler_angles_export_usds_own_arc(tmp_path):
    """Keys only at the first and last time codes: every exported pose is USD's own evaluation."""
    stage = Usd.Stage.CreateNew(str(tmp_path / "arc.usda"))
    UsdGeom.SetStageMetersPerUnit(stage, 0.01)
    stage.SetTimeCodesPerSecond(24)
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(100)
    arm = UsdGeom.Xform.Define(stage, "/World/Arm")
    arm.AddTranslateOp().Set(Gf.Vec3d(0, 0, 100))
    euler = arm.AddRotateXYZOp()
    euler.Set(Gf.Vec3f(0, 0, 0), 0)
    euler.Set(Gf.Vec3f(20, -10, 150), 100)  # USD interpolates the three angles: an arc
    camera = UsdGeom.Camera.Define(stage, "/World/Arm/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(150, 0, 0))  # 1.5 m from the pivot
    camera.AddRotateXYZOp().Set(Gf.Vec3f(80, 0, 90))
    camera.GetFocalLengthAttr().Set(18.0)
    camera.GetHorizontalApertureAttr().Set(20.955)
    camera.GetVerticalApertureAttr().Set(20.955 * 480 / 832)
    stage.GetRootLayer().Save()

    recording = read_usd_stage(tmp_path / "arc.usda", (480, 832))
    out = write_recording_episode(
        recording, tmp_path / "ep", "A camera swings on an arm.", image=np.zeros((480, 832, 3), np.uint8)
    )
    episode = read_episode(out)
    assert episode.frame_count == 65  # 100 codes at 24/s = 4.17 s -> 67 frames at 16 fps -> 65
    prim = stage.GetPrimAtPath("/World/Arm/Cam")
    chord_error = 0.0
    first, last = (camera_pose(prim, Usd.TimeCode(c)) for c in (0, 100))
    for k in range(episode.frame_count):
        code = k * 24 / 16  # the episode's time k/16 s
        gf_camera = UsdGeom.Camera(prim).GetCamera(Usd.TimeCode(code))
        expected = usd_to_opencv_c2w(gf_to_numpy(gf_camera.transform), 0.01)
        got = episode.poses[k].astype(np.float64)
        assert np.abs(got[:3, 3] - expected[:3, 3]).max() < 1e-5  # metres
        angle = Rotation.from_matrix(got[:3, :3].T @ expected[:3, :3]).magnitude()
        assert np.degrees(angle) < 1e-4
        chord = first[:3, 3] + (last[:3, 3] - first[:3, 3]) * code / 100
        chord_error = max(chord_error, float(np.linalg.norm(chord - expected[:3, 3])))
    assert chord_error > 0.3  # interpolating between the keyed poses would cut the arc by > 30 cm
