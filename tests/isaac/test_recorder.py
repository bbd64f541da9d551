"""The recorder on a real usd-core stage, with room_render standing in for the RTX render product."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
from pxr import Usd  # noqa: E402

from contracts.episode import read_episode  # noqa: E402
from contracts.video import have_codec  # noqa: E402
from lingbot_isaac.camera import camera_intrinsics, camera_pose  # noqa: E402
from lingbot_isaac.lens import CameraError  # noqa: E402
from lingbot_isaac.recorder import Recorder, RecorderError  # noqa: E402
from tests.room_render import render_room  # noqa: E402

STAGE = Path(__file__).resolve().parents[2] / "data" / "sample_room" / "room.usda"
H, W = 120, 208  # a small render product keeps the test fast


class FakeRenderProduct:
    """Renders the camera's current pose like an RTX render product would, after a warm-up."""

    def __init__(self, prim, warmup: int = 2, rgba: bool = True) -> None:
        self.prim, self.warmup, self.rgba, self.time_code = prim, warmup, rgba, 0.0

    def read(self):
        if self.warmup > 0:
            self.warmup -= 1
            return None if self.warmup % 2 else np.zeros((0,), np.uint8)  # None, then an empty array
        code = Usd.TimeCode(self.time_code)
        image = render_room(camera_pose(self.prim, code), tuple(camera_intrinsics(self.prim, W, H, code)), H, W)
        return np.dstack([image, np.full((H, W), 255, np.uint8)]) if self.rgba else image


def run_sim(recorder: Recorder, product: FakeRenderProduct, steps: int, rate: float = 60.0, pause_at=None):
    for step in range(steps):
        t = step / rate
        if pause_at is not None and step == pause_at:
            recorder.sample(t - 1 / rate, (step - 1) * 60 / rate)  # a paused step repeats its time
        product.time_code = t * 60  # the stage has 60 time codes per second
        recorder.sample(t, t * 60)


def test_record_then_write_episode(tmp_path):
    stage = Usd.Stage.Open(str(STAGE))
    prim = stage.GetPrimAtPath("/World/Camera")
    product = FakeRenderProduct(prim)
    recorder = Recorder(stage, "/World/Camera", (H, W), capture=product.read, keep_frames=have_codec())
    recorder.start()
    run_sim(recorder, product, steps=100, pause_at=50)
    assert recorder.sample_count == 98  # 2 warm-up steps dropped, the paused step skipped
    out = recorder.write_episode(tmp_path / "ep", "A walk through a patterned room.", scene_id="sample_room")
    episode = read_episode(out)
    # Frame 0 is the first step with an image (t = 2/60 s); 96/60 s later -> 26 frames -> 25 (4n+1).
    assert episode.frame_count == 25
    assert episode.meta.sim_times[0] == 0.0 and episode.meta.extra["sim_time_start"] == pytest.approx(2 / 60)
    for i in (0, 8, 24):
        code = Usd.TimeCode((2 / 60 + i / 16) * 60)  # USD interpolates the authored samples the same way
        np.testing.assert_allclose(episode.poses[i], camera_pose(prim, code), atol=2e-6)

    # The first frame is the render at frame 0's pose.
    def render_at(code):
        return render_room(camera_pose(prim, Usd.TimeCode(code)), tuple(camera_intrinsics(prim, W, H, code)), H, W)

    image = episode.image().astype(float)
    same, later = np.abs(image - render_at(2.0)).mean(), np.abs(image - render_at(32.0)).mean()
    assert same < 5 and later > 3 * same  # JPEG noise vs. a different pose
    assert episode.meta.camera_prim == "/World/Camera" and episode.meta.meters_per_unit == 0.01
    if have_codec():
        assert episode.sim_frames_path is not None


def test_max_seconds_stops_recording():
    stage = Usd.Stage.Open(str(STAGE))
    product = FakeRenderProduct(stage.GetPrimAtPath("/World/Camera"), warmup=0, rgba=False)
    recorder = Recorder(stage, "/World/Camera", (H, W), capture=product.read, max_seconds=0.5)
    recorder.start()
    run_sim(recorder, product, steps=60)
    assert not recorder.recording
    assert recorder.seconds == pytest.approx(0.5)


def test_recorder_errors(tmp_path):
    stage = Usd.Stage.Open(str(STAGE))
    with pytest.raises(CameraError, match="no prim"):
        Recorder(stage, "/World/Nope", (H, W))
    recorder = Recorder(stage, "/World/Camera", (H, W), capture=lambda: None)
    recorder.start()
    for step in range(10):
        recorder.sample(step / 60, step)
    with pytest.raises(RecorderError, match="recorded 0 step"):
        recorder.stop()
    wrong = Recorder(stage, "/World/Camera", (H, W), capture=lambda: np.zeros((10, 10, 3), np.uint8))
    wrong.start()
    with pytest.raises(RecorderError, match="expected 208x120"):
        wrong.sample(0.0, 0.0)
    no_image = Recorder(stage, "/World/Camera", (H, W))  # no capture: the image must come from elsewhere
    no_image.start()
    for step in range(20):
        no_image.sample(step / 60, step)
    with pytest.raises(ValueError, match="no first frame"):
        no_image.write_episode(tmp_path / "ep", "p")
