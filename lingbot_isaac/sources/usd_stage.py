"""Trajectory source: a USD stage with a time-sampled camera (pxr only, runs on usd-core)."""

from __future__ import annotations

from pathlib import Path

from lingbot_isaac.camera import CameraError, find_cameras, sample_camera
from lingbot_isaac.recording import CameraRecording

# Cameras Kit adds to every stage for its viewports; never the robot's camera.
KIT_VIEWPORT_CAMERAS = (
    "/OmniverseKit_Persp",
    "/OmniverseKit_Front",
    "/OmniverseKit_Top",
    "/OmniverseKit_Right",
)


def pick_camera(cameras: list[str], wanted: str | None, where: str) -> str:
    """The camera prim path to use: `wanted` (a path or a unique name) or the only candidate."""
    candidates = [c for c in cameras if c not in KIT_VIEWPORT_CAMERAS]
    if wanted:
        matches = [c for c in cameras if c == wanted] or [
            c for c in cameras if c.rsplit("/", 1)[-1] == wanted
        ]
        if len(matches) == 1:
            return matches[0]
        raise CameraError(
            f"{where}: camera {wanted!r} {'is ambiguous' if matches else 'not found'}; "
            f"cameras: {cameras or 'none'}"
        )
    if len(candidates) == 1:
        return candidates[0]
    raise CameraError(
        f"{where}: {'no camera' if not candidates else 'several cameras'} "
        f"({candidates}); pick one with --camera PRIM_PATH"
    )


def read_usd_stage(path: Path, resolution: tuple[int, int], camera: str | None = None) -> CameraRecording:
    """Sample the stage's camera at every authored time code; `resolution` is (H, W) of the render."""
    from pxr import Usd

    stage = Usd.Stage.Open(str(path))
    if stage is None:
        raise CameraError(f"{path}: USD could not open this stage")
    prim_path = pick_camera(find_cameras(stage), camera, str(path))
    height, width = resolution
    track = sample_camera(stage, prim_path, width, height)
    if len(track.times) < 2:
        raise CameraError(
            f"{path}: camera {prim_path} is not animated (no time samples on it or its parents)"
        )
    return CameraRecording(
        times=track.times - track.times[0],
        poses=track.poses,
        intrinsics=track.intrinsics,
        resolution=track.resolution,
        camera_prim=prim_path,
        meters_per_unit=track.meters_per_unit,
        source=str(path),
        scene_id=Path(path).stem,
        extra={
            "time_codes_per_second": stage.GetTimeCodesPerSecond(),
            "first_time_code": float(track.time_codes[0]),
        },
    )
