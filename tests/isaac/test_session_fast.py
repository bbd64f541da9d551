"""The window's session with LingBot-World-Fast: the model choice per job, each finished chunk
handed to the window (in order, before the result), a cancel between chunks, a bad model refused.

A real server subprocess with its real worker (the built-in tiny model, model fast, CPU) over
loopback ZeroMQ, as in tests/bridge/test_fast_streaming.py; the session follows its job with
`bridge.client.follow.submit_and_follow`, the loop `submit` and `replay` use."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bridge.client.client import Client
from bridge.client.job_events import Chunk
from bridge.server.mp4 import check_complete
from contracts.engine_options import MODELS
from contracts.episode import ROLLOUT_INFO, ROLLOUT_VIDEO, EpisodeMeta
from contracts.settings import SettingsError
from contracts.video import have_codec, read_mp4, still_png, write_mp4
from lingbot_isaac.session import PREVIEW_DIR, ChunkPreview, Session, SessionSettings, _Previews, model_choices
from tests.bridge.conftest import make_episode, wait_for

# 33 poses and frames at 48x80: 9 latent frames = 3 chunks of 3 (9, 12 and 12 video frames)
FAST_FRAMES, CHUNK_FRAMES = 33, [9, 12, 12]


def fast_episode(folder: Path, size: str = "48*80") -> Path:
    """An episode whose own settings (episode.json `generation`, as the recorder writes them) ask
    for a small frame; the model is left to the session's setting."""
    make_episode(folder, n=FAST_FRAMES)
    meta = EpisodeMeta(source_resolution=(96, 160), generation={"size": size, "frame_num": FAST_FRAMES})
    (folder / "episode.json").write_text(json.dumps(meta.to_json(FAST_FRAMES)))
    return folder


def read_frames(path: Path) -> np.ndarray:
    return read_mp4(path)[0]


def test_the_model_list_is_the_contracts_one_and_nothing_is_sent_by_default():
    assert [value for _, value in model_choices()] == [None, *MODELS]  # the server's choice first
    assert "model" not in SessionSettings().generation()  # default: the server's model
    assert SessionSettings(model="fast").generation() == {"model": "fast"}


def test_a_bad_model_is_refused_before_anything_is_sent(tmp_path):
    episode = fast_episode(tmp_path / "ep")
    # no server at all: a refusal that reached for the network would fail differently
    session = Session(SessionSettings(server="tcp://127.0.0.1:9", model="turbo", compare=False))
    before = session.status()
    with pytest.raises(SettingsError, match=r"^model must be one of 'base', 'fast', 'causal' \(got 'turbo'\)"):
        session.generate(episode)
    assert session.status() is before and not session.busy  # nothing started
    assert not (episode / ROLLOUT_VIDEO).exists()


@pytest.mark.slow
def test_a_fast_job_hands_every_chunk_to_the_window_in_order_before_the_result(tiny_server, tmp_path, monkeypatch):
    episode = fast_episode(tmp_path / "ep")
    seen: list[tuple[ChunkPreview, str, bool, bytes, tuple | None]] = []

    def on_chunk(preview: ChunkPreview) -> None:  # what the window's thin callback gets
        status = session.status()
        check_complete(preview.video, preview.frames)  # the file is there, whole, when the window is told
        frames = preview.video.read_bytes()  # (counted below, where a decoder may be imported)
        image = np.asarray(Image.open(preview.image)).shape if preview.image else None
        seen.append((preview, status.state, status.result is None, frames, image))

    session = Session(
        SessionSettings(server=tiny_server.endpoint, model="fast", timeout=10.0, compare=False), on_chunk=on_chunk
    )
    with monkeypatch.context() as isaac_python:  # as in Isaac Sim's Python: no imageio-ffmpeg to import
        isaac_python.setitem(sys.modules, "imageio_ffmpeg", None)
        assert not have_codec()
        session.generate(episode)
        status = session.wait(timeout=240)
    assert status.state == "done", status.error
    previews = [s[0] for s in seen]
    assert [(p.index, p.total) for p in previews] == [(0, 3), (1, 3), (2, 3)]
    assert [p.frames for p in previews] == CHUNK_FRAMES
    assert [p.frames_so_far for p in previews] == [9, 21, 33]
    assert all(state == "generating" and no_result for _, state, no_result, _, _ in seen)  # before the result
    assert [len(read_frames(preview.video)) for preview in previews] == CHUNK_FRAMES
    assert [frames for *_, frames, _ in seen] == [p.video.read_bytes() for p in previews]  # as they were then
    assert [p.video.parent for p in previews] == [episode / PREVIEW_DIR] * 3
    assert len({p.job for p in previews}) == 1
    # the still the window shows is the server's PNG of the chunk's last frame (48x80: not scaled
    # down), there without a video decoder on this side
    result = read_frames(status.result)
    assert len(result) == FAST_FRAMES
    assert [s[4] for s in seen] == [result.shape[1:]] * 3
    for preview in previews:
        still = np.asarray(Image.open(preview.image)).astype(float)
        errors = [np.abs(still - frame).mean() for frame in read_frames(preview.video).astype(float)]
        assert errors[-1] == min(errors) and errors[-1] < 0.5 * np.median(errors), errors  # the last frame
    # the model choice reached the server: the worker ran Fast, and the record says so
    record = json.loads((episode / ROLLOUT_INFO).read_text())
    assert record["model"]["variant"] == "fast"
    assert record["settings"]["model"] == "fast" and record["job"]["asked"]["model"] == "fast"
    assert record["job"]["client"] == "extension"
    with Client(tiny_server.endpoint, timeout=10) as client:
        assert client.health()["model"]["engine"] == "fast"


@pytest.mark.slow
def test_a_cancel_between_chunks_stops_the_job_within_one_chunk(tiny_server, tmp_path):
    # 96x160: chunks slow enough (4x the tokens) that a cancel lands between them
    episode = fast_episode(tmp_path / "ep", size="96*160")
    first = threading.Event()
    calls: list[tuple[int, float, str]] = []

    def on_chunk(preview: ChunkPreview) -> None:
        calls.append((preview.index, time.monotonic(), preview.job))
        first.set()

    session = Session(
        SessionSettings(server=tiny_server.endpoint, model="fast", timeout=10.0, compare=False), on_chunk=on_chunk
    )
    session.generate(episode)
    assert first.wait(240), session.status()
    job = calls[0][2]
    session.cancel()  # what the Cancel button runs on Kit's UI thread
    cancelled_at = time.monotonic()
    assert session.status().state == "failed" and session.status().message == "Cancelled."
    with Client(tiny_server.endpoint, timeout=10) as client:
        state = wait_for(
            lambda: (s := client.status(job))["state"] not in ("queued", "running") and s, 60, what="the job to end"
        )
    assert state["state"] == "cancelled", state
    # the worker stopped at its next progress event: within the chunk after the first. That event is a
    # denoising step (5 a chunk here, 4 for the last), the first chunk's "chunk" event, or chunk 1's
    # conditioning frames being encoded (Fast encodes them as the loop goes)
    phase, step, total = re.search(r"during (\w+) \(step (\d+)/(\d+)\)", state["error"]["message"]).groups()
    step, total = int(step), int(total)
    if phase == "denoise":
        assert step <= 2 * (total + 1) // 3, state
    else:
        assert (phase, step) in (("chunk", 1), ("encode", 1), ("encode", 2)), state
    session.wait(timeout=30)
    assert all(at < cancelled_at for _, at, _ in calls) and calls[0][0] == 0  # nothing shown after the cancel
    assert not (episode / ROLLOUT_VIDEO).exists()


def test_a_chunk_from_an_older_server_without_a_still_is_decoded_here_only_if_it_can(tmp_path, monkeypatch):
    # an older server sends no `still`: the session decodes the chunk's last frame itself when
    # imageio-ffmpeg is installed, and otherwise the window shows the chunk's line alone
    pixels = np.random.default_rng(0).integers(0, 256, (9, 480, 832, 3), dtype=np.uint8)
    video = write_mp4(tmp_path / "chunk.mp4", pixels).read_bytes()
    previews = _Previews(tmp_path / PREVIEW_DIR)
    decoded = previews.add(Chunk("job", 0, 2, 9, video))
    assert decoded.image == tmp_path / PREVIEW_DIR / "chunk_000.png"
    last = read_frames(decoded.video)[-1]
    assert decoded.image.read_bytes() == still_png(last)  # as the server makes its stills: 416x240
    with monkeypatch.context() as isaac_python:
        isaac_python.setitem(sys.modules, "imageio_ffmpeg", None)
        text_only = previews.add(Chunk("job", 1, 2, 9, video))
    assert text_only.image is None and text_only.video.is_file() and text_only.frames_so_far == 18
    assert text_only.label == "Chunk 2/2 ready: 18 frames so far"
