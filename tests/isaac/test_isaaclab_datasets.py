"""Isaac Lab datasets written by Isaac Lab's own `HDF5DatasetFileHandler`, 2.x (wxyz) and 3.x (xyzw).

The files are written the way Isaac Lab's recorder writes them: `EpisodeData.add(key, tensor)`
once per env step with one env's observation terms, `pre_export()`, then
`HDF5DatasetFileHandler.create(...)` / `write_episode(...)` (isaaclab/utils/datasets/
hdf5_dataset_file_handler.py and episode_data.py of each wheel). The camera's `quat_w_opengl` /
`quat_w_world` terms are made from `quat_w_ros` by that version's own
`isaaclab.utils.math.convert_camera_frame_orientation_convention`, as `CameraData` does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

h5py = pytest.importorskip("h5py", reason="h5py is not installed")

from contracts.episode import EpisodeError, read_episode  # noqa: E402
from lingbot_isaac.recording import write_recording_episode  # noqa: E402
from lingbot_isaac.sources import SourceOptions, kind_of, open_source  # noqa: E402
from tests.isaac.isaaclab_real import isaaclab  # noqa: E402
from tests.room_render import look_at  # noqa: E402

# Isaac Lab's math module compiles its helpers with torch.jit.script, which torch 2.13 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

RATE = 30.0  # env step rate of the fake task (Hz)
N = 40
H, W = 120, 160
K = np.array([[150.0, 0.0, 80.0], [0.0, 150.0, 60.0], [0.0, 0.0, 1.0]])


def trajectory() -> np.ndarray:
    """OpenCV (= Isaac Lab "ros") camera-to-world poses of a wrist camera sweeping round a table."""
    t = np.arange(N) / RATE
    eyes = np.stack([0.6 * np.cos(t), 0.6 * np.sin(t), 0.5 + 0.1 * t], axis=1)
    targets = np.stack([0.1 * np.sin(3 * t), 0.05 * t, 0.0 * t], axis=1)
    return np.stack([look_at(e, g) for e, g in zip(eyes, targets, strict=True)])


def frames() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (N, H, W, 3), dtype=np.uint8)


def write_dataset(path, generation: str, convention: str, image_term: str = "wrist_cam") -> None:
    """A one-demo dataset of Isaac Lab `generation` with the camera's terms in `convention`."""
    import torch

    lab = isaaclab(generation)
    poses = trajectory()
    quat_ros = Rotation.from_matrix(poses[:, :3, :3]).as_quat()  # scipy: (x, y, z, w)
    if lab.quat_order == "wxyz":
        quat_ros = quat_ros[:, [3, 0, 1, 2]]
    quat = torch.tensor(quat_ros, dtype=torch.float32)
    if convention != "quat_w_ros":
        target = convention.removeprefix("quat_w_")
        quat = lab.math.convert_camera_frame_orientation_convention(quat, origin="ros", target=target)
    images = torch.from_numpy(frames())
    episode = lab.episode_data.EpisodeData()
    for step in range(N):  # what the recorder's PreStep observation term adds for one env
        episode.add("obs/joint_pos", torch.zeros(9))
        episode.add("obs/wrist_cam_pos_w", torch.tensor(poses[step, :3, 3], dtype=torch.float32))
        episode.add(f"obs/wrist_cam_{convention}", quat[step])
        episode.add("obs/wrist_cam_intrinsic_matrices", torch.tensor(K, dtype=torch.float32))
        if image_term:
            episode.add(f"obs/{image_term}", images[step])
        episode.add("actions", torch.zeros(7))
    episode.pre_export()
    handler = lab.handler.HDF5DatasetFileHandler()
    handler.create(str(path), env_name="Isaac-Stack-Cube-Franka-IK-Rel-Visuomotor-v0")
    handler.write_episode(episode)
    handler.flush()
    handler.close()


def rotation_error_deg(a: np.ndarray, b: np.ndarray) -> float:
    relative = Rotation.from_matrix(a[:, :3, :3].transpose(0, 2, 1) @ b[:, :3, :3])
    return float(np.degrees(relative.magnitude()).max())


@pytest.mark.parametrize("convention", ["quat_w_ros", "quat_w_opengl", "quat_w_world"])
def test_same_trajectory_from_isaac_lab_2_and_3_replays_to_the_same_poses(tmp_path, convention):
    write_dataset(tmp_path / "lab2.hdf5", "2", convention)
    write_dataset(tmp_path / "lab3.hdf5", "3", convention)
    with h5py.File(tmp_path / "lab3.hdf5") as h5:
        assert int(h5.attrs["format_version"]) == 1  # Isaac Lab 3.x's own mark
    with h5py.File(tmp_path / "lab2.hdf5") as h5:
        assert "format_version" not in h5.attrs  # Isaac Lab 2.x writes none
    assert kind_of(tmp_path / "lab3.hdf5") == "isaaclab-hdf5"

    # 3.x: read from its mark, no flag needed. 2.x: unmarked, so its order must be given.
    [lab3] = open_source(tmp_path / "lab3.hdf5", SourceOptions(rate=RATE))
    [lab2] = open_source(tmp_path / "lab2.hdf5", SourceOptions(rate=RATE, quat_order="wxyz"))
    np.testing.assert_allclose(lab2.recording.poses, lab3.recording.poses, atol=1e-6)
    np.testing.assert_allclose(lab3.recording.poses, trajectory(), atol=1e-6)
    assert lab3.recording.extra["quaternion_order"] == "xyzw"
    assert lab2.recording.extra["quaternion_order"] == "wxyz"
    np.testing.assert_allclose(lab3.recording.intrinsics[0], [150, 150, 80, 60])
    np.testing.assert_allclose(lab3.recording.times, np.arange(N) / RATE)

    # And through to the episode folder: identical poses.npy.
    eps = [
        read_episode(write_recording_episode(s.recording, tmp_path / f"ep{i}", "A wrist camera sweeps."))
        for i, s in enumerate((lab2, lab3))
    ]
    np.testing.assert_allclose(eps[0].poses, eps[1].poses, atol=1e-6)


def test_unmarked_dataset_is_refused_without_an_order_and_a_mark_is_never_overridden(tmp_path):
    write_dataset(tmp_path / "lab2.hdf5", "2", "quat_w_ros")
    write_dataset(tmp_path / "lab3.hdf5", "3", "quat_w_ros")
    with pytest.raises(EpisodeError, match="format_version") as refused:
        open_source(tmp_path / "lab2.hdf5", SourceOptions(rate=RATE))
    message = str(refused.value)
    assert "Isaac Lab 2.x" in message and "Isaac Lab 3.x" in message and "--quat-order" in message
    # The config default applies to unmarked files only ...
    [lab2] = open_source(tmp_path / "lab2.hdf5", SourceOptions(rate=RATE, default_quat_order="wxyz"))
    np.testing.assert_allclose(lab2.recording.poses, trajectory(), atol=1e-6)
    [lab3] = open_source(tmp_path / "lab3.hdf5", SourceOptions(rate=RATE, default_quat_order="wxyz"))
    np.testing.assert_allclose(lab3.recording.poses, trajectory(), atol=1e-6)
    # ... and a command-line order that contradicts the mark is an error, not a silent override.
    with pytest.raises(EpisodeError, match="format_version 1"):
        open_source(tmp_path / "lab3.hdf5", SourceOptions(rate=RATE, quat_order="wxyz"))
    # The order matters: the 2.x file read as xyzw is far off (what the old reader did to 3.x files).
    [wrong] = open_source(tmp_path / "lab2.hdf5", SourceOptions(rate=RATE, quat_order="xyzw"))
    assert rotation_error_deg(wrong.recording.poses, trajectory()) > 30


@pytest.mark.parametrize("generation", ["2", "3"])
def test_image_term_named_after_the_camera_gives_the_first_frame(tmp_path, generation):
    # Isaac Lab's visuomotor configs: `wrist_cam = ObsTerm(func=mdp.image[_rgb], params={"sensor_cfg":
    # SceneEntityCfg("wrist_cam"), "normalize": False})` -> obs/wrist_cam [N, H, W, 3] uint8.
    write_dataset(tmp_path / "d.hdf5", generation, "quat_w_ros", image_term="wrist_cam")
    order = {"2": "wxyz", "3": None}[generation]
    [source] = open_source(tmp_path / "d.hdf5", SourceOptions(rate=RATE, quat_order=order))
    assert source.recording.camera_prim == "wrist_cam"
    assert source.recording.resolution == (H, W)
    assert np.array_equal(source.recording.first_frame, frames()[0])
    out = write_recording_episode(source.recording, tmp_path / "ep", "A wrist camera sweeps.")  # no --image
    assert read_episode(out).image().shape == (H, W, 3)


@pytest.mark.parametrize("generation", ["2", "3"])
def test_demo_frames_become_the_episode_sim_frames(tmp_path, generation):
    """The camera's recorded frames (30 Hz) become the episode's sim frames (16 fps): for each episode
    time the recorded frame nearest to it, the frames compare measures PSNR/SSIM against."""
    from comparison.episode_input import read_episode_input

    write_dataset(tmp_path / "d.hdf5", generation, "quat_w_ros", image_term="wrist_cam")
    order = {"2": "wxyz", "3": None}[generation]
    [source] = open_source(tmp_path / "d.hdf5", SourceOptions(rate=RATE, quat_order=order))
    out = write_recording_episode(source.recording, tmp_path / "ep", "A wrist camera sweeps.")
    episode = read_episode_input(out)
    recorded = frames().astype(np.float32)
    assert episode.sim_source == "frames/" and episode.sim_frames.shape == (len(episode.poses), H, W, 3)
    for k, frame in enumerate(episode.sim_frames):  # JPEG-coded noise: nearest to its own frame by far
        errors = np.abs(recorded - frame.astype(np.float32)).mean(axis=(1, 2, 3))
        assert errors.min() < 0.8 * np.median(errors), k
        assert abs(int(errors.argmin()) / RATE - k / 16) <= 0.5 / RATE + 1e-9, k  # the nearest (a tie: either)


def test_normalized_image_term_names_the_fix(tmp_path):
    write_dataset(tmp_path / "d.hdf5", "3", "quat_w_ros", image_term="")
    with h5py.File(tmp_path / "d.hdf5", "a") as h5:  # a normalize=True term: float images
        h5["data/demo_0/obs/wrist_cam"] = np.zeros((N, H, W, 3), np.float32)
    with pytest.raises(EpisodeError, match="normalize=False"):
        open_source(tmp_path / "d.hdf5", SourceOptions(rate=RATE))
    with h5py.File(tmp_path / "d.hdf5", "a") as h5:
        del h5["data/demo_0/obs/wrist_cam"]
    with pytest.raises(EpisodeError, match="--image"):
        open_source(tmp_path / "d.hdf5", SourceOptions(rate=RATE))
    [source] = open_source(tmp_path / "d.hdf5", SourceOptions(rate=RATE, resolution=(H, W)))
    assert source.recording.first_frame is None
    env_args = json.loads(h5py.File(tmp_path / "d.hdf5")["data"].attrs["env_args"])
    assert source.recording.scene_id == env_args["env_name"]
