"""LingBot-World 2.0 through a real server and its real worker (the built-in `tiny-v2` model on the CPU):
batch jobs of both 2.0 engines name their family in the record, and a live job streams 16-frame chunks
and gives the batch job's video."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Chunk, Result
from bridge.client.live_client import LiveChunks, LiveJob
from tests.bridge.conftest import TINY, ServerPool, top_speed_first_episode, video_frames

pytestmark = pytest.mark.slow

# 33 poses, frame_num 33 -> 9 latent frames -> 2 chunks of 4 (29 frames: 13, then 16)
FAST = {"model": "fast", "size": "48*80", "frame_num": 33, "seed": 7}
JOB_S = 400


@pytest.fixture(scope="module")
def v2_server(tmp_path_factory):
    pool = ServerPool(tmp_path_factory.mktemp("v2-server"))
    try:
        server = pool.start(worker=TINY, worker_keys={"ckpt": "tiny-v2", "model": "fast"}, live_max_gap_s=30.0)
        yield server.wait_loaded()
    finally:
        pool.close()


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> EpisodePayload:
    return EpisodePayload.from_dir(top_speed_first_episode(tmp_path_factory.mktemp("episode") / "ep", n=33))


def test_batch_jobs_of_both_engines_name_their_family(v2_server, payload, tmp_path):
    with Client(v2_server.endpoint, timeout=20) as client:
        chunks: list[Chunk] = []
        fast = client.submit(payload, FAST, want_chunks=True, on_event=chunks.append).wait(JOB_S)
        causal = client.submit(payload, {**FAST, "model": "causal", "steps": 2}).wait(JOB_S)
    assert isinstance(fast, Result) and isinstance(causal, Result), (fast, causal)
    assert fast.provenance["model"]["family"] == "v2-causal-fast"
    assert causal.provenance["model"]["family"] == "v2-causal-pretrain"
    assert (
        video_frames(fast.video, tmp_path / "f.mp4").shape[0]
        == 29
        == video_frames(causal.video, tmp_path / "c.mp4").shape[0]
    )
    assert [c.frames for c in chunks if isinstance(c, Chunk)] == [13, 16]  # chunks of 4 latent frames


def test_a_live_job_streams_16_frame_chunks_and_is_the_batch_video(v2_server, payload, tmp_path):
    with Client(v2_server.endpoint, timeout=20) as client:
        chunks = LiveChunks()
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
        live.send_poses(payload.poses[:17])
        live.send_poses(payload.poses[17:], end=True)
        outcome = live.job.wait(timeout=JOB_S)
        batch = client.submit(payload, FAST).wait(timeout=JOB_S)
    assert isinstance(outcome, Result) and isinstance(batch, Result), (outcome, batch)
    record = outcome.provenance
    assert record["model"]["family"] == "v2-causal-fast" and len(record["live"]["poses_needed"]) == 2
    live_frames, batch_frames = (
        video_frames(outcome.video, tmp_path / "l.mp4"),
        video_frames(batch.video, tmp_path / "b.mp4"),
    )
    assert live_frames.shape[0] == 29 and np.array_equal(live_frames, batch_frames), json.dumps(record["live"])
