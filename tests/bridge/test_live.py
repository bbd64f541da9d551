"""Live jobs (docs/protocol.md, "Live jobs") through a real server with its real worker (the tiny Fast
model on the CPU) over loopback sockets: chunks come while the poses are still being sent, the video is
the batch job's, bad pose batches are named errors that harm nothing, and cancel, a killed worker, a
client that stops reading and a client that sends far too fast each end as the protocol says."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import zmq

from bridge.client.client import Client
from bridge.client.client_errors import RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Chunk, JobError, Result
from bridge.client.live_client import LiveChunks, LiveJob
from bridge.wire import protocol
from contracts.video import read_mp4
from tests.bridge.conftest import TINY, ServerPool, make_episode, rss_mb, wait_for

pytestmark = pytest.mark.slow

# 33 poses, frame_num 33: 3 chunks, which need the first 9, 21 and 33 poses (fast_live.poses_needed)
FAST = {"model": "fast", "size": "48*80", "frame_num": 33, "seed": 7}
AHEAD = 2  # the server's live_ahead_chunks here
JOB_S = 400  # a job's time limit on a loaded 2-core machine (a chunk takes seconds to tens of seconds)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    pool = ServerPool(tmp_path_factory.mktemp("live-server"))
    try:
        yield pool.start(worker=TINY, live_max_gap_s=4.0, live_ahead_chunks=AHEAD).wait_loaded()
    finally:
        pool.close()


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> EpisodePayload:
    """A path that starts at its top speed (then slows down): its largest latent step is in chunk 0,
    where the live rule's translation scale equals the batch job's (worldgen/pipelines/fast_live.py)."""
    folder = make_episode(tmp_path_factory.mktemp("episode") / "ep", n=33)
    poses = np.load(folder / "poses.npy")
    poses[:, 2, 3] = np.sqrt(np.linspace(0, 1, 33)).astype(np.float32)
    np.save(folder / "poses.npy", poses)
    return EpisodePayload.from_dir(folder)


def wait_chunk(chunks: LiveChunks, index: int, timeout: float = JOB_S) -> None:
    with chunks.changed:
        assert chunks.changed.wait_for(lambda: index in chunks.chunks, timeout), f"chunk {index} never came"


def frames_of(video: bytes, tmp_path: Path, name: str) -> np.ndarray:
    path = tmp_path / name
    path.write_bytes(video)
    return read_mp4(path)[0]


def test_chunks_come_while_poses_are_sent_and_the_video_is_the_batch_video(live_server, payload, tmp_path):
    with Client(live_server.endpoint, timeout=20) as client:
        chunks = LiveChunks()
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
        acks = [live.send_poses(payload.poses[:9]), live.send_poses(payload.poses[9:21])]
        wait_chunk(chunks, 0)  # chunk 0 comes before the client has sent chunk 2's poses (truly incremental)
        assert live.sent_poses == 21
        acks.append(live.send_poses(payload.poses[21:], end=True))
        outcome = live.job.wait(timeout=JOB_S)
        assert isinstance(outcome, Result), outcome
        batch = client.submit(payload, FAST).wait(timeout=JOB_S)
        assert isinstance(batch, Result), batch
    assert [a.poses for a in acks] == [9, 21, 33] and acks[-1].ended
    # the same frames, bit for bit, as the batch job with the same inputs and seed
    live_frames, batch_frames = (
        frames_of(outcome.video, tmp_path, "live.mp4"),
        frames_of(batch.video, tmp_path, "b.mp4"),
    )
    assert live_frames.shape[0] == 33 and np.array_equal(live_frames, batch_frames)
    # the chunks, in order, are the result's frames; each says which poses made it and when
    got = chunks.in_order()
    assert [c.index for c in got] == [0, 1, 2] and [c.frames for c in got] == [9, 12, 12]
    assert [c.live["poses"] for c in got] == [9, 21, 33]
    for chunk in got:
        timing = chunk.live
        assert timing["poses_received_s"] <= timing["started_s"] <= timing["sent_s"]
        assert timing["lag_s"] == pytest.approx(timing["sent_s"] - timing["poses_received_s"], abs=1e-3)
    record = outcome.provenance["live"]
    assert record["poses_needed"] == [9, 21, 33] and record["batches"] == 3
    assert [c["poses"] for c in record["chunks"]] == [9, 21, 33]


def test_a_path_whose_fastest_step_comes_late_is_the_batch_video_given_the_same_scale(live_server, payload, tmp_path):
    """Issue 53: the live camera's scale never changes mid-stream; a live and a batch job given the same
    `translation_scale` make the same video bit for bit, whatever the path's speed profile."""
    accelerating = dataclasses.replace(payload, poses=payload.poses.copy())
    accelerating.poses[:, 2, 3] = np.linspace(0, 1, 33, dtype=np.float32) ** 2  # fastest at the end
    settings = {**FAST, "translation_scale": 0.05}
    with Client(live_server.endpoint, timeout=20) as client:
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, settings)
        live.send_poses(accelerating.poses[:9])
        live.send_poses(accelerating.poses[9:], end=True)
        outcome = live.job.wait(timeout=JOB_S)
        assert isinstance(outcome, Result), outcome
        batch = client.submit(accelerating, settings).wait(timeout=JOB_S)
        assert isinstance(batch, Result), batch
        unscaled = client.submit(accelerating, FAST).wait(timeout=JOB_S)  # the batch job's own scale: another video
        assert isinstance(unscaled, Result), unscaled
    live_video = frames_of(outcome.video, tmp_path, "live.mp4")
    assert np.array_equal(live_video, frames_of(batch.video, tmp_path, "batch.mp4"))
    assert not np.array_equal(live_video, frames_of(unscaled.video, tmp_path, "unscaled.mp4"))
    assert live_video.std() > 1  # a picture, not a constant colour


def test_bad_pose_batches_are_named_errors_and_harm_neither_job_nor_server(live_server, payload):
    with Client(live_server.endpoint, timeout=20) as client:
        with pytest.raises(RequestFailed) as refused:
            LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, {**FAST, "model": "base"})
        assert refused.value.code == "bad_settings" and "fast" in refused.value.message
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST)
        live.send_poses(payload.poses[:9])
        live.seq = 3  # skip batches 1 and 2
        with pytest.raises(RequestFailed) as refused:
            live.send_poses(payload.poses[9:21])
        assert refused.value.code == "out_of_order" and "send batch 1 next" in refused.value.message
        live.seq = 1
        nan = payload.poses[9:21].copy()
        nan[4, 0, 3] = np.nan
        with pytest.raises(RequestFailed) as refused:
            live.send_poses(nan)
        assert refused.value.code == "bad_input" and "pose 4 has NaN" in refused.value.message
        with pytest.raises(RequestFailed) as refused:  # more than the job's planned frame_num poses
            live.send_poses(np.concatenate([payload.poses[9:], payload.poses[:1]]))
        assert refused.value.code == "too_large"
        live.send_poses(payload.poses[9:21])  # the job goes on from where it was
        live.send_poses(payload.poses[21:], end=True)
        outcome = live.job.wait(timeout=JOB_S)
        assert isinstance(outcome, Result) and outcome.provenance["live"]["poses_held"] == 33
        with pytest.raises(RequestFailed) as refused:  # a batch for a finished job
            live.send_poses(payload.poses[:5])
        assert refused.value.code == "job_over" and "done" in refused.value.message
        assert client.health()["ok"]


def test_cancel_mid_stream_keeps_the_chunks_made_so_far(live_server, payload, tmp_path):
    with Client(live_server.endpoint, timeout=20) as client:
        chunks = LiveChunks()
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
        live.send_poses(payload.poses[:9])
        wait_chunk(chunks, 0)
        live.cancel()
        outcome = live.job.wait(timeout=60)
        assert isinstance(outcome, JobError) and outcome.code == "cancelled"
        assert frames_of(chunks.in_order()[0].video, tmp_path, "c0.mp4").shape[0] == 9  # the frames so far
        with pytest.raises(RequestFailed) as refused:
            live.send_poses(payload.poses[9:21])
        assert refused.value.code == "job_over"
        assert client.health()["ok"]


def test_a_killed_worker_fails_the_live_job_and_the_server_serves_the_next(live_server, payload):
    with Client(live_server.endpoint, timeout=20) as client:
        chunks = LiveChunks()
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
        live.send_poses(payload.poses[:9])
        wait_chunk(chunks, 0)
        os.kill(client.health()["worker"]["pid"], signal.SIGKILL)
        outcome = live.job.wait(timeout=60)
        assert isinstance(outcome, JobError) and outcome.code == "worker_crashed", outcome
        assert [c.index for c in chunks.in_order()] == [0]  # what was made before stays with the client
        wait_for(lambda: client.health()["ok"], 180, interval=1.0, what="the worker to restart")
        with pytest.raises(RequestFailed) as refused:
            live.send_poses(payload.poses[9:21])
        assert refused.value.code == "job_over"


def test_a_client_that_stops_reading_costs_no_memory_and_its_chunks_so_far_are_the_result(live_server, payload):
    """A raw DEALER opens a live job, sends two chunks' poses, then never reads nor sends again: the
    server keeps going (its sends to it drop), the job ends after live_max_gap_s with the two chunks as its
    result, and anyone with the job id gets that result."""
    pid = live_server.proc.pid
    before = rss_mb(pid)
    context = zmq.Context()
    silent = context.socket(zmq.DEALER)
    silent.rcvhwm = 1  # it reads nothing: the server's sends to it pile up nowhere
    silent.connect(live_server.endpoint)
    fields = {"rid": "silent-1", "live_v": protocol.LIVE_VERSION, "prompt": payload.prompt, "settings": FAST}
    silent.send_multipart(
        protocol.encode("live", fields, {"intrinsics": payload.intrinsics[:1]}, {"image": payload.image})
    )
    job_id = protocol.decode_reply(silent.recv_multipart()).fields["job"]
    for seq, poses in enumerate((payload.poses[:9], payload.poses[9:21])):
        silent.send_multipart(protocol.encode("poses", {"rid": f"silent-p{seq}", "job": job_id, "seq": seq},
                                              {"poses": poses}))  # fmt: skip
    try:
        with Client(live_server.endpoint, timeout=20) as client:
            wait_for(lambda: client.status(job_id)["state"] == "done", JOB_S, interval=1.0, what="the job to end")
            outcome = client.watch(job_id).wait(timeout=60)
        assert isinstance(outcome, Result) and outcome.error["code"] == "live_gap", outcome.error
        live = outcome.provenance["live"]
        assert live["poses_held"] == 21 and [c["poses"] for c in live["chunks"]] == [9, 21]
        assert outcome.provenance["output"]["frames"] == 21  # chunks 0 and 1: the frames made so far
        assert rss_mb(pid) - before < 40, (before, rss_mb(pid))
    finally:
        silent.close(linger=0)
        context.term()


def test_a_client_ten_times_faster_than_the_model_is_held_back(live_server, payload):
    """One pose per batch as fast as the loop goes: the server takes poses only up to AHEAD chunks
    ahead of the chunks it has sent; beyond, `busy` (waited out by the client) says how far behind it is."""
    settings = {**FAST, "frame_num": 45}  # 4 chunks: 9, 21, 33, 45 poses
    poses = np.concatenate([payload.poses, payload.poses[-12:]])
    poses[33:, 2, 3] = poses[32, 2, 3] + np.linspace(0.01, 0.12, 12, dtype=np.float32)
    pid = live_server.proc.pid
    before = rss_mb(pid)
    with Client(live_server.endpoint, timeout=20) as client:
        live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, settings)
        acks = [live.send_poses(poses[i : i + 1], end=i == 44, timeout=JOB_S) for i in range(45)]
        outcome = live.job.wait(timeout=JOB_S)
    assert isinstance(outcome, Result), outcome
    assert live.busy_answers > 0  # it was held back, not buffered
    assert all(a.behind <= AHEAD and a.chunks_ready - a.chunks_sent <= AHEAD for a in acks)
    # the first 33 poses (chunk 2's) were refused until chunk 0 had been sent
    first_33 = next(a for a in acks if a.poses >= 33)
    assert first_33.chunks_sent >= 1
    assert rss_mb(pid) - before < 40


def test_a_server_restart_loses_no_accepted_pose_and_the_job_goes_on(tmp_path, payload):
    """The server (and its worker) killed after chunk 0: the restarted server rebuilds the job's poses
    from its spool, runs it again from them, takes the client's next batch (its seq goes on) and
    ends it with the whole video; the client holds every chunk once."""
    pool = ServerPool(tmp_path)
    try:
        server = pool.start(worker=TINY, live_max_gap_s=30.0).wait_loaded()
        with Client(server.endpoint, timeout=30, heartbeat_s=0.5, give_up_s=900) as client:
            chunks = LiveChunks()
            live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
            live.send_poses(payload.poses[:9])
            live.send_poses(payload.poses[9:21])
            wait_chunk(chunks, 0)
            server.kill_group()
            server.tables["server"]["bind"] = server.endpoint
            server.start()
            ack = live.send_poses(payload.poses[21:], end=True, timeout=300)
            assert ack.seq == 2 and ack.poses == 33  # batches 0 and 1 came back from the spool
            outcome = live.job.wait(timeout=JOB_S)
        assert isinstance(outcome, Result), outcome
        assert outcome.provenance["output"]["frames"] == 33
        assert [c.index for c in chunks.in_order()] == [0, 1, 2]
        assert "1 job(s) resumed" in server.log()
    finally:
        pool.close()


def test_after_a_server_restart_the_chunks_come_again_without_another_pose_batch(tmp_path, payload):
    """The client's heartbeat `watch` asks for the job's chunks again on the restarted server's new
    connection: the rerun's chunks arrive although the client sends no poses after the restart, only `end`."""
    pool = ServerPool(tmp_path)
    try:
        server = pool.start(worker=TINY, live_max_gap_s=30.0).wait_loaded()
        with Client(server.endpoint, timeout=30, heartbeat_s=0.5, give_up_s=900) as client:
            chunks, every_chunk = LiveChunks(), []
            live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics, FAST, on_event=chunks)
            live.job.add_callback(lambda e: every_chunk.append(e.index) if isinstance(e, Chunk) else None)
            live.send_poses(payload.poses[:9])
            live.send_poses(payload.poses[9:21])
            wait_chunk(chunks, 0)
            server.kill_group()
            before = len(every_chunk)
            server.tables["server"]["bind"] = server.endpoint
            server.start()
            live.end(timeout=300)  # no poses: the job makes the chunks of the 21 it holds
            outcome = live.job.wait(timeout=JOB_S)
        assert isinstance(outcome, Result), outcome
        assert outcome.provenance["output"]["frames"] == 21  # chunks 0 and 1
        assert every_chunk[before:] == [0, 1]  # the rerun's chunks, streamed to the re-watching connection
        assert [c.index for c in chunks.in_order()] == [0, 1]
        assert "1 job(s) resumed" in server.log()
    finally:
        pool.close()
