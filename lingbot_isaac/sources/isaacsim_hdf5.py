"""Trajectory source: Isaac Sim 6 episode-recorder sessions (`isaacsim.replicator.episode_recorder`).

Layout of such an HDF5 file (schema_version 2), as written by that extension's SessionStorage
(Isaac Sim source, `source/extensions/isaacsim.replicator.episode_recorder/isaacsim/replicator/
episode_recorder/`: `storage.py` "HDF5 V2 layout", `manifest.py`, `recordables/camera.py`,
`recordables/sim_time.py`; read in the public mirror stevenf7/IsaacSim):

    @schema_version = 2
    manifest/tracks              JSON list: {"type": "camera", "group": ..., "prim_path": ...,
                                 "resolution": [width, height]} per camera, {"type": "sim_time", ...}
    manifest/coord_conventions   JSON: quaternion_order "wxyz", position_units "meters"
    episodes/episode_00000/<group>/position             [N, 3] world position
                                  /orientation          [N, 4] world orientation (w, x, y, z), USD camera axes
                                  /focal_length, horizontal_aperture, vertical_aperture   [N]
    episodes/episode_00000/<sim_time group>/sim_time    [N] seconds (default group "meta/time")

The recorder stores no aperture offsets (taken as 0) and no image, so the first frame comes from
elsewhere (`--image`). Samples with a repeated sim time (a paused sim) are dropped.

No camera frames: such a file cannot hold the camera's RGB. Its built-in recordables are sim time,
articulations, rigid bodies, xforms, cameras and USD attributes, and `CameraRecordable` records
only `position`, `orientation`, `focal_length`, `horizontal_aperture`, `vertical_aperture` and
`clipping_range` per frame ("world pose + intrinsics"; `resolution` sits in the manifest). Its
images are meant to be rendered again: "record a simulation, replay visuals via Replicator", a
render product on the camera while `EpisodeReplayer` plays the session back. So the episodes made
from it have no sim frames (`no_frames_note` says so, and how to get them).

Units: `position` is in stage units (the recorder reads world transforms as they are); the
manifest's "position_units": "meters" is the recorder's default label, not a measurement, so a
centimetre stage gives numbers 100x too large in metres. metersPerUnit comes from, in order:
`--meters-per-unit`, `--stage scene.usd`, or the stage snapshot the recorder links beside its
sessions (`stage_snapshot.usd`, written by `export_stage_snapshot` / the UI's Export Scene);
without any of them the file is refused, never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from contracts.episode import EpisodeError
from lingbot_isaac.lens import pinhole_intrinsics
from lingbot_isaac.recording import CameraRecording

USD_TO_OPENCV_AXES = np.diag([1.0, -1.0, -1.0])
# What `isaacsim.replicator.episode_recorder.export_stage_snapshot(output_dir)` writes beside the
# sessions of that folder (the standalone example episode_record_replay.py expects these names).
STAGE_SNAPSHOT = "stage_snapshot.usd"


def no_frames_note(paths: list[Path]) -> str:
    """What `replay` says once about recorder sessions: no sim frames in them, and how to get some."""
    named = ", ".join(str(p) for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (
        f"note: {named}: an Isaac Sim episode-recorder session holds no camera images (its camera track "
        "records pose and lens only), so these episodes get no sim frames and `lingbot-isaac compare` has no "
        "sim video to compare with. To get them, record the camera with the LingBot World window (Settings > "
        "Keep every sim frame) while Isaac Sim's Episode Recorder replays the session (Tools > Replicator > "
        "Episode Recorder > Replay), or record the scene with that window or scripts/isaac_record_and_generate.py "
        "--keep-frames instead of the episode recorder (docs/isaac-sim.md)"
    )


def stage_meters_per_unit(stage_path: Path, where: str) -> float:
    """metersPerUnit of a USD stage (needs usd-core)."""
    try:
        from pxr import UsdGeom

        from lingbot_isaac.usd_file import UsdFileError, open_stage
    except ImportError:
        raise EpisodeError(
            f"{where}: reading metersPerUnit from {stage_path} needs usd-core (pip install "
            "'lingbot-isaac[usd]'), or pass --meters-per-unit"
        ) from None
    try:
        stage = open_stage(stage_path, load_payloads=False)  # layer metadata only, no payloads
    except UsdFileError as exc:
        raise EpisodeError(
            f"{exc}; it gives the units of {where} (or pass --meters-per-unit, or --stage another file)"
        ) from None
    return float(UsdGeom.GetStageMetersPerUnit(stage))


def session_meters_per_unit(path: Path, meters_per_unit: float | None, stage: Path | None) -> tuple[float, str]:
    """(metersPerUnit, where it came from) for a recorder session's positions."""
    if meters_per_unit is not None:
        if not (np.isfinite(meters_per_unit) and meters_per_unit > 0):
            raise EpisodeError(f"--meters-per-unit must be a positive number (got {meters_per_unit})")
        return float(meters_per_unit), "--meters-per-unit"
    if stage is not None:
        if not Path(stage).is_file():
            raise EpisodeError(f"--stage {stage}: no such file")
        return stage_meters_per_unit(Path(stage), str(path)), f"--stage {stage}"
    snapshot = Path(path).parent / STAGE_SNAPSHOT
    if snapshot.is_file():
        return stage_meters_per_unit(snapshot, str(path)), str(snapshot)
    raise EpisodeError(
        f"{path}: the recorder stores positions in stage units and nothing says which (no "
        f"{STAGE_SNAPSHOT} beside it); pass --stage SCENE.usd (the stage it was recorded on) or "
        "--meters-per-unit (1 for a metre stage, Isaac Sim's default; 0.01 for a centimetre stage)"
    )


def is_isaacsim_session(h5) -> bool:
    return "episodes" in h5 and "manifest" in h5


def _json(h5, name: str, path: Path):
    raw = h5["manifest"][name][()]
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EpisodeError(f"{path}: manifest/{name} is not JSON ({exc})") from None


def _pick_track(tracks: list[dict], camera: str | None, path: Path) -> dict:
    cameras = [t for t in tracks if t.get("type") == "camera"]
    names = [f"{t.get('group')} ({t.get('prim_path')})" for t in cameras]
    if camera:
        cameras = [t for t in cameras if camera in (t.get("group"), t.get("prim_path"))]
    if len(cameras) == 1:
        return cameras[0]
    what = "no camera track" if not cameras else "several camera tracks"
    matching = f"matching {camera!r} " if camera else ""
    raise EpisodeError(
        f"{path}: {what} {matching}(have {names or 'none'}); "
        "record a CameraRecordable or pick one with --camera GROUP_OR_PRIM_PATH"
    )


def read_isaacsim_session(
    path: Path,
    resolution: tuple[int, int] | None,
    camera: str | None = None,
    meters_per_unit: float | None = None,
    stage: Path | None = None,
) -> list[tuple[str, CameraRecording]]:
    """One CameraRecording per episode of the session. `resolution` (H, W) overrides the manifest's.

    `meters_per_unit` / `stage`: see the module docstring (units).
    """
    import h5py

    recordings = []
    with h5py.File(path, "r") as h5:
        version = int(h5.attrs.get("schema_version", 0))
        if version != 2:
            raise EpisodeError(f"{path}: episode-recorder schema_version {version}; this reader knows 2")
        tracks = _json(h5, "tracks", path)
        conventions = _json(h5, "coord_conventions", path) if "coord_conventions" in h5["manifest"] else {}
        if conventions.get("quaternion_order", "wxyz") != "wxyz":
            raise EpisodeError(f"{path}: quaternion_order {conventions['quaternion_order']!r}, expected 'wxyz'")
        meters_per_unit, units_from = session_meters_per_unit(Path(path), meters_per_unit, stage)
        track = _pick_track(tracks, camera, path)
        group = track["group"]
        time_group = next((t["group"] for t in tracks if t.get("type") == "sim_time"), "meta/time")
        if resolution is not None and "resolution" in track:
            rec_w, rec_h = (int(v) for v in track["resolution"])
            if abs(resolution[0] / resolution[1] - rec_h / rec_w) > 0.01 * rec_h / rec_w:
                raise EpisodeError(
                    f"{path}: the image is {resolution[1]}x{resolution[0]} but camera track "
                    f"{track['group']!r} rendered {rec_w}x{rec_h}; give the first frame of that camera "
                    "(same aspect ratio)"
                )
        if resolution is None:
            if "resolution" not in track:
                raise EpisodeError(
                    f"{path}: camera track {group!r} has no resolution; pass --resolution WxH or --image"
                )
            width, height = (int(v) for v in track["resolution"])
            resolution = (height, width)
        height, width = resolution
        episodes = h5["episodes"]
        for name in sorted(episodes):
            episode = episodes[name]
            where = f"{path}:episodes/{name}"
            try:
                cam = episode[group]
                position = np.asarray(cam["position"], dtype=np.float64)
                orientation = np.asarray(cam["orientation"], dtype=np.float64)
                lens = {
                    k: np.asarray(cam[k], dtype=np.float64)
                    for k in ("focal_length", "horizontal_aperture", "vertical_aperture")
                }
                times = np.asarray(episode[time_group]["sim_time"], dtype=np.float64)
            except KeyError as exc:
                raise EpisodeError(
                    f"{where}: missing {exc.args[0]!r} (camera group {group!r}, time group {time_group!r})"
                ) from None
            n = min(len(times), len(position))
            if n < 2:
                raise EpisodeError(f"{where}: only {n} frame(s) recorded")
            keep = np.concatenate([[True], np.diff(times[:n]) > 0])  # drop samples of a paused sim
            idx = np.flatnonzero(keep)
            rotation = Rotation.from_quat(orientation[idx][:, [1, 2, 3, 0]]).as_matrix()  # wxyz -> xyzw
            poses = np.tile(np.eye(4), (len(idx), 1, 1))
            poses[:, :3, :3] = rotation @ USD_TO_OPENCV_AXES
            poses[:, :3, 3] = position[idx] * meters_per_unit
            intrinsics = pinhole_intrinsics(
                lens["focal_length"][idx],
                lens["horizontal_aperture"][idx],
                lens["vertical_aperture"][idx],
                width,
                height,
                where=where,
            )
            recordings.append(
                (
                    name,
                    CameraRecording(
                        times=times[idx] - times[idx[0]],
                        poses=poses,
                        intrinsics=intrinsics,
                        resolution=(height, width),
                        camera_prim=track.get("prim_path"),
                        meters_per_unit=meters_per_unit,
                        source=where,
                        extra={"sim_time_start": float(times[idx[0]]), "meters_per_unit_from": units_from},
                    ),
                )
            )
    if not recordings:
        raise EpisodeError(f"{path}: the session holds no episodes")
    return recordings
