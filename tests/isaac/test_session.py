"""The window's logic (session.Session): record, stop, generate on a worker thread, report status."""

from __future__ import annotations

import importlib.util
import shutil
import time

import numpy as np
import pytest

pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
from pxr import Usd  # noqa: E402

from contracts.episode import read_episode  # noqa: E402
from lingbot_isaac.recorder import RecorderError  # noqa: E402
from lingbot_isaac.session import Session, SessionSettings, safe_name  # noqa: E402

from .test_recorder import STAGE, FakeRenderProduct, H, W  # noqa: E402
from .test_replay import SAMPLE, _free_port, needs_server, server  # noqa: E402, F401  (fixture)


def record(session: Session, steps: int = 70):
    stage = Usd.Stage.Open(str(STAGE))
    product = FakeRenderProduct(stage.GetPrimAtPath("/World/Camera"), warmup=1)
    session.start_recording(stage, "/World/Camera", capture=product.read)
    assert session.status().state == "recording" and session.busy
    for step in range(steps):
        product.time_code = step
        session.on_step(step / 60, step)
    return product


def test_record_and_stop_writes_an_episode(tmp_path):
    session = Session(SessionSettings(output_dir=tmp_path, width=W, height=H, frame_num=17))
    record(session)
    with pytest.raises(RecorderError, match="busy"):
        session.generate(tmp_path)
    with pytest.raises(RecorderError, match="prompt"):
        session.stop_recording("  ")
    folder = session.stop_recording("A walk through a patterned room.", name=safe_name("/World/Camera"))
    status = session.status()
    assert status.state == "idle" and status.episode == folder and folder.parent == tmp_path
    episode = read_episode(folder)
    assert episode.frame_count == 17  # 68 steps at 60 Hz = 1.12 s -> 18 frames -> 17
    assert episode.meta.generation == {"frame_num": 17}
    assert safe_name("/World/My Camera!") == "World_My_Camera"


def test_status_serial_changes_only_on_change(tmp_path):
    session = Session(SessionSettings(output_dir=tmp_path, width=W, height=H))
    first = session.status()
    assert session.status() is first
    with pytest.raises(RecorderError, match="no episode yet"):
        session.generate()
    assert session.status().serial == first.serial


@needs_server
def test_unreachable_server_fails_cleanly(tmp_path):
    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    nobody = f"tcp://127.0.0.1:{_free_port()}"
    session = Session(SessionSettings(output_dir=tmp_path, server=nobody, timeout=1.0))
    session.generate(episode)
    status = session.wait(timeout=30)
    assert status.state == "failed" and "Generation failed" in status.message
    assert not (episode / "rollout.mp4").exists()


@needs_server
@pytest.mark.slow
def test_generate_against_a_local_tiny_server(tmp_path, server):  # noqa: F811
    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    session = Session(SessionSettings(output_dir=tmp_path, server=server, preset="tiny", timeout=30.0))
    session.generate(episode)
    seen = set()
    deadline = time.monotonic() + 600
    while session.busy and time.monotonic() < deadline:
        seen.add(session.status().message.split(" ")[0])
        time.sleep(0.05)
    status = session.status()
    assert status.state == "done", status.error
    assert status.result == episode / "rollout.mp4" and status.result.is_file()
    assert "Denoise" in seen  # progress events reached the status line
    if importlib.util.find_spec("comparison.report") is not None:
        assert status.report is not None and status.report.is_file()
        from tests.report_checks import assert_tiny_rollout_is_traceable

        assert_tiny_rollout_is_traceable(status.result, status.report, client="extension")
    assert np.load(episode / "poses.npy").shape[0] == 33  # the episode itself is untouched


@needs_server
def test_first_frame_photo_from_the_window_is_fitted_into_the_episode_before_sending(tmp_path):
    from PIL import Image

    from lingbot_isaac.first_frame import fit_photo

    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    photo = np.random.default_rng(3).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(photo).save(tmp_path / "photo.png")
    nobody = f"tcp://127.0.0.1:{_free_port()}"
    settings = SessionSettings(output_dir=tmp_path, server=nobody, timeout=1.0, first_frame=tmp_path / "photo.png")
    session = Session(settings)
    session.generate(episode)
    session.wait(timeout=30)  # no server: fails after the photo went in
    written = read_episode(episode)
    assert written.meta.extra["first_frame"]["path"] == str(tmp_path / "photo.png")
    fitted, _, _ = fit_photo(tmp_path / "photo.png", 480, 832)
    assert np.abs(written.image().astype(float) - fitted).mean() < 6  # the photo (as JPEG), not the render
    assert written.sim_frames_path is not None


def test_the_model_chosen_while_recording_is_kept_in_the_episode(tmp_path):
    session = Session(SessionSettings(output_dir=tmp_path, width=W, height=H, frame_num=17, model="fast"))
    record(session)
    folder = session.stop_recording("A walk through a patterned room.", name="cam")
    assert read_episode(folder).meta.generation == {"frame_num": 17, "model": "fast"}
