"""Issue 53: the project's fuzz campaign (tests/bridge/strategies.py) through live jobs: opens with blank
prompts, junk settings, frame counts out of range, bad intrinsics and images that are not whole; pose
batches with NaN, inf and far translations in float32 and float64, wrong shapes and dtypes, seqs out of
order, to real jobs and to foreign ids; `end`, `cancel` and `watch` of both. A raw DEALER against a real
server subprocess: every message gets one answer, and none is `internal`.

Two servers: one whose only worker is held by a first job, so every live job stays queued and takes
poses (fast: 1,000 messages); one with the tiny model, whose live jobs run, make chunks and are ended by
the limits (`live_gap`, `live_deadline`) while the campaign goes on (slow: 10,000 messages)."""

from __future__ import annotations

import time

import pytest
import zmq

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.wire import protocol
from tests.bridge.conftest import TINY, make_episode, standin_command, wait_for
from tests.bridge.strategies import adversarial_live_messages
from tests.bridge.test_server import RawDealer

MAX_LIVE_JOBS = 6  # live jobs the campaign keeps open at once (the oldest is cancelled beyond)
CHEAP = {"max_area": 96 * 160, "max_frame_num": 33, "max_steps": 4}  # [limits]: any job the tiny model runs is small


def campaign(server, count: int, seed: int, cancel_retired: bool) -> dict[str, int]:
    """Send `count` messages of `adversarial_live_messages`; -> how many answers of each type or code.
    A live job leaves the campaign's list once it takes no more poses (or beyond MAX_LIVE_JOBS, the
    oldest); `cancel_retired`: it is cancelled then (a queued job would hold its place in the queue)."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    socket.connect(server.endpoint)
    jobs: dict[str, int] = {}  # live job id -> the next seq it takes (the generator reads it)
    own: set[str] = set()  # rids of our own cancels (set aside, as the jobs' events are)
    codes: dict[str, int] = {}

    def cancel(job: str) -> None:
        own.add(f"own-{job}")
        socket.send_multipart(protocol.encode("cancel", {"rid": f"own-{job}", "job": job}))

    def retire(job: str) -> None:
        if jobs.pop(job, None) is not None and cancel_retired:
            cancel(job)

    def answer(what: str) -> protocol.Message:
        while True:
            assert socket.poll(10_000), f"no answer to {what}"
            reply = protocol.decode_reply(socket.recv_multipart())
            rid = reply.get("rid")
            if rid in own:
                own.discard(rid)
            elif rid is not None or (reply.type == "error" and reply.get("job") is None):
                return reply
            elif reply.type in ("result", "error"):  # a job's end (done, failed, cancelled, a limit)
                jobs.pop(reply.get("job"), None)

    try:
        for i, frames in enumerate(adversarial_live_messages(count, jobs, seed=seed)):
            socket.send_multipart(frames)
            reply = answer(f"message {i}")
            key = reply.fields.get("code", reply.type) if reply.type == "error" else reply.type
            codes[key] = codes.get(key, 0) + 1
            rid, job = reply.get("rid") or "", reply.get("job")
            if reply.type == "accepted" and rid.startswith("open-"):
                jobs[job] = 0
                if len(jobs) > MAX_LIVE_JOBS:
                    retire(next(iter(jobs)))
            elif reply.type == "accepted":
                cancel(job)  # a batch job the campaign's submits started
            elif reply.type == "poses_ok" and job in jobs:
                jobs[job] = max(jobs[job], reply.fields["seq"] + 1)
                if reply.fields["ended"]:
                    retire(job)
            elif job in jobs and (reply.get("state") in protocol.TERMINAL_STATES or key in ("job_over", "not_found")):
                retire(job)
            assert server.alive(), f"the server died at message {i}"
        for job in list(jobs):
            cancel(job)
        deadline = time.monotonic() + 20
        while own and socket.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            own.discard(protocol.decode_reply(socket.recv_multipart()).get("rid"))
        assert not own, f"{len(own)} cancels unanswered"
    finally:
        socket.close(linger=0)
        context.term()
    return codes


def check(codes: dict[str, int], count: int) -> None:
    print(dict(sorted(codes.items())))
    assert sum(codes.values()) == count  # one answer per message
    assert codes.get("internal", 0) == 0, codes
    # the campaign reached past the decoder: live jobs were opened and fed, and refused for what they are
    for reached in ("accepted", "poses_ok", "status", "bad_input", "bad_settings", "bad_request", "not_found",
                    "out_of_order", "job_over"):  # fmt: skip
        assert codes.get(reached, 0) > 0, (reached, codes)


def test_a_thousand_live_messages_to_queued_jobs_are_never_internal(servers, tmp_path):
    server = servers(worker=standin_command(step_s=0.01, hold_until=tmp_path / "never"), limits=CHEAP,
                     max_queue=16, max_queue_per_client=12)  # fmt: skip
    holder = RawDealer(server.endpoint)  # another client's batch job holds the only worker
    try:
        payload = EpisodePayload.from_dir(make_episode(tmp_path / "ep", n=9))
        held = holder.ask(protocol.encode("submit", {"rid": "hold", "prompt": "go", "settings": {"steps": 2}},
                                          {"poses": payload.poses, "intrinsics": payload.intrinsics},
                                          {"image": payload.image}))  # fmt: skip
        assert held.type == "accepted", held.fields
        check(campaign(server, 1000, seed=53, cancel_retired=True), 1000)
    finally:
        holder.close()
    with Client(server.endpoint, timeout=10) as client:
        assert client.health()["worker"]["state"] == "busy"  # still the holder's job: nothing else ran


@pytest.mark.slow
def test_ten_thousand_live_messages_to_running_jobs_are_never_internal(servers):
    server = servers(worker=TINY, limits=CHEAP, max_queue=16, max_queue_per_client=12, live_max_gap_s=1.0,
                     live_deadline_factor=1.0, live_deadline_extra_s=1.0).wait_loaded()  # fmt: skip
    began = time.monotonic()
    codes = campaign(server, 10_000, seed=5300, cancel_retired=False)
    print(f"10,000 answers in {time.monotonic() - began:.1f} s")
    check(codes, 10_000)
    log = server.log()
    assert log.count("started on worker") >= 2, "the worker ran no live job during the campaign"
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]
    with Client(server.endpoint, timeout=10) as client:
        assert wait_for(lambda: client.health()["ok"], 60, what="a healthy server")
