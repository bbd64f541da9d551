"""Issue 53: a live job's two limits (docs/protocol.md, "Live jobs", 5.), through a real server with its
real worker (the tiny Fast model on the CPU) and raw pyzmq + msgpack clients, as an outside client
written from the protocol would be. A client that sends one pose a second (far below the video's 16 a
second) is ended by the deadline, its chunk so far kept as its result, and another client's queued
batch job starts within 5 s; a client that falls silent is ended by the gap; a job that made no chunk
fails with the limit's code."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from bridge.client.episode_payload import EpisodePayload
from bridge.wire import protocol
from contracts.video import read_mp4
from tests.bridge.conftest import TINY, ServerPool, make_episode

pytestmark = pytest.mark.slow  # the tiny model makes real chunks: ~40 s for the module on a 2-core machine

FAST = {"model": "fast", "size": "48*80", "frame_num": 33, "seed": 7}  # chunks need the first 9, 21, 33 poses
FPS = 16  # FAST's fps (the settings' default): its real-time length is 33 / 16 s
GAP_S, FACTOR, EXTRA_S = 3.0, 1.0, 2.0  # the server's live_max_gap_s, live_deadline_factor, live_deadline_extra_s
DEADLINE_S = FACTOR * FAST["frame_num"] / FPS + EXTRA_S  # 4.06 s of waiting for poses
JOB_S = 300  # a chunk of the tiny model takes seconds on a loaded 2-core machine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pool = ServerPool(tmp_path_factory.mktemp("live-limits"))
    try:
        yield pool.start(worker=TINY, live_max_gap_s=GAP_S, live_deadline_factor=FACTOR,
                         live_deadline_extra_s=EXTRA_S).wait_loaded()  # fmt: skip
    finally:
        pool.close()


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> EpisodePayload:
    return EpisodePayload.from_dir(make_episode(tmp_path_factory.mktemp("episode") / "ep", n=33))


class Peer:
    """A raw DEALER that keeps every message it read: answers (by rid) and job events alike, each
    with the time it arrived."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(endpoint)
        self.got: list[tuple[float, protocol.Message]] = []

    def drain(self, wait_s: float = 0.0) -> None:
        while self.socket.poll(int(wait_s * 1000)):
            self.got.append((time.monotonic(), protocol.decode_reply(self.socket.recv_multipart())))
            wait_s = 0.0

    def pause(self, seconds: float) -> None:
        """Read whatever comes for `seconds`."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self.drain(left)

    def first(self, match, timeout: float) -> tuple[float, protocol.Message]:
        """The first message (kept or coming) for which `match(message)` holds, and when it came."""
        deadline = time.monotonic() + timeout
        while True:
            found = next(((t, m) for t, m in self.got if match(m)), None)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"nothing matched within {timeout} s; got {[m.type for _, m in self.got]}"
            self.drain(min(left, 0.2))

    def ask(self, frames: list, rid: str, timeout: float = 10.0) -> protocol.Message:
        self.socket.send_multipart(frames)
        return self.first(lambda m: m.fields.get("rid") == rid, timeout)[1]

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def is_event(kind: str, job: str, **fields):
    return lambda m: m.type == kind and m.fields.get("job") == job and all(m.fields.get(k) == v
                                                                          for k, v in fields.items())  # fmt: skip


def open_live(peer: Peer, payload: EpisodePayload, rid: str) -> str:
    fields = {"rid": rid, "live_v": protocol.LIVE_VERSION, "prompt": "a corridor", "settings": FAST}
    reply = peer.ask(protocol.encode("live", fields, {"intrinsics": payload.intrinsics[:1]}, {"image": payload.image}),
                     rid)  # fmt: skip
    assert reply.type == "accepted", reply.fields
    return reply.fields["job"]


def send_poses(peer: Peer, job: str, seq: int, poses: np.ndarray) -> protocol.Message:
    rid = f"{job[:6]}-p{seq}"
    return peer.ask(protocol.encode("poses", {"rid": rid, "job": job, "seq": seq}, {"poses": poses}), rid)


def frame_count(video: bytes, path: Path) -> int:
    path.write_bytes(video)
    return read_mp4(path)[0].shape[0]


def test_a_slow_client_is_ended_by_the_deadline_and_the_next_job_starts_within_5_s(server, payload, tmp_path):
    slow, other, watcher = Peer(server.endpoint), Peer(server.endpoint), Peer(server.endpoint)
    try:
        job = open_live(slow, payload, "slow")
        assert send_poses(slow, job, 0, payload.poses[:9]).type == "poses_ok"
        fields = {"rid": "batch", "prompt": "a corridor", "settings": {"steps": 2, "size": "48*80", "frame_num": 9}}
        batch = other.ask(protocol.encode("submit", fields, {"poses": payload.poses[:9],
                                                             "intrinsics": payload.intrinsics[:9]},
                                          {"image": payload.image}), "batch")  # fmt: skip
        assert batch.type == "accepted" and batch.fields["queue_position"] >= 1, batch.fields
        batch_job = batch.fields["job"]
        chunk0_at, _ = slow.first(is_event("chunk", job, index=0), JOB_S)
        # from here the model waits for the 21 poses of chunk 1; the client sends one a second (a 16 fps
        # video's poses at 1/16 of its pace), never a gap the gap limit would end
        seq, held, ended = 1, 9, None
        while ended is None and held < 20:
            reply = send_poses(slow, job, seq, payload.poses[held : held + 1])
            if reply.type == "error":
                assert reply.fields["code"] == "job_over", reply.fields
                break
            assert reply.type == "poses_ok", reply.fields
            seq, held = seq + 1, held + 1
            slow.pause(1.0)
            ended = next((m for _, m in slow.got if is_event("result", job)(m) or is_event("error", job)(m)), None)
        ended_at, result = slow.first(is_event("result", job), 30)
        started_at, _ = other.first(is_event("progress", batch_job, phase="starting"), 30)

        live = result.fields["provenance"]["live"]
        assert result.fields["error"]["code"] == "live_deadline", (result.fields["error"], live, chunk0_at, ended_at)
        assert "live_deadline_factor" in result.fields["error"]["message"]
        assert frame_count(result.blobs["video"], tmp_path / "slow.mp4") == 9  # chunk 0: the frames made so far
        assert live["limit"]["code"] == "live_deadline" and DEADLINE_S <= live["waited_s"] < DEADLINE_S + 1.5, live
        assert [c["poses"] for c in live["chunks"]] == [9] and held < 21
        # the worker is free at once: the queued batch job starts within 5 s of the deadline
        assert started_at - (chunk0_at + DEADLINE_S) < 5.0, (started_at - chunk0_at, ended_at - chunk0_at)
        assert started_at - ended_at < 5.0
        # the job is done, the limit named; its video is kept and anyone with the job id fetches it
        status = watcher.ask(protocol.encode("watch", {"rid": "w", "job": job}), "w")
        assert status.fields["state"] == "done" and status.fields["error"]["code"] == "live_deadline", status.fields
        _, fetched = watcher.first(is_event("result", job), 30)
        assert fetched.blobs["video"] == result.blobs["video"] and fetched.fields["error"] == result.fields["error"]
        late = send_poses(slow, job, seq, payload.poses[held : held + 1])
        assert late.type == "error" and late.fields["code"] == "job_over", late.fields
        cancel = other.ask(protocol.encode("cancel", {"rid": "c", "job": batch_job}), "c")
        assert cancel.type == "status", cancel.fields
    finally:
        for peer in (slow, other, watcher):
            peer.close()


def test_a_client_that_falls_silent_is_ended_by_the_gap_with_its_chunk_kept(server, payload, tmp_path):
    silent = Peer(server.endpoint)
    try:
        job = open_live(silent, payload, "silent")
        assert send_poses(silent, job, 0, payload.poses[:9]).type == "poses_ok"
        chunk0_at, _ = silent.first(is_event("chunk", job, index=0), JOB_S)
        ended_at, result = silent.first(is_event("result", job), 30)
        assert result.fields["error"]["code"] == "live_gap", result.fields
        assert "live_max_gap_s" in result.fields["error"]["message"]
        assert GAP_S <= ended_at - chunk0_at < GAP_S + 5.0
        assert frame_count(result.blobs["video"], tmp_path / "silent.mp4") == 9
        status = silent.ask(protocol.encode("status", {"rid": "s", "job": job}), "s")
        assert status.fields["state"] == "done" and status.fields["error"]["code"] == "live_gap", status.fields
    finally:
        silent.close()


def test_a_job_a_limit_ends_before_its_first_chunk_fails_with_the_limit_named(server, payload):
    mute = Peer(server.endpoint)
    try:
        job = open_live(mute, payload, "mute")  # and no pose ever
        _, error = mute.first(is_event("error", job), JOB_S)
        assert error.fields["code"] == "live_gap" and "made no chunk" in error.fields["message"], error.fields
        status = mute.ask(protocol.encode("status", {"rid": "s", "job": job}), "s")
        assert status.fields["state"] == "failed" and status.fields["error"]["code"] == "live_gap", status.fields
    finally:
        mute.close()
