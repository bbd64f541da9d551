"""A causal job on a worker whose engine spans two devices (issue 55), through a real server and its real worker:
`[worker] device = ["cpu", "cpu"]` is `gpus = "0,1"`'s split over two CPU ranks (gloo, rank 1 a process of the
worker's own, `worldgen.pipelines.two_gpu`). A batch job and a live job asking `gpus = 2` give the video of the
one-device server; a server whose workers have one device each (one worker, or a pool) refuses `gpus = 2` for
model fast, naming the fix; a rank 1 killed mid-job fails that job with `peer_lost`, and the same worker runs the
next job on a new rank 1. About 45 s in all on two busy CPU cores, none over 20 s (the tiny model; the two
servers and the one-device video shared by the module)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from bridge.client.client import Client
from bridge.client.client_errors import RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import JobError, Progress, Result
from bridge.client.live_client import LiveChunks, LiveJob
from tests.bridge.conftest import TINY, ServerPool, top_speed_first_episode, video_frames, wait_for

# 33 poses, frame_num 33: 3 chunks of the tiny Fast model
FAST = {"model": "fast", "size": "48*80", "frame_num": 33, "seed": 7}
JOB_S = 400


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(one device, two devices): the same tiny Fast model on each."""
    pool = ServerPool(tmp_path_factory.mktemp("two-device-servers"))
    try:
        one = pool.start(worker=TINY, name="one", worker_keys={"model": "fast"})
        two = pool.start(worker=TINY, name="two", worker_keys={"model": "fast", "device": ["cpu", "cpu"]})
        yield one.wait_loaded(), two.wait_loaded()
    finally:
        pool.close()


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> EpisodePayload:
    return EpisodePayload.from_dir(top_speed_first_episode(tmp_path_factory.mktemp("episode") / "ep", n=33))


@pytest.fixture(scope="module")
def reference(servers, payload, tmp_path_factory) -> np.ndarray:
    """The one-device server's video of FAST (made once: both tests below compare with it)."""
    with Client(servers[0].endpoint, timeout=20) as client:
        result = client.submit(payload, FAST).wait(JOB_S)
    assert isinstance(result, Result), result
    assert result.provenance["compute"]["second_device"] is None
    return video_frames(result.video, tmp_path_factory.mktemp("reference") / "one.mp4")


def _assert_same_video(split: np.ndarray, one: np.ndarray) -> None:
    """The split's float32 frames are the one device's to ~1e-7 (tests/worldgen/test_two_gpu.py checks them
    before encoding); after uint8 and H.264 a rounding flip moves a few pixels of a block: nearly all equal."""
    assert split.shape == one.shape
    diff = np.abs(split.astype(np.int16) - one.astype(np.int16))
    assert diff.mean() < 0.1 and (diff == 0).mean() > 0.97, (diff.mean(), (diff == 0).mean(), diff.max())


def _rank1_pid(worker_pid: int) -> int:
    """The worker's rank 1: its child started by multiprocessing's spawn (not its resource tracker)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == worker_pid and b"spawn_main" in command:
            return int(entry.name)
    raise AssertionError(f"worker {worker_pid} has no rank 1 process")


def test_workers_of_one_device_refuse_gpus_2_for_a_causal_job_batch_or_live(servers, payload, tmp_path):
    """One worker on one device, and a pool of two one-device workers (which model base's gpus = 2 would pair):
    a causal job's split needs one worker on two devices, so both refuse it at the door, naming the fix."""
    pool = ServerPool(tmp_path / "pool")
    try:
        # the stand-in engine (the door's refusal reads the config only): no tiny model loading beside the others
        two_workers = pool.start(name="pool", worker_keys={"model": "fast", "devices": ["cpu", "cpu"]})
        for server in (servers[0], two_workers):
            with Client(server.endpoint, timeout=20) as client:
                with pytest.raises(RequestFailed) as refused:
                    client.submit(payload, {**FAST, "gpus": 2})
                with pytest.raises(RequestFailed) as refused_live:
                    LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, {**FAST, "gpus": 2})
            for error in (refused.value, refused_live.value):
                assert error.code == "bad_settings", error
                assert "one device each" in error.message and 'gpus = "0,1"' in error.message, error.message
    finally:
        pool.close()


def test_a_two_device_worker_splits_batch_and_live_causal_jobs_and_gives_the_one_device_video(
    servers, payload, reference, tmp_path
):
    with Client(servers[1].endpoint, timeout=20) as client:
        batch = client.submit(payload, {**FAST, "gpus": 2}).wait(JOB_S)
        chunks = LiveChunks()
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, {**FAST, "gpus": 2},
                            on_event=chunks)  # fmt: skip
        live.send_poses(payload.poses[:17])
        live.send_poses(payload.poses[17:], end=True)
        streamed = live.job.wait(timeout=JOB_S)
    assert all(isinstance(r, Result) for r in (batch, streamed)), (batch, streamed)
    assert batch.provenance["settings"]["gpus"] == 2 and batch.provenance["compute"]["second_device"] == "cpu"
    split = video_frames(batch.video, tmp_path / "two.mp4")
    _assert_same_video(split, reference)
    assert np.array_equal(video_frames(streamed.video, tmp_path / "live.mp4"), split)  # live and batch: one split


def test_a_rank_1_lost_mid_job_fails_it_with_peer_lost_and_the_worker_runs_the_next(
    servers, payload, reference, tmp_path
):
    """Rank 1 frozen before the job, killed once the job is in its chunk loop (its cache made on both ranks):
    the forward waiting on it fails at once with PeerLost, the job with `peer_lost`; the worker (the same
    process) starts a new rank 1 for the next job, which gives the one-device video."""
    _, two = servers
    with Client(two.endpoint, timeout=20) as client:
        worker = client.health()["workers"][0]
        rank1 = _rank1_pid(worker["pid"])
        os.kill(rank1, signal.SIGSTOP)
        looping: list[Progress] = []
        try:
            job = client.submit(payload, FAST, on_event=lambda e: isinstance(e, Progress) and e.phase == "denoise"
                                and looping.append(e))  # fmt: skip
            wait_for(lambda: looping, JOB_S, what="the job's chunk loop to start")
        finally:
            os.kill(rank1, signal.SIGKILL)
        failed = job.wait(JOB_S)
        assert isinstance(failed, JobError) and failed.code == "peer_lost", failed
        assert "PeerLost" in failed.message and f"pid {rank1}" in failed.message, failed.message
        assert looping[-1].step == 0  # no forward finished without its peer
        after = client.submit(payload, FAST).wait(JOB_S)
        again = client.health()["workers"][0]
    assert isinstance(after, Result), after
    assert again["pid"] == worker["pid"] and again["restarts"] == worker["restarts"]
    assert _rank1_pid(worker["pid"]) != rank1
    _assert_same_video(video_frames(after.video, tmp_path / "a.mp4"), reference)
