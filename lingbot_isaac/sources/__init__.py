"""Trajectory sources for `lingbot-isaac replay`: what a path holds and how to read it.

- an episode folder (ours or a LingBot-World example folder): sent as it is;
- a folder of episode folders: each of them;
- a USD stage (`.usd`, `.usda`, `.usdc`, `.usdz`) with a time-sampled camera (`usd_stage`);
- an Isaac Sim 6 episode-recorder session `.hdf5` (`isaacsim_hdf5`);
- an Isaac Lab dataset `.hdf5` holding camera poses (`isaaclab_hdf5`).

Each reader is imported only when its kind of file shows up, so pxr and h5py stay optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contracts.episode import EpisodeError, is_episode_dir
from contracts.model_frame import MODEL_FRAME
from lingbot_isaac.recording import CameraRecording

HDF5_SUFFIXES = (".hdf5", ".h5", ".he5")
USD_SUFFIXES = (".usd", ".usda", ".usdc", ".usdz")


@dataclass
class SourceOptions:
    camera: str | None = None  # prim path, recorder group or Isaac Lab camera name
    resolution: tuple[int, int] | None = None  # (H, W) the intrinsics are for (e.g. the image's size)
    rate: float | None = None  # Isaac Lab env step rate in Hz (demos have no time stamps)
    meters_per_unit: float | None = None  # recorder positions' unit, when the recording does not say
    quat_order: str | None = None  # "wxyz" (Isaac Lab 2.x) / "xyzw" (3.x) for datasets without a mark
    default_quat_order: str | None = None  # the same from config/isaac.toml (never overrides a mark)
    stage: Path | None = None  # the USD stage a recorder session was recorded on (its metersPerUnit)


@dataclass
class TrajectorySource:
    """One trajectory to replay: an existing episode folder, or a recording to export first."""

    name: str
    origin: Path
    episode_dir: Path | None = None
    recording: CameraRecording | None = None


def kind_of(path: Path) -> str:
    """'episode', 'episodes', 'usd', 'isaacsim-hdf5' or 'isaaclab-hdf5' (EpisodeError otherwise)."""
    if path.is_dir():
        if is_episode_dir(path):
            return "episode"
        if any(is_episode_dir(p) for p in path.iterdir()):
            return "episodes"
        raise EpisodeError(
            f"{path}: a folder without poses.npy/intrinsics.npy (not an episode folder) and no episode folders inside"
        )
    if not path.exists():
        raise EpisodeError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix in USD_SUFFIXES:
        return "usd"
    if suffix in HDF5_SUFFIXES:
        try:
            import h5py
        except ImportError:
            raise EpisodeError(f"{path}: reading HDF5 needs h5py (pip install 'lingbot-isaac[hdf5]')") from None
        from lingbot_isaac.sources.isaaclab_hdf5 import (
            empty_dataset_error,
            is_empty_isaaclab_dataset,
            is_isaaclab_dataset,
        )
        from lingbot_isaac.sources.isaacsim_hdf5 import is_isaacsim_session

        try:
            with h5py.File(path, "r") as h5:
                if is_isaacsim_session(h5):
                    return "isaacsim-hdf5"
                if is_isaaclab_dataset(h5):
                    return "isaaclab-hdf5"
                empty = is_empty_isaaclab_dataset(h5)
        except OSError as exc:
            raise EpisodeError(f"{path}: not a readable HDF5 file ({exc})") from None
        if empty:
            raise empty_dataset_error(path)
        raise EpisodeError(
            f"{path}: HDF5 file is neither an Isaac Sim episode-recorder session (episodes/, "
            "manifest/) nor an Isaac Lab dataset (data/demo_*)"
        )
    raise EpisodeError(f"{path}: unknown kind of source; give an episode folder, a USD stage or an HDF5 file")


def open_source(path: Path, options: SourceOptions) -> list[TrajectorySource]:
    """Every trajectory a path holds, read and validated (errors name the file and the fix)."""
    path = Path(path)
    kind = kind_of(path)
    if kind == "episode":
        return [TrajectorySource(name=path.name, origin=path, episode_dir=path)]
    if kind == "episodes":
        return [
            TrajectorySource(name=p.name, origin=p, episode_dir=p) for p in sorted(path.iterdir()) if is_episode_dir(p)
        ]
    if kind == "usd":
        from lingbot_isaac.sources.usd_stage import read_usd_stage

        resolution = options.resolution or MODEL_FRAME
        recording = read_usd_stage(path, resolution, options.camera)
        return [TrajectorySource(name=path.stem, origin=path, recording=recording)]
    if kind == "isaacsim-hdf5":
        from lingbot_isaac.sources.isaacsim_hdf5 import read_isaacsim_session

        found = read_isaacsim_session(path, options.resolution, options.camera, options.meters_per_unit, options.stage)
    else:
        from lingbot_isaac.sources.isaaclab_hdf5 import read_isaaclab_dataset

        found = read_isaaclab_dataset(
            path, options.camera, options.rate, options.resolution, options.quat_order, options.default_quat_order
        )
    return [TrajectorySource(name=name, origin=path, recording=rec) for name, rec in found]
