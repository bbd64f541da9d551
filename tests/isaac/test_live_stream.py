"""The window's Live mode without Kit (`lingbot_isaac.live_stream`): a real usd-core stage played at
60 Hz (room_render standing in for the render product), sampled by the recorder, resampled to the
model's 16 fps as the episode writer does and sent per chunk to a live job on a real server (its real
worker, the tiny Fast model on the CPU); then the episode and its live rollout as an ordinary folder."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
from pxr import Usd  # noqa: E402

from bridge.client.client import Client  # noqa: E402
from contracts.episode import read_episode  # noqa: E402
from contracts.video import read_mp4  # noqa: E402
from lingbot_isaac.live_stream import LiveStream  # noqa: E402
from tests.isaac.test_recorder import STAGE, FakeRenderProduct, H, W  # noqa: E402

pytestmark = pytest.mark.slow

SETTINGS = {"model": "fast", "size": "48*80", "frame_num": 33}


def test_live_mode_sends_each_chunks_poses_as_the_sim_passes_them_and_writes_the_rollout(tiny_server, tmp_path):
    stage = Usd.Stage.Open(str(STAGE))
    product = FakeRenderProduct(stage.GetPrimAtPath("/World/Camera"), warmup=0)
    views = []
    stream = LiveStream(stage, "/World/Camera", (H, W), "a room, the camera moves", SETTINGS,
                        lambda: Client(tiny_server.endpoint, timeout=20), capture=product.read,
                        on_chunk=views.append)  # fmt: skip
    sent_at = {}
    for step in range(int(2.2 * 60)):  # 2.2 s of sim at 60 Hz: past 33 frames at 16 fps (2.0 s)
        t = step / 60
        product.time_code = t * 60
        stream.on_step(t, t * 60)
        sent_at.setdefault(stream.sent, t)
    # each chunk's poses left as soon as the sim passed the time of its last model frame
    assert [n for n in sent_at if n] == [9, 21, 33]
    assert [round(sent_at[n] * 16) for n in (9, 21, 33)] == [8, 20, 32]
    episode, rollout = stream.write(tmp_path / "live_episode")
    assert read_mp4(rollout)[0].shape[0] == 33
    # the episode holds exactly the poses the live job was sent (the same resampling)
    written = read_episode(episode)
    assert np.array_equal(written.poses.astype(np.float32), np.concatenate(stream.batches))
    assert [v.index for v in views] == [0, 1, 2] and all(v.still and v.lag_chunks >= 0 for v in views)
    assert all(v.lag_s is not None for v in views)


def test_live_mode_needs_the_fast_model(tmp_path):
    stage = Usd.Stage.Open(str(STAGE))
    with pytest.raises(ValueError, match="LingBot-World-Fast"):
        LiveStream(stage, "/World/Camera", (H, W), "a room", {"model": "base"}, lambda: None)


def test_the_session_runs_live_mode_for_the_window(tiny_server, tmp_path):
    from lingbot_isaac.session import Session, SessionSettings

    stage = Usd.Stage.Open(str(STAGE))
    product = FakeRenderProduct(stage.GetPrimAtPath("/World/Camera"), warmup=0)
    previews = []
    settings = SessionSettings(server=tiny_server.endpoint, output_dir=tmp_path, width=W, height=H,
                               frame_num=33, model="fast")  # fmt: skip
    session = Session(settings, on_chunk=previews.append)
    session.start_live(stage, "/World/Camera", "a room, the camera moves", capture=product.read,
                       client_factory=lambda: Client(tiny_server.endpoint, timeout=20))  # fmt: skip
    assert session.live and session.status().state == "recording"
    for step in range(int(2.2 * 60)):
        t = step / 60
        product.time_code = t * 60
        session.on_step(t, t * 60)
    session.stop_live(name="live_run")
    status = session.wait(timeout=600)
    assert status.state == "done", status.message
    assert status.result == tmp_path / "live_run" / "rollout.mp4" and read_mp4(status.result)[0].shape[0] == 33
    assert [p.index for p in previews] == [0, 1, 2] and all(p.image and p.image.is_file() for p in previews)
    assert all("chunk(s) behind the sim" in p.label for p in previews)
