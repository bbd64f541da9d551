"""LingBot-World-Fast through the bridge on the tiny preset: chunks streamed to the client in order
before the result, a cancel between chunks, a client that did not ask for chunks, and `submit
--follow` writing a growing mp4. A real server with its real worker (`worldgen.worker`, the tiny
model, CPU) over loopback sockets."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Chunk, JobError, Progress, Result
from contracts.video import read_mp4
from tests.bridge.conftest import REPO, make_episode

# 33 poses, frame_num 33: 9 latent frames = 3 chunks of 3 (9, 12 and 12 video frames)
FAST = {"model": "fast", "size": "48*80", "frame_num": 33}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def episode(tmp_path_factory) -> Path:
    return make_episode(tmp_path_factory.mktemp("episode") / "ep", n=33)


def count_frames(data: bytes, tmp_path: Path, name: str) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    return imageio_ffmpeg.count_frames_and_secs(str(path))[0]


def test_every_chunk_arrives_in_order_before_the_result(tiny_server, episode, tmp_path):
    with Client(tiny_server.endpoint, timeout=10) as client:
        job = client.submit(EpisodePayload.from_dir(episode), FAST, want_chunks=True, want_stills=True)
        events = list(job.events(timeout=180))
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert [(c.index, c.total) for c in chunks] == [(0, 3), (1, 3), (2, 3)]
    assert isinstance(events[-1], Result) and all(events.index(c) < len(events) - 1 for c in chunks)
    assert [c.frames for c in chunks] == [9, 12, 12]
    assert [count_frames(c.video, tmp_path, f"c{c.index}.mp4") for c in chunks] == [9, 12, 12]
    # with want_stills each chunk brings a PNG of its last frame (before the mp4's compression)
    for chunk in chunks:
        still = np.asarray(Image.open(io.BytesIO(chunk.still))).astype(float)
        (tmp_path / "c.mp4").write_bytes(chunk.video)
        decoded = read_mp4(tmp_path / "c.mp4")[0].astype(float)
        assert still.shape == decoded.shape[1:]  # 48x80: small already, not scaled
        errors = [np.abs(still - frame).mean() for frame in decoded]
        assert errors[-1] == min(errors) and errors[-1] < 0.5 * np.median(errors), errors  # the last frame
    assert not any(".chunk" in p.name for p in tiny_server.workdir.rglob("*"))  # the server deleted them
    assert count_frames(events[-1].video, tmp_path, "result.mp4") == 33
    chunk_progress = [(e.step, e.total) for e in events if isinstance(e, Progress) and e.phase == "chunk"]
    assert chunk_progress == [(1, 3), (2, 3), (3, 3)]  # what replay and the Isaac window show
    with Client(tiny_server.endpoint, timeout=10) as client:
        assert client.health()["model"]["engine"] == "fast"  # the model resident now


def test_a_cancel_between_chunks_stops_within_one_chunk(tiny_server, episode):
    with Client(tiny_server.endpoint, timeout=10) as client:
        first = threading.Event()
        job = client.submit(
            EpisodePayload.from_dir(episode), FAST, want_chunks=True,
            on_event=lambda e: first.set() if isinstance(e, Chunk) else None,
        )  # fmt: skip
        assert first.wait(180)
        client.cancel(job.id)
        events = list(job.events(timeout=120))
    assert isinstance(events[-1], JobError) and events[-1].code == "cancelled"
    assert [c.index for c in events if isinstance(c, Chunk)] in ([0], [0, 1])  # at most the chunk under way
    assert all(c.still is None for c in events if isinstance(c, Chunk))  # no want_stills: no `still` frame


def test_a_client_that_did_not_ask_gets_no_chunks(tiny_server, episode):
    with Client(tiny_server.endpoint, timeout=10) as client:
        events = list(client.submit(EpisodePayload.from_dir(episode), FAST).events(timeout=180))
    assert isinstance(events[-1], Result) and not any(isinstance(e, Chunk) for e in events)
    # but the chunks still show as progress (what replay's bar shows): no video sent, none written
    chunk_progress = [(e.step, e.total) for e in events if isinstance(e, Progress) and e.phase == "chunk"]
    assert chunk_progress == [(1, 3), (2, 3), (3, 3)]


def test_submit_follow_writes_a_growing_mp4(tiny_server, episode, tmp_path):
    out = tmp_path / "rollout.mp4"
    command = [sys.executable, "-m", "lingbot_cli", "submit", str(episode), "--server", tiny_server.endpoint,
               "--model", "fast", "--size", "48*80", "--frame-num", "33", "--follow", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    for frames, index in ((9, 1), (21, 2), (33, 3)):
        assert f"chunk {index}/3: {out} has {frames} frames" in result.stderr
    assert imageio_ffmpeg.count_frames_and_secs(str(out))[0] == 33
