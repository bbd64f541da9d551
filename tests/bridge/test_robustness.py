"""Issue 12, each point reproduced against a real server subprocess (and, for the storage tests, a
real size-limited or read-only filesystem mounted by the test).

1. one bad message must not stall the server (settings validated at the edge; a job that cannot
   reach the worker fails at once and frees the worker);
2. a full or read-only spool never loses an accepted job, `health` says why, recovery needs no
   restart, results are verified before "done";
3. spool quotas, inputs released at once;
4. Isaac's UI thread never blocks on the session (see test_session_does_not_block below);
5. `watch` on a finished job does not multiply memory;
6. identity is the connection (or CurveZMQ key), never a message field;
7. `health` tells the truth.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed, RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.server.spool import Spool
from bridge.wire import protocol
from tests.bridge.conftest import make_episode, rss_mb, standin_command, wait_for
from tests.bridge.test_server import RawDealer, record_of


def submit_frames(payload: EpisodePayload, rid: str, settings: dict | None = None, client: str | None = None,
                  prompt: str = "go forward", image: bytes | None = None) -> list:  # fmt: skip
    fields = {"rid": rid, "prompt": prompt, "settings": settings or {"steps": 2}}
    if client is not None:
        fields["client"] = client
    return protocol.encode(
        "submit", fields, {"poses": payload.poses, "intrinsics": payload.intrinsics}, {"image": image or payload.image}
    )


def reply_to(dealer: RawDealer, frames: list, timeout: float = 10.0) -> protocol.Message:
    """Send a request and return its reply (skipping job events that arrive meanwhile)."""
    rid = msgpack.unpackb(frames[0])["rid"]
    message = dealer.ask(frames, timeout)
    while message.get("rid") != rid:
        message = dealer.read(timeout)
    return message


def ask(endpoint: str, frames: list, timeout: float = 10.0) -> protocol.Message:
    dealer = RawDealer(endpoint)
    try:
        return dealer.ask(frames, timeout)
    finally:
        dealer.close()


def padded_image(payload: EpisodePayload, size: int) -> bytes:
    """The episode's real PNG (the server reads its size at the door) padded to `size` bytes (Pillow
    ignores what follows the PNG's end), so a test can fill a quota with a few images."""
    return payload.image + os.urandom(size - len(payload.image))


def healthy(client: Client) -> dict:
    return wait_for(lambda: (h := client.health())["ok"] and h, 20, what="a healthy server")


# ---------------------------------------------------------------------------------------------
# 1. Settings at the edge; nothing accepted can stall the worker


BAD_SETTINGS = [
    {"fps": 1e30},
    {"seed": 1e30},
    {"fps": 10**30 // 10**12},  # an int msgpack can carry, far out of range
    {"seed": -1},
    {"size": 480},
    {"size": ["480", "832"]},
    {"negative_prompt": {"a": 1}},
    {"guide_scale": "lots"},
    {"guide_scale": [1.0, 2.0, 3.0]},
    {"steps": "4"},
    {"steps": 2.5},
    {"frame_num": True},
    {"shift": "5"},
    {"fps": 0},
]


@pytest.mark.parametrize("settings", BAD_SETTINGS, ids=lambda s: json.dumps(s))
def test_out_of_range_and_wrongly_typed_settings_are_bad_settings(servers, episode, settings):
    server = servers(worker=standin_command(step_s=0.01))
    payload = EpisodePayload.from_dir(episode)
    reply = ask(server.endpoint, submit_frames(payload, "bad-1", settings))
    assert reply.type == "error" and reply.fields["code"] == "bad_settings", reply.fields
    assert reply.fields["rid"] == "bad-1"
    # The next job runs at once: the worker was never handed the bad one.
    with Client(server.endpoint, timeout=10) as client:
        started = time.monotonic()
        assert record_of(client.submit(payload, {"steps": 2}).result(timeout=15))
        assert time.monotonic() - started < 10
        assert client.health()["queue"]["waiting"] == 0


def test_a_spooled_job_that_cannot_reach_the_worker_fails_at_once_and_frees_it(servers, tmp_path, episode):
    """A job already on disk (written by an older server) whose settings the worker pipe cannot
    carry: it fails with a reason at start-up, and the next job runs at once (no stall timeout)."""
    workdir = tmp_path / "server"
    spool = Spool(workdir / "spool")
    payload = EpisodePayload.from_dir(episode)
    record = spool.accept(
        client="old", rid="r-old", prompt="p", image=payload.image, poses=payload.poses,
        intrinsics=payload.intrinsics, settings={"steps": 2, "fps": 10**30},
    )  # fmt: skip
    spool.close()
    server = servers(worker=standin_command(step_s=0.01), worker_keys={"stall_timeout_s": 600.0})
    with Client(server.endpoint, timeout=10) as client:
        started = time.monotonic()
        assert record_of(client.submit(payload, {"steps": 2}).result(timeout=15))
        assert time.monotonic() - started < 10
        status = client.status(record.id)
        assert status["state"] == "failed" and status["error"]["code"] != "internal", status
        assert "fps" in status["error"]["message"]
        assert client.health()["ok"]


# ---------------------------------------------------------------------------------------------
# 2. A full or read-only spool


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a few MiB mounted by the test (root only); yields (path, mount-helper)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a size-limited tmpfs")
    target = tmp_path / "fs"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(target)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")

    def remount(mode: str) -> None:
        # EBUSY while a file there is open for writing (a job's result being written): try again
        for _ in range(200):
            if not subprocess.run(["mount", "-o", f"remount,{mode}", str(target)], capture_output=True).returncode:
                return
            time.sleep(0.01)
        raise AssertionError(f"cannot remount {target} {mode}")

    yield target, remount
    subprocess.run(["umount", "-l", str(target)], check=False)


def fill(path: Path) -> Path:
    """Fill the filesystem of `path` up to the last byte."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 16, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def test_read_only_spool_loses_nothing_and_recovers_without_a_restart(servers, small_fs, episode):
    fs, remount = small_fs
    server = servers(worker=standin_command(step_s=0.05), spool_dir=str(fs / "spool"), spool_min_free_bytes=0)
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.3, give_up_s=120) as client:
        healthy(client)
        jobs = [client.submit(payload, {"steps": 6, "seed": i}) for i in range(5)]
        wait_for(lambda: jobs[0].latest and jobs[0].latest.phase == "denoise", 10, what="the first job running")
        remount("ro")
        try:
            health = wait_for(lambda: (h := client.health())["ok"] is False and h, 10, what="health to notice")
            assert health["spool"]["writable"] is False
            assert "read-only" in health["spool"]["error"].lower()
            with pytest.raises(RequestFailed) as info:
                client.submit(payload, {"steps": 1})
            assert info.value.code == "storage"
            time.sleep(1.5)  # several loop turns on a read-only spool
            states = [client.status(job.id)["state"] for job in jobs]
            assert "done" not in states[1:], states  # nothing finishes without its files
            assert states.count("running") <= 1, states
            assert not any(job.done() for job in jobs)  # nothing ended as "done" (or failed) meanwhile
        finally:
            remount("rw")
        seeds = sorted(record_of(job.result(timeout=60))["settings"]["seed"] for job in jobs)
        assert seeds == [0, 1, 2, 3, 4]
        health = healthy(client)
        assert health["spool"]["writable"] is True
        assert health["worker"]["restarts"] == 0  # the worker's clean-up survived the read-only spool
        assert record_of(client.submit(payload, {"steps": 1}).result(timeout=20))


def test_full_spool_refuses_with_storage_then_every_accepted_job_completes(servers, small_fs, episode):
    fs, _ = small_fs
    server = servers(worker=standin_command(step_s=0.05), spool_dir=str(fs / "spool"), spool_min_free_bytes=0)
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.3, give_up_s=120) as client:
        healthy(client)
        jobs = [client.submit(payload, {"steps": 6, "seed": i}) for i in range(4)]
        filler = fill(fs)
        try:
            health = wait_for(lambda: (h := client.health())["ok"] is False and h, 15, what="health to notice")
            assert "space" in health["spool"]["error"].lower() or "full" in health["spool"]["error"].lower()
            with pytest.raises(RequestFailed) as info:
                client.submit(payload, {"steps": 1})
            assert info.value.code == "storage"
        finally:
            filler.unlink()
        seeds = sorted(record_of(job.result(timeout=60))["settings"]["seed"] for job in jobs)
        assert seeds == [0, 1, 2, 3]
        assert healthy(client)["spool"]["writable"] is True


def test_an_incomplete_result_is_never_done(servers, episode, tmp_path):
    """A worker that reports a result whose mp4 has no moov atom (a truncated write)."""
    server = servers(worker=[*standin_command(step_s=0.01), "--truncate"])
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10) as client:
        job = client.submit(payload, {"steps": 2})
        with pytest.raises(JobFailed) as info:
            job.result(timeout=15)
        assert "incomplete" in info.value.message or "moov" in info.value.message
        assert client.status(job.id)["state"] == "failed"


# ---------------------------------------------------------------------------------------------
# 3. Quotas


def test_spool_quota_and_cancelled_jobs_release_their_inputs(servers, episode):
    server = servers(worker=standin_command(step_s=0.2), spool_quota_bytes=3 << 20, limits={"max_image_bytes": 2 << 20})
    payload = EpisodePayload.from_dir(episode)
    big = padded_image(payload, 1 << 20)  # a 1 MiB image
    dealer = RawDealer(server.endpoint)
    spool_jobs = Path(server.tables["server"]["spool_dir"]) / "jobs"
    try:
        running = reply_to(dealer, submit_frames(payload, "run", {"steps": 50}))
        assert running.type == "accepted"
        for i in range(8):  # 8 x 1 MiB through a 3 MiB quota: each cancelled at once
            reply = reply_to(dealer, submit_frames(payload, f"big-{i}", image=big))
            assert reply.type == "accepted", reply.fields
            job = reply.fields["job"]
            status = reply_to(dealer, protocol.encode("cancel", {"rid": f"c-{i}", "job": job}))
            assert status.fields["state"] == "cancelled"
            assert not (spool_jobs / job / "episode").exists()  # the inputs went at once
        kept = [reply_to(dealer, submit_frames(payload, f"keep-{i}", image=big)) for i in range(4)]
        codes = [m.fields.get("code") if m.type == "error" else m.type for m in kept]
        assert codes[:2] == ["accepted", "accepted"] and codes[-1] == "busy", codes
        assert "quota" in kept[-1].fields["message"]
    finally:
        dealer.close()


def test_kept_results_make_room_for_new_jobs_oldest_first(servers, episode):
    """A long replay must not hit the quota with results it already has: the oldest kept
    results are deleted to make room; the spool stays under its quota."""
    server = servers(worker=[*standin_command(step_s=0.01), "--result-mb", "1"], spool_quota_bytes=3 << 20)
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10) as client:
        jobs = [client.submit(payload, {"steps": 1}) for _ in range(1)]
        jobs[0].result(timeout=20)
        for _ in range(5):
            job = client.submit(payload, {"steps": 1})
            assert len(job.result(timeout=20)) > 1 << 20
            jobs.append(job)
        spool = client.health()["spool"]
        assert spool["used_bytes"] <= spool["quota_bytes"]
        with pytest.raises(RequestFailed) as info:
            client.status(jobs[0].id)
        assert info.value.code == "not_found"  # the oldest result went first
        assert client.status(jobs[-1].id)["state"] == "done"


def test_per_client_spool_quota(servers, episode):
    server = servers(worker=standin_command(step_s=0.2), spool_quota_bytes=64 << 20,
                     spool_quota_per_client_bytes=2 << 20, limits={"max_image_bytes": 2 << 20})  # fmt: skip
    payload = EpisodePayload.from_dir(episode)
    big = padded_image(payload, 1 << 20)
    greedy, polite = RawDealer(server.endpoint), RawDealer(server.endpoint)
    try:
        replies = [reply_to(greedy, submit_frames(payload, f"g-{i}", {"steps": 50}, image=big)) for i in range(3)]
        assert [r.type for r in replies[:1]] == ["accepted"]
        assert replies[-1].type == "error" and replies[-1].fields["code"] == "busy", replies[-1].fields
        assert reply_to(polite, submit_frames(payload, "p-1", image=big)).type == "accepted"
    finally:
        greedy.close()
        polite.close()


# ---------------------------------------------------------------------------------------------
# 4. Isaac's UI thread: the real Session against a real server that dies


def test_session_cancel_never_blocks_and_a_dead_server_frees_it(servers, episode, tmp_path):
    from lingbot_isaac.session import Session, SessionSettings

    server = servers(worker=standin_command(step_s=0.2))
    session = Session(SessionSettings(server=server.endpoint, output_dir=tmp_path, timeout=3.0, steps=50,
                                      compare=False))  # fmt: skip
    session.generate(episode)
    wait_for(lambda: session.status().message.startswith("Denoise"), 30, what="denoising")
    server.kill_group()
    started = time.monotonic()
    session.cancel()  # what the Cancel button runs on Kit's UI thread
    assert time.monotonic() - started < 0.1
    assert not session.busy and session.status().message == "Cancelled."
    session.generate(episode)  # not refused as busy; with no server it fails by itself
    assert session.wait(timeout=30).state == "failed"
    started = time.monotonic()
    session.shutdown(timeout=1.0)  # what on_shutdown runs
    assert time.monotonic() - started < 1.5


def test_session_notices_a_server_that_died_mid_job(servers, episode, tmp_path):
    from lingbot_isaac.session import Session, SessionSettings

    server = servers(worker=standin_command(step_s=0.2))
    session = Session(SessionSettings(server=server.endpoint, output_dir=tmp_path, timeout=1.0, steps=50,
                                      compare=False))  # fmt: skip
    session.generate(episode)
    wait_for(lambda: session.status().message.startswith("Denoise"), 30, what="denoising")
    server.kill_group()
    status = wait_for(lambda: not session.busy and session.status(), 20, what="the session to be free")
    assert status.state == "failed" and "stopped answering" in status.message, status.message


# ---------------------------------------------------------------------------------------------
# 5. watch on a finished job


def test_watching_a_finished_job_does_not_multiply_memory(servers, episode):
    video_mb = 4
    server = servers(worker=[*standin_command(step_s=0.01), "--result-mb", str(video_mb)])
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10) as client:
        job = client.submit(payload, {"steps": 1})
        assert len(job.result(timeout=20)) >= video_mb << 20
    pid = server.proc.pid
    time.sleep(0.5)
    baseline = rss_mb(pid)
    context = zmq.Context()
    peers = []
    try:
        for _ in range(4):  # peers that ask and never read
            socket = context.socket(zmq.DEALER)
            socket.linger = 0
            socket.rcvhwm = 1
            socket.setsockopt(zmq.RCVBUF, 4096)
            socket.connect(server.endpoint)
            peers.append(socket)
        for i in range(10):
            for n, socket in enumerate(peers):
                socket.send_multipart(protocol.encode("watch", {"rid": f"w{n}-{i}", "job": job.id}))
            time.sleep(0.05)
        time.sleep(1.0)
        grown = rss_mb(pid) - baseline
        print(f"server RSS grew {grown:.1f} MiB for 40 watches of a {video_mb} MiB result")  # docs/benchmarks.md
        assert grown < 3 * video_mb, f"server RSS grew {grown:.0f} MiB for 40 watches of a {video_mb} MiB result"
    finally:
        for socket in peers:
            socket.close(linger=0)
        context.term()
    wait_for(lambda: rss_mb(pid) - baseline < video_mb, 10, what="memory to return after the peers left")
    with Client(server.endpoint, timeout=10) as client:  # and a reading watcher still gets it
        assert len(client.watch(job.id).result(timeout=10)) >= video_mb << 20


# ---------------------------------------------------------------------------------------------
# 6. Identity


def test_invented_client_ids_on_one_connection_share_one_quota(servers, episode):
    server = servers(worker=standin_command(step_s=0.2), max_queue=8, max_queue_per_client=2)
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10) as client:
        healthy(client)
    dealer = RawDealer(server.endpoint)
    try:
        replies = [reply_to(dealer, submit_frames(payload, f"r{i}", {"steps": 50}, client=f"fake-{i}"))
                   for i in range(6)]  # fmt: skip
        kinds = [r.fields.get("code", r.type) for r in replies]
        # one running + 2 waiting for this connection, whatever `client` it claims
        assert kinds.count("accepted") == 3 and kinds[-1] == "busy", kinds
        assert "you already have 2 jobs waiting" in replies[-1].fields["message"]
    finally:
        dealer.close()
    # Without keys, every tcp:// connection shares one client's cap (bridge/server/peer_process.py, and
    # test_peer_process.py): another connection gets the same answer until a job ends. With keys the
    # identity is the key (test_under_curve_the_identity_is_the_key_not_the_connection).
    with Client(server.endpoint, timeout=10) as other:
        with pytest.raises(RequestFailed) as info:
            other.submit(payload, {"steps": 1})
        assert info.value.code == "busy" and "no CurveZMQ keys" in info.value.message


def test_another_peer_reusing_client_and_rid_never_gets_the_victims_job(servers, episode, tmp_path):
    server = servers(worker=standin_command(step_s=0.01))
    victim_payload = EpisodePayload.from_dir(episode)
    thief_payload = EpisodePayload.from_dir(make_episode(tmp_path / "thief", prompt="thief", seed=5))
    victim, thief = RawDealer(server.endpoint), RawDealer(server.endpoint)
    try:
        mine = reply_to(victim, submit_frames(victim_payload, "same", client="c", prompt="victim"))
        again = reply_to(victim, submit_frames(victim_payload, "same", client="c", prompt="victim"))
        assert mine.type == again.type == "accepted" and mine.fields["job"] == again.fields["job"]  # a retry
        theirs = reply_to(thief, submit_frames(thief_payload, "same", client="c", prompt="thief"))
        assert theirs.type == "accepted" and theirs.fields["job"] != mine.fields["job"]
        while (event := thief.read(15)).type != "result":
            assert event.fields.get("job") == theirs.fields["job"]
        assert record_of(event.blobs["video"])["prompt"] == "thief"
        with pytest.raises(TimeoutError):  # and nothing of the victim's job ever reaches the thief
            while True:
                assert thief.read(1.0).fields.get("job") != mine.fields["job"]
    finally:
        victim.close()
        thief.close()


def test_under_curve_the_identity_is_the_key_not_the_connection(servers, episode, tmp_path):
    """Two connections with one allowed key are one client: a submit retried on the second
    connection is the same job; a second key is another client with its own rids."""
    from bridge.wire.security import allow_client, load_public, load_secret, write_keypair
    from tests.bridge.test_security import make_keys

    keys = make_keys(tmp_path)
    allow = keys / "clients"
    allow_client(write_keypair(keys, "other")[0], allow)
    security = {"server_secret_key": str(keys / "server.key_secret"), "client_keys_dir": str(allow)}
    server = servers(worker=standin_command(step_s=0.1), security=security)
    payload = EpisodePayload.from_dir(episode)
    server_public = load_public(keys / "server.key")[0]

    def dealer(name: str) -> RawDealer:
        raw = RawDealer.__new__(RawDealer)
        raw.context = zmq.Context()
        raw.socket = raw.context.socket(zmq.DEALER)
        raw.socket.linger = 0
        public, secret = load_secret(keys / f"{name}.key_secret")
        raw.socket.curve_serverkey, raw.socket.curve_publickey, raw.socket.curve_secretkey = (
            server_public,
            public,
            secret,
        )
        raw.socket.connect(server.endpoint)
        return raw

    first, second, other = dealer("known"), dealer("known"), dealer("other")
    try:
        frames = submit_frames(payload, "same-rid", {"steps": 30}, client="label-a")
        a = reply_to(first, frames)
        b = reply_to(second, submit_frames(payload, "same-rid", {"steps": 30}, client="label-b"))
        c = reply_to(other, frames)
        assert a.type == b.type == c.type == "accepted"
        assert a.fields["job"] == b.fields["job"]  # the same key: a retry, whatever `client` says
        assert c.fields["job"] != a.fields["job"]  # another key: another client
    finally:
        for raw in (first, second, other):
            raw.close()


# ---------------------------------------------------------------------------------------------
# 7. Health


def test_health_tells_the_running_job_its_age_and_the_spool(servers, episode):
    server = servers(worker=standin_command(step_s=0.1), spool_quota_bytes=64 << 20)
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10) as client:
        healthy(client)
        running = client.submit(payload, {"steps": 40})
        queued = client.submit(payload, {"steps": 1})
        wait_for(lambda: running.latest and running.latest.phase == "denoise", 10, what="denoising")
        time.sleep(0.5)
        health = client.health()
        assert health["ok"] is True
        assert health["queue"]["waiting"] == 1 and health["queue"]["running"] == running.id
        assert health["queue"]["running_for_s"] >= 0.5 and health["queue"]["phase"] == "denoise"
        assert health["worker"]["state"] == "busy"
        spool = health["spool"]
        assert spool["writable"] is True and spool["error"] is None
        assert 0 < spool["used_bytes"] < spool["quota_bytes"] == 64 << 20 and spool["free_bytes"] > 0
        client.cancel(running.id)
        client.cancel(queued.id)


# ---------------------------------------------------------------------------------------------
# 8. A fuzz run through settings and fields


@pytest.mark.slow
def test_ten_thousand_adversarial_messages(servers, episode):
    from tests.bridge.strategies import adversarial_messages

    server = servers(worker=standin_command(step_s=0.01), max_queue=4, max_queue_per_client=4)
    payload = EpisodePayload.from_dir(episode)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    socket.connect(server.endpoint)
    codes: dict[str, int] = {}
    cancels: set[str] = set()  # our own cancels of the jobs a valid-enough message started

    def answer(what: str) -> protocol.Message:
        """The next answer to a fuzz message (answers to our cancels and job events are set aside)."""
        while True:
            assert socket.poll(10_000), f"no answer to {what}"
            reply = protocol.decode_reply(socket.recv_multipart())
            rid = reply.get("rid")
            if rid in cancels:
                cancels.discard(rid)
            elif rid is not None or (reply.type == "error" and reply.get("job") is None):
                return reply

    began = time.monotonic()
    try:
        for i, frames in enumerate(adversarial_messages(10_000, seed=12)):
            socket.send_multipart(frames)
            reply = answer(f"message {i}")
            key = reply.fields.get("code", reply.type) if reply.type == "error" else reply.type
            codes[key] = codes.get(key, 0) + 1
            if reply.type == "accepted":
                cancels.add(f"cx{i}")
                socket.send_multipart(protocol.encode("cancel", {"rid": f"cx{i}", "job": reply.fields["job"]}))
            assert server.alive()
        deadline = time.monotonic() + 10
        while cancels and socket.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            cancels.discard(protocol.decode_reply(socket.recv_multipart()).get("rid"))
        assert not cancels, f"{len(cancels)} cancels unanswered"
    finally:
        socket.close(linger=0)
        context.term()
    print(f"{sum(codes.values())} answers in {time.monotonic() - began:.1f} s: {dict(sorted(codes.items()))}")
    assert sum(codes.values()) == 10_000  # one answer per message
    assert codes.get("internal", 0) == 0, codes
    with Client(server.endpoint, timeout=10) as client:
        started = time.monotonic()
        assert record_of(client.submit(payload, {"steps": 2}).result(timeout=30))
        assert time.monotonic() - started < 10


def test_msgpack_header_with_settings_junk_is_never_internal(servers, episode):
    """A handful of the fuzz run's findings, kept as a fast test."""
    server = servers(worker=standin_command(step_s=0.01))
    payload = EpisodePayload.from_dir(episode)
    dealer = RawDealer(server.endpoint)
    try:
        for i, settings in enumerate([{"size": None}, {"size": {}}, {"guide_scale": {}}, {"guide_scale": None},
                                      {"negative_prompt": 5}, {"seed": 2**64 - 1}, {"steps": 2**63}]):  # fmt: skip
            header = msgpack.unpackb(submit_frames(payload, f"j{i}")[0])
            header["settings"] = settings
            frames = [msgpack.packb(header), *submit_frames(payload, f"j{i}")[1:]]
            reply = dealer.ask(frames)
            assert reply.type == "error" and reply.fields["code"] == "bad_settings", (settings, reply.fields)
    finally:
        dealer.close()


_ = np  # numpy arrays travel inside EpisodePayload
