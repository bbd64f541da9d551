"""The server and the client library over real loopback sockets, with a real server subprocess.

The worker here is `tests/bridge/standin_worker.py`: worldgen.worker's real loop around a
stand-in engine that sleeps a known time per step, so crashes and cancels land mid-job on cue.
The same scenarios with the real tiny model are in test_tiny_worker.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time

import msgpack
import numpy as np
import pytest
import zmq

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed, PayloadError, RequestFailed, ServerUnavailable
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import JobError, Progress, Result
from bridge.wire import protocol
from contracts.settings import SettingsError, load_settings
from tests.bridge.conftest import concurrently, make_episode, pid_alive, standin_command, wait_for

MAGIC = b"STANDIN-VIDEO\n"


def record_of(video: bytes) -> dict:
    """What the stand-in engine was asked to do: the record at the end of its mp4's mdat."""
    assert video[4:8] == b"ftyp" and MAGIC in video, video[:40]
    return json.loads(video[video.rindex(MAGIC) + len(MAGIC) :])


class RawDealer:
    """A bare DEALER socket for sending what the client library never would."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(endpoint)

    def ask(self, frames: list, timeout: float = 5.0) -> protocol.Message:
        self.socket.send_multipart(frames)
        return self.read(timeout)

    def read(self, timeout: float = 5.0) -> protocol.Message:
        if not self.socket.poll(int(timeout * 1000)):
            raise TimeoutError("no message")
        return protocol.decode_reply(self.socket.recv_multipart())

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def client_factory():
    clients = []

    def make(endpoint: str, **kwargs) -> Client:
        kwargs.setdefault("timeout", 5.0)
        kwargs.setdefault("heartbeat_s", 0.5)
        client = Client(endpoint, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_episode_in_progress_back_result_out(servers, client_factory, episode):
    server = servers()
    client = client_factory(server.endpoint)
    seen = []
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 6, "seed": 7}, on_event=seen.append)
    assert len(job.id) == 32 and job.queue_position == 0
    events = list(job.events(timeout=10))
    phases = [e.phase for e in events if isinstance(e, Progress)]
    assert phases[0] == "starting" and phases[-1] == "write"
    denoise = [e for e in events if isinstance(e, Progress) and e.phase == "denoise"]
    assert [e.step for e in denoise] == list(range(7)) and all(e.total == 6 for e in denoise)
    assert denoise[-1].eta_s == 0 and denoise[2].eta_s > 0
    assert isinstance(events[-1], Result) and job.done()
    assert seen == events  # callbacks saw the same events, in order
    # The episode reached the worker intact, through the socket and the spool.
    record = record_of(job.result(timeout=1))
    poses = np.load(episode / "poses.npy")
    assert record["poses_sha256"] == hashlib.sha256(poses.tobytes()).hexdigest()
    assert record["image_sha256"] == hashlib.sha256((episode / "image.png").read_bytes()).hexdigest()
    assert record["prompt"] == (episode / "prompt.txt").read_text()
    expected = load_settings(preset="tiny").replace(steps=6, seed=7).to_dict()
    assert record["settings"] == expected  # the server's tiny preset under the job's overrides
    assert client.status(job.id)["state"] == "done"
    # A later watcher (another connection) gets the finished job's result again.
    other = client_factory(server.endpoint)
    assert record_of(other.watch(job.id).result(timeout=5)) == record


def test_jpeg_and_float64_episode(servers, client_factory, tmp_path):
    server = servers()
    client = client_factory(server.endpoint)
    episode = make_episode(tmp_path / "jpeg", image_format="jpg")
    payload = EpisodePayload.from_dir(episode)
    payload.poses = payload.poses.astype(np.float64)
    job = client.submit(payload, {"steps": 2})
    record = record_of(job.result(timeout=10))
    assert record["image_name"] == "image.jpg" and record["poses_dtype"] == "float64"
    assert job.frames is None


def test_health_exercises_the_worker(servers, client_factory):
    server = servers(worker_keys={"health_timeout_s": 1.0}, worker=standin_command(step_s=0.2))
    client = client_factory(server.endpoint)
    health = wait_for(lambda: (h := client.health())["ok"] and h, 20, what="the worker")  # it may still start
    assert health["protocol"] == protocol.PROTOCOL_VERSION
    worker = health["worker"]
    assert worker["state"] == "idle" and worker["reported"]["state"] == "idle" and pid_alive(worker["pid"])
    assert health["model"]["model"] == "standin" and health["memory"]["rss_mb"] > 0
    assert health["queue"]["waiting"] == 0
    # A stopped worker is a live process that cannot answer: health must say so.
    os.kill(worker["pid"], signal.SIGSTOP)
    try:
        stopped = client.health()
        assert stopped["ok"] is False and "did not answer" in stopped["worker"]["error"]
    finally:
        os.kill(worker["pid"], signal.SIGCONT)
    assert wait_for(lambda: client.health()["ok"], 5, what="health after SIGCONT")


def test_health_while_busy_shows_the_running_job(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=0.1))
    client = client_factory(server.endpoint)
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 30})
    wait_for(lambda: job.latest and job.latest.phase == "denoise", 10, what="denoising")
    health = client.health()
    assert health["ok"] and health["worker"]["reported"]["state"] == "busy"
    assert health["worker"]["reported"]["job"] == job.id and health["queue"]["running"] == job.id
    assert health["worker"]["reported"]["progress"]["phase"] == "denoise"
    client.cancel(job.id)


def test_engine_errors_are_reported_and_the_worker_goes_on(servers, client_factory, tmp_path):
    server = servers()
    client = client_factory(server.endpoint)
    bad = client.submit(EpisodePayload.from_dir(make_episode(tmp_path / "a", prompt="x [bad-input]")))
    with pytest.raises(JobFailed) as info:
        bad.result(timeout=10)
    assert info.value.code == "bad_input" and "prompt.txt" in info.value.message
    boom = client.submit(EpisodePayload.from_dir(make_episode(tmp_path / "b", prompt="x [explode]")))
    with pytest.raises(JobFailed) as info:
        boom.result(timeout=10)
    assert info.value.code == "worker_error" and "exploded" in info.value.message
    good = client.submit(EpisodePayload.from_dir(make_episode(tmp_path / "c")), {"steps": 1})
    assert record_of(good.result(timeout=10))
    assert client.health()["worker"]["restarts"] == 0


def test_requests_the_server_refuses(servers, client_factory, episode):
    server = servers(limits={"max_steps": 50})
    client = client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)
    with pytest.raises(RequestFailed) as info:
        client.submit(payload, {"steps": 51})
    assert info.value.code == "bad_settings" and "cap" in info.value.message
    with pytest.raises(RequestFailed) as info:
        client.submit(payload, {"size": "4096*4096"})
    assert info.value.code == "bad_settings"
    with pytest.raises(SettingsError):  # caught before sending
        client.submit(payload, {"stepz": 3})
    with pytest.raises(RequestFailed) as info:
        client.status("0" * 32)
    assert info.value.code == "not_found"
    raw = RawDealer(server.endpoint)
    try:
        header = {"v": 1, "type": "submit", "rid": "r1", "prompt": "p", "settings": {"shift": float("nan")}}
        frames = protocol.encode(
            "submit", header, {"poses": payload.poses, "intrinsics": payload.intrinsics}, {"image": payload.image}
        )
        reply = raw.ask(frames)
        assert reply.type == "error" and reply.fields["code"] == "bad_settings" and reply.fields["rid"] == "r1"
        gif = protocol.encode(
            "submit",
            {"rid": "r2", "prompt": "p"},
            {"poses": payload.poses, "intrinsics": payload.intrinsics},
            {"image": b"GIF89a..."},
        )
        assert raw.ask(gif).fields["code"] == "bad_input"
        old = raw.ask([msgpack.packb({"v": 0, "type": "health", "rid": "r3"})])
        assert old.fields["code"] == "bad_version" and old.fields["rid"] == "r3"
    finally:
        raw.close()
    with pytest.raises(PayloadError, match="shape"):
        EpisodePayload(payload.image, payload.poses[:, :3], payload.intrinsics, "p")


def test_submit_is_idempotent_per_request_id(servers, episode):
    """A client that lost the `accepted` reply sends the same submit again: still one job, and a
    retry after the job ended gets its result. Retries are recognised per connection (identity),
    never by the `client` field: another connection sending the same fields gets its own job,
    while anyone holding the job id can watch it."""
    server = servers(worker=standin_command(step_s=0.1))
    payload = EpisodePayload.from_dir(episode)
    frames = protocol.encode(
        "submit",
        {"rid": "same", "client": "me", "prompt": "p", "settings": {"steps": 5}},
        {"poses": payload.poses, "intrinsics": payload.intrinsics},
        {"image": payload.image},
    )
    first, other, watcher = RawDealer(server.endpoint), RawDealer(server.endpoint), RawDealer(server.endpoint)
    try:
        a = first.ask(frames)
        b = first.ask(frames)
        while b.type == "progress":  # the job's own events may come before the second answer
            b = first.read()
        assert a.type == b.type == "accepted" and a.fields["job"] == b.fields["job"]
        while (event := first.read()).type != "result":  # progress events, then the result
            assert event.type == "progress"
        again = first.ask(frames)
        assert again.type == "accepted" and again.fields["job"] == a.fields["job"]
        assert other.ask(frames).fields["job"] != a.fields["job"]  # not a retry: a job of its own
        assert watcher.ask(protocol.encode("watch", {"rid": "w", "job": a.fields["job"]})).type == "status"
        assert watcher.read().blobs["video"] == event.blobs["video"]
    finally:
        for dealer in (first, other, watcher):
            dealer.close()


def test_worker_sigkill_mid_job_fails_that_job_then_the_next_succeeds(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=0.1))
    client = client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)
    job = client.submit(payload, {"steps": 40})
    wait_for(lambda: job.latest and job.latest.phase == "denoise" and job.latest.step >= 2, 10, what="step 2")
    old_pid = client.health()["worker"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(JobFailed) as info:
        job.result(timeout=10)
    assert info.value.code == "worker_crashed" and "SIGKILL" in info.value.message
    assert client.status(job.id)["error"]["code"] == "worker_crashed"
    health = wait_for(lambda: (h := client.health())["ok"] and h, 15, what="a restarted worker")
    assert health["worker"]["pid"] != old_pid and health["worker"]["restarts"] == 1
    assert "SIGKILL" in health["worker"]["last_exit"]
    assert record_of(client.submit(payload, {"steps": 2}).result(timeout=10))


def test_server_sigkill_with_queued_jobs_loses_none(servers, client_factory, episode, tmp_path):
    release = tmp_path / "release-the-worker"  # the first job runs until the kill, however slow the machine
    server = servers(worker=standin_command(step_s=0.1, hold_until=release))
    client = client_factory(server.endpoint, give_up_s=60)
    payload = EpisodePayload.from_dir(episode)
    jobs = [client.submit(payload, {"steps": 8, "seed": i}) for i in range(4)]
    assert [j.queue_position for j in jobs] == [0, 1, 2, 3]
    wait_for(lambda: jobs[0].latest and jobs[0].latest.phase == "denoise", 10, what="the first job running")
    worker_pid = client.health()["worker"]["pid"]
    server.kill()  # SIGKILL, the server only: its worker must notice and go
    wait_for(lambda: not pid_alive(worker_pid), 10, what="the orphaned worker to exit")
    assert not any(job.done() for job in jobs)
    release.touch()
    server.tables["server"]["bind"] = server.endpoint  # same port, same spool
    server.start()
    # The same client reconnects on its own and gets every outcome; the interrupted job was resumed.
    seeds = sorted(record_of(job.result(timeout=30))["settings"]["seed"] for job in jobs)
    assert seeds == [0, 1, 2, 3]
    assert "4 job(s) resumed" in server.log()


def test_eight_clients_three_jobs_each(servers, episode):
    # Without keys all loopback connections share one client's queue cap (bridge/server/peer_process.py):
    # room for the 24 jobs of these 8 clients (a server of several users would give them keys)
    server = servers(worker=standin_command(step_s=0.005), max_queue_per_client=24)
    payload = EpisodePayload.from_dir(episode)
    results: dict[int, list] = {}

    def one_client(index: int) -> None:
        with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
            jobs = [client.submit(payload, {"steps": 3, "seed": 100 * index + k}) for k in range(3)]
            results[index] = [record_of(job.result(timeout=60))["settings"]["seed"] for job in jobs]

    errors = concurrently(one_client, 8, timeout=90)
    assert not errors, errors
    assert results == {i: [100 * i, 100 * i + 1, 100 * i + 2] for i in range(8)}


def test_fair_queue_lets_a_second_client_through(servers, client_factory, episode, tmp_path):
    release = tmp_path / "release-the-worker"  # greedy's first job runs until polite has submitted
    server = servers(worker=standin_command(step_s=0.05, hold_until=release))
    greedy, polite = client_factory(server.endpoint), client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)
    wait_for(lambda: greedy.health()["ok"], 10, what="the worker")
    finished: list[str] = []
    greedy_jobs = [greedy.submit(payload, {"steps": 10}, on_event=_record_end(finished, "greedy")) for _ in range(5)]
    polite_job = polite.submit(payload, {"steps": 4}, on_event=_record_end(finished, "polite"))
    assert polite_job.queue_position == 2  # the running job, then greedy's next, then polite's
    release.touch()
    for job in [*greedy_jobs, polite_job]:
        job.result(timeout=30)
    assert finished.index("polite") == 2


def _record_end(finished: list, name: str):
    def on_event(event) -> None:
        if isinstance(event, (Result, JobError)):
            finished.append(name)

    return on_event


def test_queue_cap_answers_busy(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=0.2), max_queue=2, max_queue_per_client=2)
    client = client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)
    running = client.submit(payload, {"steps": 50})
    wait_for(lambda: running.latest and running.latest.phase != "queued", 5, what="the first job to start")
    queued = [client.submit(payload, {"steps": 1}) for _ in range(2)]
    with pytest.raises(RequestFailed) as info:
        client.submit(payload, {"steps": 1})
    assert info.value.code == "busy"
    other = client_factory(server.endpoint)
    with pytest.raises(RequestFailed) as info:
        other.submit(payload, {"steps": 1})
    assert info.value.code == "busy" and "queue is full" in info.value.message
    for job in (running, *queued):
        client.cancel(job.id)


def test_cancel_queued_and_running_jobs(servers, client_factory, episode):
    step_s = 0.25
    server = servers(worker=standin_command(step_s=step_s))
    client = client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)
    running = client.submit(payload, {"steps": 40})
    queued = client.submit(payload, {"steps": 1})
    assert client.cancel(queued.id)["state"] == "cancelled"
    with pytest.raises(JobFailed) as info:
        queued.result(timeout=5)
    assert info.value.code == "cancelled" and "queued" in info.value.message
    wait_for(
        lambda: running.latest and running.latest.phase == "denoise" and running.latest.step >= 1, 10, what="denoising"
    )
    asked = time.monotonic()
    status = client.cancel(running.id)
    assert status["state"] == "running" and status.get("cancelling") is True
    with pytest.raises(JobFailed) as info:
        running.result(timeout=10)
    assert info.value.code == "cancelled" and "denoise" in info.value.message
    assert time.monotonic() - asked < 2 * step_s + 1.0  # at the next step, not at the end
    assert client.status(running.id)["state"] == "cancelled"
    health = client.health()
    assert health["worker"]["restarts"] == 0 and health["ok"]  # stopped by the step, not killed
    assert record_of(client.submit(payload, {"steps": 1}).result(timeout=10))


def test_client_without_a_server_fails_fast_and_never_blocks(tmp_path, episode):
    with Client("tcp://127.0.0.1:9", timeout=1.0, retries=2) as client:  # nothing listens on port 9
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="no answer"):
            client.health()
        assert time.monotonic() - started < 2.5
        started = time.monotonic()
        future = client.submit_async(EpisodePayload.from_dir(episode))
        assert time.monotonic() - started < 0.5  # a UI thread is never held up
        with pytest.raises(ServerUnavailable):
            future.result(timeout=5)


def test_closing_the_client_ends_its_jobs(servers, episode):
    server = servers(worker=standin_command(step_s=0.2))
    client = Client(server.endpoint, timeout=5)
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 30})
    client.close()
    with pytest.raises(JobFailed) as info:
        job.result(timeout=5)
    assert info.value.code == "closed"


def test_a_worker_that_cannot_start_makes_the_server_answer_unavailable(servers, client_factory, episode):
    server = servers(worker=[*standin_command(), "--fail-load"], worker_keys={"max_start_failures": 2,
                     "restart_backoff_s": [0.1, 0.2]})  # fmt: skip
    client = client_factory(server.endpoint)
    payload = EpisodePayload.from_dir(episode)

    def refused():
        try:
            client.submit(payload, {"steps": 1})
        except RequestFailed as exc:
            return exc
        return None

    error = wait_for(refused, 20, interval=0.2, what="submits to be refused")
    assert error.code == "unavailable" and "checkpoint" in error.message and "/nowhere" in error.message, error.message
    health = client.health()
    assert health["ok"] is False and "/nowhere" in health["server"]["unavailable"]


def test_a_silent_job_is_failed_as_stalled_and_the_worker_restarted(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=30), worker_keys={"stall_timeout_s": 1.0})
    client = client_factory(server.endpoint)
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 3})
    with pytest.raises(JobFailed) as info:
        job.result(timeout=15)
    assert info.value.code == "stalled" and "no progress" in info.value.message
    assert wait_for(lambda: (h := client.health())["ok"] and h, 10, what="a new worker")["worker"]["restarts"] == 1


def test_a_job_that_ignores_its_cancel_is_stopped_by_restarting_the_worker(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=30), worker_keys={"cancel_grace_s": 0.5})
    client = client_factory(server.endpoint)
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 3})
    wait_for(lambda: job.latest and job.latest.phase == "denoise", 10, what="denoising")  # now asleep in a step
    client.cancel(job.id)
    with pytest.raises(JobFailed) as info:
        job.result(timeout=10)
    assert info.value.code == "cancelled" and "did not stop within" in info.value.message
    assert wait_for(lambda: (h := client.health())["ok"] and h, 10, what="a new worker")["worker"]["restarts"] == 1


def test_jobs_end_as_unreachable_when_the_server_is_gone_for_good(servers, client_factory, episode):
    server = servers(worker=standin_command(step_s=0.5))
    client = client_factory(server.endpoint, timeout=1.0, heartbeat_s=0.2, give_up_s=2.0)
    job = client.submit(EpisodePayload.from_dir(episode), {"steps": 40})
    server.kill_group()
    with pytest.raises(JobFailed) as info:
        job.result(timeout=15)
    assert info.value.code == "unreachable" and "Client.watch" in info.value.message


def test_sigterm_stops_the_server_and_its_worker(servers, client_factory):
    server = servers()
    client = client_factory(server.endpoint)
    worker_pid = wait_for(lambda: (h := client.health())["ok"] and h, 20, what="the worker")["worker"]["pid"]
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=15) == 0
    assert not pid_alive(worker_pid)  # stopped by the server itself (the fixture kills the group only later)
