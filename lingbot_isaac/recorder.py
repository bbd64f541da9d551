"""Record a camera while the sim runs, then write an episode folder.

No omni imports: the Kit side (`kit_adapter`) calls `Recorder.sample(sim_time, time_code)` on
every physics or render step and hands in a `capture()` function that returns the current RGB
frame of the camera's render product (or None while the renderer has nothing yet). Outside Kit
the same class records from a usd-core stage, which is how it is tested.

What is recorded: the camera's world pose (OpenCV axes, metres) and pinhole intrinsics at every
step, read from the stage at the step's time code (time-sampled animation and physics-written
default values alike); the first frame's RGB, and optionally every frame's. Samples taken before
the first image arrives are dropped, so frame 0's pose is the image's pose. A step that repeats
the previous sim time (a paused sim) is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lingbot_isaac.lens import CameraError
from lingbot_isaac.recording import CameraRecording, write_recording_episode

Capture = Callable[[], "np.ndarray | None"]


class RecorderError(RuntimeError):
    """The recorder was used out of order (stop before start, nothing recorded, ...)."""


@dataclass
class _Samples:
    times: list[float] = field(default_factory=list)
    time_codes: list[float] = field(default_factory=list)
    poses: list[np.ndarray] = field(default_factory=list)
    intrinsics: list[np.ndarray] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)


class Recorder:
    """Samples one camera prim of a stage; `resolution` is (H, W) of its render product."""

    def __init__(
        self,
        stage,
        camera_path: str,
        resolution: tuple[int, int],
        capture: Capture | None = None,
        keep_frames: bool = False,
        max_seconds: float | None = None,
    ) -> None:
        from lingbot_isaac.camera import check_pinhole

        self.stage = stage
        self.camera_path = camera_path
        self.resolution = (int(resolution[0]), int(resolution[1]))
        self.capture = capture
        self.keep_frames = keep_frames
        self.max_seconds = max_seconds
        self.prim = stage.GetPrimAtPath(camera_path)
        if not self.prim:
            raise CameraError(f"no prim at {camera_path!r}; pick the camera prim to record")
        check_pinhole(self.prim)
        self._samples = _Samples()
        self._first_frame: np.ndarray | None = None
        self.recording = False

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._samples = _Samples()
        self._first_frame = None
        self.recording = True

    def sample(self, sim_time: float, time_code: float | None = None) -> bool:
        """Record the camera at this step; False if the step was skipped. Call only while recording."""
        from pxr import Usd

        from lingbot_isaac.camera import camera_intrinsics, camera_pose

        if not self.recording:
            return False
        samples = self._samples
        if samples.times and sim_time <= samples.times[-1]:
            return False  # paused or repeated step
        if self.max_seconds is not None and samples.times and sim_time - samples.times[0] > self.max_seconds:
            self.recording = False
            return False
        frame = None
        if self.capture is not None and (self._first_frame is None or self.keep_frames):
            frame = self.capture()
            if frame is not None:
                frame = _rgb(frame, self.resolution)
            if frame is None and self._first_frame is None:
                return False  # nothing rendered yet: wait, so frame 0's pose is the image's pose
        code = Usd.TimeCode.Default() if time_code is None else Usd.TimeCode(time_code)
        height, width = self.resolution
        samples.times.append(float(sim_time))
        samples.time_codes.append(float("nan") if time_code is None else float(time_code))
        samples.poses.append(camera_pose(self.prim, code))
        samples.intrinsics.append(camera_intrinsics(self.prim, width, height, code))
        if self._first_frame is None and frame is not None:
            self._first_frame = frame
        if self.keep_frames and self._first_frame is not None:
            # A step the renderer skipped repeats the last frame, so frames stay aligned with poses.
            samples.frames.append(frame if frame is not None else samples.frames[-1])
        return True

    def samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What was recorded so far: times [N] (s), poses [N, 4, 4], intrinsics [N, 4] (a live stream reads
        them while recording: `lingbot_isaac.live_stream`)."""
        samples = self._samples
        if not samples.times:
            return np.zeros(0), np.zeros((0, 4, 4)), np.zeros((0, 4))
        return np.asarray(samples.times), np.stack(samples.poses), np.stack(samples.intrinsics)

    @property
    def first_frame(self) -> np.ndarray | None:
        return self._first_frame

    @property
    def sample_count(self) -> int:
        return len(self._samples.times)

    @property
    def seconds(self) -> float:
        times = self._samples.times
        return times[-1] - times[0] if len(times) > 1 else 0.0

    def stop(self) -> CameraRecording:
        """Stop and return what was recorded (at the sim's own rate)."""
        from pxr import UsdGeom

        self.recording = False
        samples = self._samples
        if len(samples.times) < 2:
            raise RecorderError(
                f"recorded {len(samples.times)} step(s) of {self.camera_path}: play the simulation while "
                "recording (and give the renderer a frame to produce the first image)"
            )
        times = np.asarray(samples.times)
        return CameraRecording(
            times=times - times[0],
            poses=np.stack(samples.poses),
            intrinsics=np.stack(samples.intrinsics),
            resolution=self.resolution,
            camera_prim=self.camera_path,
            meters_per_unit=float(UsdGeom.GetStageMetersPerUnit(self.stage)),
            source="isaac-sim recorder",
            first_frame=self._first_frame,
            frames=list(samples.frames) if self.keep_frames and samples.frames else None,
            extra={"sim_time_start": float(times[0]), "sim_steps": len(times)},
        )

    def write_episode(
        self,
        directory: os.PathLike | str,
        prompt: str,
        generation: dict[str, Any] | None = None,
        scene_id: str | None = None,
        robot_id: str | None = None,
        overwrite: bool = False,
        image: Any = None,
    ) -> Path:
        """Stop, resample to 16 fps / 4n+1 frames and write the episode folder (with sim frames if kept)."""
        recording = self.stop()
        recording.scene_id, recording.robot_id = scene_id, robot_id
        return write_recording_episode(  # kept frames become the sim frames (recording.frames_at_times)
            recording,
            directory,
            prompt,
            image=image,
            generation=generation,
            overwrite=overwrite,
        )


def _rgb(frame: Any, resolution: tuple[int, int]) -> np.ndarray | None:
    """An annotator's RGBA/RGB output as uint8 RGB [H, W, 3]; None if empty (renderer warming up)."""
    array = np.asarray(frame)
    if array.size == 0 or array.ndim != 3 or array.shape[2] not in (3, 4):
        return None
    if array.shape[:2] != tuple(resolution):
        raise RecorderError(
            f"captured frame is {array.shape[1]}x{array.shape[0]}, expected {resolution[1]}x{resolution[0]} (W x H)"
        )
    if array.dtype != np.uint8:
        array = np.clip(array * (255.0 if array.dtype.kind == "f" else 1.0), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(array[..., :3])
