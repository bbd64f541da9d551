"""Trajectory source: Isaac Lab HDF5 datasets (`isaaclab.utils.datasets.HDF5DatasetFileHandler`).

Layout: `data/` (attribute `env_args`, JSON) with one group per demo, `data/demo_<i>/`, holding
whatever the recorder terms wrote (`obs/...`, `actions`, `states/...`). Isaac Lab has no fixed
name for camera poses, so we look for what its `Camera` sensor exposes (`camera.data`), recorded
as observation terms with a common prefix (a group `obs/<cam>/...` or names `obs/<cam>_...`):

    <prefix>pos_w                [N, 3]  camera position in the world frame (metres)
    <prefix>quat_w_ros           [N, 4]  (w, x, y, z), camera axes +Z forward, -Y up (= OpenCV)
      or <prefix>quat_w_opengl           (w, x, y, z), USD camera axes (-Z forward, +Y up)
      or <prefix>quat_w_world            (w, x, y, z), +X forward, +Z up
    <prefix>intrinsic_matrices   [N, 3, 3] (or [3, 3]) pinhole K in pixels of the image
    <prefix>rgb                  optional [N, H, W, 3|4] uint8 frames: the first frame and resolution

Demos carry no time stamps, so the env step rate is needed (`--rate`, Hz = 1 / (sim.dt *
decimation)) unless a `<prefix>timestamp` or demo-level `timestamps` dataset [N] (seconds) exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from contracts.episode import EpisodeError
from lingbot_isaac.recording import CameraRecording

# Camera-axes -> OpenCV-axes change of basis for each Isaac Lab orientation convention.
CONVENTIONS = {
    "quat_w_ros": np.eye(3),
    "quat_w_opengl": np.diag([1.0, -1.0, -1.0]),
    # world: x forward, y left, z up -> OpenCV x right = -y, y down = -z, z forward = +x
    "quat_w_world": np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]),
}


def is_isaaclab_dataset(h5) -> bool:
    return "data" in h5 and any(k.startswith("demo_") for k in h5["data"])


def _datasets(group) -> dict[str, object]:
    found = {}

    def visit(name, item):
        if hasattr(item, "shape"):
            found[name] = item

    group.visititems(visit)
    return found


def find_cameras(demo) -> dict[str, tuple[str, str]]:
    """{camera name: (prefix, orientation convention)} of the camera pose sets in one demo."""
    datasets = _datasets(demo)
    cameras = {}
    for name in datasets:
        if not name.endswith("pos_w"):
            continue
        prefix = name[: -len("pos_w")]
        for convention in CONVENTIONS:
            if prefix + convention in datasets and prefix + "intrinsic_matrices" in datasets:
                label = prefix.rstrip("/_").rsplit("/", 1)[-1] or "camera"
                cameras[label] = (prefix, convention)
                break
    return cameras


def _squeeze(array: np.ndarray, tail: tuple[int, ...], where: str) -> np.ndarray:
    """[N, 1, *tail] (one sensor per env) -> [N, *tail]."""
    array = np.asarray(array)
    if array.ndim == len(tail) + 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.shape[1:] != tail:
        raise EpisodeError(f"{where}: shape {array.shape}, expected [N, {', '.join(map(str, tail))}]")
    return array


def _demo_key(name: str) -> int:
    match = re.fullmatch(r"demo_(\d+)", name)
    return int(match.group(1)) if match else 1 << 30


def read_isaaclab_dataset(
    path: Path,
    camera: str | None = None,
    rate: float | None = None,
    resolution: tuple[int, int] | None = None,
) -> list[tuple[str, CameraRecording]]:
    """One CameraRecording per demo; `resolution` (H, W) is needed when no `<prefix>rgb` exists."""
    import h5py

    recordings = []
    with h5py.File(path, "r") as h5:
        data = h5["data"]
        try:
            env_name = json.loads(data.attrs.get("env_args", "{}")).get("env_name") or None
        except (TypeError, json.JSONDecodeError):
            env_name = None
        for name in sorted((k for k in data if k.startswith("demo_")), key=_demo_key):
            demo = data[name]
            where = f"{path}:data/{name}"
            cameras = find_cameras(demo)
            if camera:
                cameras = {k: v for k, v in cameras.items() if camera in (k, v[0], v[0].rstrip("/_"))}
            if len(cameras) != 1:
                raise EpisodeError(
                    f"{where}: {'several' if cameras else 'no'} camera pose sets {sorted(cameras) or ''} "
                    f"{'matching ' + repr(camera) if camera else ''}; record <cam>_pos_w, <cam>_quat_w_ros "
                    "and <cam>_intrinsic_matrices observation terms (see docs/isaac-sim.md) or pick one "
                    "with --camera"
                )
            label, (prefix, convention) = next(iter(cameras.items()))
            position = _squeeze(demo[prefix + "pos_w"][()], (3,), f"{where}/{prefix}pos_w")
            quat = _squeeze(demo[prefix + convention][()], (4,), f"{where}/{prefix}{convention}")
            k = np.asarray(demo[prefix + "intrinsic_matrices"][()], dtype=np.float64)
            if k.shape == (3, 3):
                k = np.broadcast_to(k, (len(position), 3, 3))
            k = _squeeze(k, (3, 3), f"{where}/{prefix}intrinsic_matrices")
            n = min(len(position), len(quat), len(k))
            if n < 2:
                raise EpisodeError(f"{where}: only {n} camera sample(s)")

            first_frame = None
            if prefix + "rgb" in demo:
                rgb = demo[prefix + "rgb"]
                frame = np.asarray(rgb[0] if rgb.ndim == 4 else rgb[0, 0])
                if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] not in (3, 4):
                    raise EpisodeError(f"{where}/{prefix}rgb: expected uint8 [N, H, W, 3|4] frames")
                first_frame = np.ascontiguousarray(frame[..., :3])
                resolution = first_frame.shape[:2]
            if resolution is None:
                raise EpisodeError(
                    f"{where}: no {prefix}rgb frames to take the image size from; "
                    "pass --image (or --resolution WxH)"
                )

            times = None
            for candidate in (prefix + "timestamp", "timestamps"):
                if candidate in demo:
                    times = np.asarray(demo[candidate][()], dtype=np.float64).reshape(-1)[:n]
            if times is None:
                if not rate:
                    raise EpisodeError(
                        f"{where}: no time stamps in the demo; pass --rate HZ (the env step "
                        "rate, 1 / (sim.dt * decimation))"
                    )
                times = np.arange(n) / float(rate)

            poses = np.tile(np.eye(4), (n, 1, 1))
            rotation = Rotation.from_quat(quat[:n].astype(np.float64)[:, [1, 2, 3, 0]]).as_matrix()
            poses[:, :3, :3] = rotation @ CONVENTIONS[convention]
            poses[:, :3, 3] = position[:n]
            intrinsics = np.stack([k[:n, 0, 0], k[:n, 1, 1], k[:n, 0, 2], k[:n, 1, 2]], axis=1)
            recordings.append(
                (
                    name,
                    CameraRecording(
                        times=times - times[0],
                        poses=poses,
                        intrinsics=intrinsics,
                        resolution=(int(resolution[0]), int(resolution[1])),
                        camera_prim=label,
                        source=where,
                        scene_id=env_name,
                        first_frame=first_frame,
                        extra={"orientation_convention": convention, "dataset_prefix": prefix},
                    ),
                )
            )
    if not recordings:
        raise EpisodeError(f"{path}: no demos under data/")
    return recordings
