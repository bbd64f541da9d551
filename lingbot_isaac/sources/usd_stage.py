"""Trajectory source: a USD stage with a time-sampled camera (pxr only, runs on usd-core).

The stage is sampled at the episode's own times, t0 + k / fps (t0 = the first authored time code
of the camera or its ancestors), and USD evaluates the stage there. USD interpolates each
authored attribute on its own (a parent's Euler angles, a translate, a focal length), so with
sparse keys the camera follows the arc USD draws, not the chord between the keyed poses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lingbot_isaac.camera import CameraError, camera_time_codes, find_cameras, sample_camera
from lingbot_isaac.recording import CameraRecording
from lingbot_isaac.resample import EPISODE_FPS
from lingbot_isaac.usd_file import open_stage

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
        matches = [c for c in cameras if c == wanted] or [c for c in cameras if c.rsplit("/", 1)[-1] == wanted]
        if len(matches) == 1:
            return matches[0]
        raise CameraError(
            f"{where}: camera {wanted!r} {'is ambiguous' if matches else 'not found'}; cameras: {cameras or 'none'}"
        )
    if len(candidates) == 1:
        return candidates[0]
    raise CameraError(
        f"{where}: {'no camera' if not candidates else 'several cameras'} "
        f"({candidates}); pick one with --camera PRIM_PATH"
    )


def episode_time_codes(authored: np.ndarray, codes_per_second: float, fps: float) -> np.ndarray:
    """Time codes t0 + k / fps (in codes) for k = 0 .. while within the authored range."""
    span = (authored[-1] - authored[0]) / codes_per_second
    k = np.arange(int(np.floor(span * fps + 1e-9)) + 1)
    return authored[0] + k * (codes_per_second / fps)


def read_usd_stage(
    path: Path, resolution: tuple[int, int], camera: str | None = None, fps: float = EPISODE_FPS
) -> CameraRecording:
    """Sample the stage's camera at the episode's times (`fps`); `resolution` is (H, W) of the render."""
    stage = open_stage(path)
    prim_path = pick_camera(find_cameras(stage), camera, str(path))
    height, width = resolution
    authored = camera_time_codes(stage, stage.GetPrimAtPath(prim_path))
    if len(authored) < 2:
        raise CameraError(f"{path}: camera {prim_path} is not animated (no time samples on it or its parents)")
    per_second = stage.GetTimeCodesPerSecond() or 24.0
    codes = episode_time_codes(authored, per_second, fps)
    track = sample_camera(stage, prim_path, width, height, time_codes=codes)
    # k / fps exactly, so the resampler to `fps` finds every frame as a sample and keeps USD's value.
    times = np.arange(len(codes)) / fps
    return CameraRecording(
        times=times,
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
            "last_authored_time_code": float(authored[-1]),
            "sampled": f"USD evaluated at t0 + k/{fps:g} s",
        },
    )
