#!/usr/bin/env python
"""Build `data/sample_room/`: the sample episode with a "sim" render whose camera poses are exact.

    python scripts/make_sample_episode.py [--out data/sample_room] [--no-sim-video]

1. `room.usda`: a centimetre stage (metersPerUnit 0.01, Z up) with boxes where the renderer's
   room and boxes are, and a camera animated at 60 time codes per second (a "sim" step) for 2 s.
2. The episode, exported from that stage by our own code (`sources.usd_stage` ->
   `recording.write_recording_episode`): 16 fps, 33 frames (4n+1), 832x480.
3. `sim.mp4`: every episode frame rendered by `room_render` from the episode's own poses.

Everything is deterministic: running it again gives the same stage, poses and intrinsics.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contracts.episode import read_episode  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH, from_model_intrinsics  # noqa: E402
from lingbot_isaac.camera import numpy_to_gf, opencv_to_usd_local_to_world  # noqa: E402
from lingbot_isaac.recording import write_recording_episode  # noqa: E402
from lingbot_isaac.sources.usd_stage import read_usd_stage  # noqa: E402
from tests.room_render import BOXES, ROOM_MAX, ROOM_MIN, look_at, render_room  # noqa: E402

HEIGHT, WIDTH = MODEL_HEIGHT, MODEL_WIDTH
CODES_PER_SECOND = 60  # the "sim" rate; the episode is resampled to 16 fps
SECONDS = 2.0
METERS_PER_UNIT = 0.01
FOCAL_LENGTH, HORIZONTAL_APERTURE = 15.0, 20.955  # about 60 deg horizontal field of view
PROMPT = (
    "A slow handheld walk through a small room whose walls, floor and ceiling are covered in colourful "
    "geometric patterns of squares, frames and dots; several patterned boxes stand on the floor. The "
    "camera moves forward and pans to the right, steady and smooth, in bright even light."
)


def camera_path(t: np.ndarray) -> np.ndarray:
    """OpenCV camera-to-world poses in metres: forward along +y while panning right and bobbing."""
    s = t / SECONDS
    eyes = np.stack([0.5 * np.sin(np.pi * s) - 0.2, -1.2 + 2.0 * s, 1.45 + 0.05 * np.sin(2 * np.pi * s)], axis=1)
    yaw = np.radians(-20 + 55 * s)  # turning right = towards +x
    targets = eyes + np.stack([np.sin(yaw), np.cos(yaw), -0.18 * np.ones_like(s)], axis=1)
    return np.stack([look_at(e, g) for e, g in zip(eyes, targets, strict=True)])


def write_stage(path: Path) -> None:
    from pxr import Gf, Usd, UsdGeom

    stage = Usd.Stage.CreateNew(str(path))
    stage.SetMetadata("comment", "lingbot-isaac sample: made by scripts/make_sample_episode.py")
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, METERS_PER_UNIT)
    stage.SetTimeCodesPerSecond(CODES_PER_SECOND)
    end = int(SECONDS * CODES_PER_SECOND)
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(end)
    world = UsdGeom.Xform.Define(stage, "/World")
    stage.SetDefaultPrim(world.GetPrim())
    to_units = 1.0 / METERS_PER_UNIT

    def box(name: str, lo, hi) -> None:
        cube = UsdGeom.Cube.Define(stage, f"/World/Room/{name}")
        lo, hi = np.asarray(lo) * to_units, np.asarray(hi) * to_units
        cube.GetSizeAttr().Set(1.0)
        cube.AddTranslateOp().Set(Gf.Vec3d(*((lo + hi) / 2)))
        cube.AddScaleOp().Set(Gf.Vec3f(*(hi - lo)))

    UsdGeom.Xform.Define(stage, "/World/Room")
    box("Shell", ROOM_MIN, ROOM_MAX)  # seen from inside (render with doubleSided / backface off)
    UsdGeom.Cube.Get(stage, "/World/Room/Shell").GetDoubleSidedAttr().Set(True)
    for i, (lo, hi) in enumerate(BOXES):
        box(f"Box{i}", lo, hi)

    camera = UsdGeom.Camera.Define(stage, "/World/Camera")
    camera.GetFocalLengthAttr().Set(FOCAL_LENGTH)
    camera.GetHorizontalApertureAttr().Set(HORIZONTAL_APERTURE)
    camera.GetVerticalApertureAttr().Set(HORIZONTAL_APERTURE * HEIGHT / WIDTH)  # square pixels
    camera.GetClippingRangeAttr().Set(Gf.Vec2f(1.0, 10000.0))
    transform = camera.AddTransformOp()
    codes = np.arange(end + 1)
    for code, pose in zip(codes, camera_path(codes / CODES_PER_SECOND), strict=True):
        transform.Set(numpy_to_gf(opencv_to_usd_local_to_world(pose, METERS_PER_UNIT)), int(code))
    stage.GetRootLayer().Save()


def build(out: Path, sim_video: bool = True) -> Path:
    """Write the stage, the episode and (optionally) sim.mp4 into `out` (replaced whole)."""
    out = Path(out)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        staging = Path(tmp) / "sample"
        staging_stage = Path(tmp) / "room.usda"
        write_stage(staging_stage)
        recording = read_usd_stage(staging_stage, (HEIGHT, WIDTH), "/World/Camera")
        recording.source = "room.usda"  # relative: the stage sits in the episode folder
        recording.scene_id = "sample_room"
        first = render_room(recording.poses[0], tuple(recording.intrinsics[0]), HEIGHT, WIDTH)
        write_recording_episode(recording, staging, PROMPT, image=first)
        if sim_video:
            from contracts.video import write_mp4

            # Render from the poses exactly as stored (float32), then write the episode again with them.
            episode = read_episode(staging)
            k = from_model_intrinsics(episode.intrinsics[0], HEIGHT, WIDTH)
            frames = (render_room(pose.astype(np.float64), tuple(k), HEIGHT, WIDTH) for pose in episode.poses)
            video = write_mp4(Path(tmp) / "sim.mp4", frames, fps=episode.meta.fps)
            write_recording_episode(recording, staging, PROMPT, image=first, sim_frames=video, overwrite=True)
        shutil.copyfile(staging_stage, staging / "room.usda")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(out))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "data" / "sample_room")
    parser.add_argument("--no-sim-video", action="store_true", help="skip rendering sim.mp4 (fast)")
    args = parser.parse_args()
    out = build(args.out, sim_video=not args.no_sim_video)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
