"""Trajectory source: Isaac Lab HDF5 datasets (`isaaclab.utils.datasets.HDF5DatasetFileHandler`).

Layout: `data/` (attribute `env_args`, JSON) with one group per demo, `data/demo_<i>/`, holding
whatever the recorder terms wrote (`obs/...`, `actions`, `states/...`). Isaac Lab has no fixed
name for camera poses, so we look for what its `Camera` sensor exposes (`camera.data`), recorded
as observation terms with a common prefix (a group `obs/<cam>/...` or names `obs/<cam>_...`):

    <prefix>pos_w                [N, 3]  camera position in the world frame (metres)
    <prefix>quat_w_ros           [N, 4]  camera axes +Z forward, -Y up (= OpenCV)
      or <prefix>quat_w_opengl           USD camera axes (-Z forward, +Y up)
      or <prefix>quat_w_world            +X forward, +Z up
    <prefix>intrinsic_matrices   [N, 3, 3] (or [3, 3]) pinhole K in pixels of the image
    <cam>  or <prefix>rgb        optional [N, H, W, 3|4] uint8 frames: the first frame, the resolution
                                 and the episode's sim frames (what `compare` measures PSNR/SSIM
                                 against; `<cam>` is how Isaac Lab's own configs name an
                                 `mdp.image` / `mdp.image_rgb` term, e.g. `wrist_cam`)

Quaternion order: Isaac Lab 2.x stored (w, x, y, z); Isaac Lab 3.x stores (x, y, z, w). Isaac
Lab 3.x's handler marks its files with the root attribute `format_version` (1 = xyzw; Isaac Lab
itself reads a missing mark as the legacy wxyz). A file without the mark is read only with an
explicit order (`--quat-order`, or `quat_order` in config/isaac.toml): never guessed.

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
from lingbot_isaac.recording import CameraRecording, FrameReader

# Camera-axes -> OpenCV-axes change of basis for each Isaac Lab orientation convention.
CONVENTIONS = {
    "quat_w_ros": np.eye(3),
    "quat_w_opengl": np.diag([1.0, -1.0, -1.0]),
    # world: x forward, y left, z up -> OpenCV x right = -y, y down = -z, z forward = +x
    "quat_w_world": np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]),
}


QUAT_ORDERS = ("wxyz", "xyzw")
# Isaac Lab 3.x `HDF5DatasetFileHandler.create` writes this root attribute; from version 1 on,
# quaternions are (x, y, z, w) (isaaclab/utils/datasets/hdf5_dataset_file_handler.py).
FORMAT_VERSION_ATTR = "format_version"
FIRST_XYZW_FORMAT_VERSION = 1


def quaternion_order(h5, path: Path, requested: str | None, default: str | None = None) -> tuple[str, str]:
    """(order, why) of a dataset's quaternions: its `format_version` mark, else `requested`, else `default`.

    A mark and a different `requested` (command-line) order contradict each other; the `default`
    (config) only applies to unmarked files. A file with neither a mark nor an order is refused:
    a wrong order turns rotations by up to 180 degrees without any error.
    """
    for value in (requested, default):
        if value is not None and value not in QUAT_ORDERS:
            raise EpisodeError(f"quaternion order must be one of {', '.join(QUAT_ORDERS)} (got {value!r})")
    if FORMAT_VERSION_ATTR in h5.attrs:
        version = int(h5.attrs[FORMAT_VERSION_ATTR])
        order = "xyzw" if version >= FIRST_XYZW_FORMAT_VERSION else "wxyz"
        why = f"{FORMAT_VERSION_ATTR} {version} ({'Isaac Lab 3.x' if order == 'xyzw' else 'legacy Isaac Lab 2.x'})"
        if requested is not None and requested != order:
            raise EpisodeError(
                f"{path}: the file says {why}, i.e. {order} quaternions, but --quat-order is {requested}; "
                "drop --quat-order (the file's mark is what Isaac Lab itself reads)"
            )
        return order, why
    if requested is None and default is not None:
        return default, "[isaaclab] quat_order of config/isaac.toml (the file carries no format_version)"
    if requested is None:
        raise EpisodeError(
            f"{path}: no '{FORMAT_VERSION_ATTR}' attribute, so the quaternion order is unknown: Isaac Lab "
            "2.x datasets store (w, x, y, z), Isaac Lab 3.x datasets store (x, y, z, w) (and mark their "
            f"files with {FORMAT_VERSION_ATTR} = 1). Pass --quat-order wxyz for an Isaac Lab 2.x file or "
            "--quat-order xyzw for Isaac Lab 3.x (or set quat_order in config/isaac.toml)"
        )
    return requested, "--quat-order (the file carries no format_version)"


def is_isaaclab_dataset(h5) -> bool:
    return "data" in h5 and any(k.startswith("demo_") for k in h5["data"])


def is_empty_isaaclab_dataset(h5) -> bool:
    """A `data/` group with the attributes Isaac Lab's `HDF5DatasetFileHandler.create` writes
    (`env_args`, `total`) but no demo: a recording that ended before its first demo was exported."""
    data = h5.get("data")
    return (
        data is not None
        and hasattr(data, "keys")
        and not any(k.startswith("demo_") for k in data)
        and ("env_args" in data.attrs or "total" in data.attrs)
    )


def empty_dataset_error(path: Path) -> EpisodeError:
    return EpisodeError(
        f"{path}: an empty Isaac Lab dataset (data/ holds no demo_* group): nothing to replay; Isaac Lab "
        "writes a demo only when an episode is exported, so a recording stopped before its first export "
        "leaves the file empty: record again, or give the dataset that has the demos"
    )


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


def _rgb_frames(images: np.ndarray, where: str) -> np.ndarray:
    """Frames of an image term [n, H, W, C] (or [n, 1, H, W, C], or channel-first) -> uint8 RGB [n, H, W, 3].

    Frame-stacked terms hold the frames oldest to newest along channels: the newest is the last
    three channels.
    """
    if images.ndim == 5 and images.shape[1] == 1:  # [N, 1, H, W, C]: one sensor per env
        images = images[:, 0]
    if images.ndim != 4:
        raise EpisodeError(f"{where}: expected image frames [N, H, W, C] (got {images.shape})")
    if images.shape[-1] % 3 and images.shape[-1] != 4 and images.shape[1] in (3, 4, 6, 9, 12):
        images = np.moveaxis(images, 1, -1)  # channel_first=True terms
    channels = images.shape[-1]
    if images.dtype != np.uint8 or not (channels == 4 or channels % 3 == 0):
        raise EpisodeError(
            f"{where}: {images.dtype} images with {channels} channels are not RGB frames; record the "
            "camera term with normalize=False (uint8 RGB) or give the first frame with --image"
        )
    rgb = images[..., :3] if channels in (3, 4) else images[..., -3:]
    return np.ascontiguousarray(rgb)


class DemoFrames(FrameReader):
    """The frames of one demo's image term, read from the file only when an episode is written
    (a dataset of hundreds of demos is never held in memory)."""

    def __init__(self, path: Path, name: str, count: int) -> None:
        self.path, self.name, self.count = Path(path), name, count

    def __len__(self) -> int:
        return self.count

    def read(self, indices) -> list[np.ndarray]:
        import h5py

        wanted = sorted({int(i) for i in indices})  # h5py reads increasing, distinct indices
        with h5py.File(self.path, "r") as h5:
            images = _rgb_frames(h5[self.name][wanted], f"{self.path}:{self.name}")
        at = {index: frame for index, frame in zip(wanted, images, strict=True)}
        return [at[int(i)] for i in indices]


def _image_term(demo, prefix: str, label: str, where: str) -> str | None:
    """The demo's image term of the camera (its dataset name in the demo), or None.

    Isaac Lab's configs name the term after the camera (`wrist_cam = ObsTerm(func=mdp.image_rgb,
    ...)` in 3.x, `func=mdp.image` in 2.x); we also take `<prefix>rgb` and `<prefix>image`.
    """
    group = prefix.rstrip("/_").rsplit("/", 1)[0] + "/" if "/" in prefix.rstrip("/_") else ""
    for name in (prefix + "rgb", group + label, prefix + "image"):
        if name in demo and hasattr(demo[name], "shape"):
            return name
    return None


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
    quat_order: str | None = None,
    default_quat_order: str | None = None,
) -> list[tuple[str, CameraRecording]]:
    """One CameraRecording per demo; `resolution` (H, W) is needed when no image term exists.

    `quat_order` ("wxyz" or "xyzw", the command line's) or `default_quat_order` (the config's) is
    needed only for files without Isaac Lab 3.x's mark (`quaternion_order`).
    """
    import h5py

    recordings = []
    with h5py.File(path, "r") as h5:
        order, order_source = quaternion_order(h5, Path(path), quat_order, default_quat_order)
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

            # The camera's frames: the first frame, and (one per step) the episode's sim frames.
            first_frame, frames = None, None
            term = _image_term(demo, prefix, label, where)
            if term is not None:
                first_frame = _rgb_frames(demo[term][:1], f"{where}/{term}")[0]
                resolution = first_frame.shape[:2]
                if len(demo[term]) >= n:
                    frames = DemoFrames(Path(path), f"{demo.name}/{term}", n)
            if resolution is None:
                raise EpisodeError(
                    f"{where}: no image term ({label} or {prefix}rgb) to take the image size from; "
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
            quat = quat[:n].astype(np.float64)
            # scipy takes (x, y, z, w), Isaac Lab 3.x's own order; 2.x's (w, x, y, z) is rolled to it.
            rotation = Rotation.from_quat(quat if order == "xyzw" else quat[:, [1, 2, 3, 0]]).as_matrix()
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
                        frames=frames,
                        extra={
                            "orientation_convention": convention,
                            "dataset_prefix": prefix,
                            "quaternion_order": order,
                            "quaternion_order_from": order_source,
                        },
                    ),
                )
            )
    if not recordings:
        raise empty_dataset_error(Path(path))
    return recordings
