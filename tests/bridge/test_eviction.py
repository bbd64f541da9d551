"""Kept results are a cache (issue 25, bridge/server/eviction.py): on a small real tmpfs spool with the
default quota, far more jobs than fit run one after another, the oldest results evicted first; a disk
filled by something else evicts kept results instead of wedging the server; a result nobody fetched
yet is kept through its grace period. A real server subprocess with the stand-in worker (1 MiB
results)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

import pytest

from bridge.client.client import Client
from bridge.client.client_errors import RequestFailed
from bridge.client.episode_payload import EpisodePayload
from tests.bridge.conftest import standin_command, wait_for
from tests.bridge.test_robustness import fill, submit_frames
from tests.bridge.test_server import RawDealer

MIB = 1 << 20


@pytest.fixture
def tmpfs(tmp_path):
    """An 8 MiB tmpfs mounted by the test (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a size-limited tmpfs")
    target = tmp_path / "fs"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(target)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def gone(client: Client, job_id: str) -> bool:
    try:
        client.status(job_id)
    except RequestFailed as exc:
        assert exc.code == "not_found", exc
        return True
    return False


def test_three_times_what_fits_runs_through_a_small_spool_with_the_default_quota(servers, episode, tmpfs):
    server = servers(
        worker=[*standin_command(step_s=0.01), "--result-mb", "1"],
        spool_dir=str(tmpfs / "spool"),
        spool_min_free_bytes=MIB,
    )  # fmt: skip  (spool_quota_bytes: the default)
    payload = EpisodePayload.from_dir(episode)
    fits = (8 * MIB - MIB) // (MIB + len(payload.image))  # results of 1 MiB (plus inputs) above the reserve
    ids = []
    with Client(server.endpoint, timeout=10) as client:
        spool = wait_for(lambda: (h := client.health())["ok"] and h, 30, what="a healthy server")["spool"]
        assert spool["quota_bytes"] <= 4 * MIB  # the default: half the disk
        for i in range(3 * fits):
            health = client.health()
            assert health["ok"], (i, health["reason"])  # a job can always be stored: health says ok
            job = client.submit(payload, {"steps": 1, "seed": i})
            assert len(job.result(timeout=30)) >= MIB
            ids.append(job.id)
        kept = [not gone(client, job_id) for job_id in ids]
        health = client.health()
    assert health["ok"] and health["spool"]["used_bytes"] <= health["spool"]["quota_bytes"]
    assert kept[-1] and not kept[0]
    first_kept = kept.index(True)
    assert all(kept[first_kept:]), kept  # evicted oldest first: the kept ones are the newest
    assert first_kept >= 2 * fits, kept  # most went


def test_a_disk_filled_by_others_evicts_kept_results_and_queued_jobs_run(servers, episode, tmpfs):
    server = servers(worker=[*standin_command(step_s=0.01), "--result-mb", "1"], spool_dir=str(tmpfs / "spool"),
                     spool_min_free_bytes=MIB)  # fmt: skip
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.3, give_up_s=120) as client:
        wait_for(lambda: client.health()["ok"], 30, what="a healthy server")
        done = [client.submit(payload, {"steps": 1, "seed": i}) for i in range(3)]
        for job in done:
            job.result(timeout=30)
        filler = fill(tmpfs)  # another program takes every free byte
        try:
            started = time.monotonic()
            job = client.submit(payload, {"steps": 1, "seed": 9})  # room is made: never "storage"
            assert len(job.result(timeout=30)) >= MIB
            assert time.monotonic() - started < 15
            assert gone(client, done[0].id)  # the oldest result went first
            health = wait_for(lambda: (h := client.health())["ok"] and h, 10, what="health ok")
            assert health["spool"]["free_bytes"] >= MIB or not health["spool"]["writable"]
        finally:
            filler.unlink()
    log = server.log()
    assert "disk nearly full: deleting job" in log or "quota: deleting job" in log


def test_a_result_nobody_fetched_is_kept_through_its_grace_period(servers, episode):
    server = servers(worker=[*standin_command(step_s=0.05), "--result-mb", "1"], spool_quota_bytes=3 * MIB)
    payload = EpisodePayload.from_dir(episode)
    dealer = RawDealer(server.endpoint)
    reply = dealer.ask(submit_frames(payload, "unfetched", {"steps": 2}))
    assert reply.type == "accepted"
    unfetched = reply.fields["job"]
    dealer.close()  # gone before its result: nobody fetched it
    with Client(server.endpoint, timeout=10) as client:
        wait_for(lambda: client.status(unfetched)["state"] == "done", 30, what="the unfetched job to finish")
        jobs = [client.submit(payload, {"steps": 1, "seed": i}) for i in range(5)]
        for job in jobs:
            with contextlib.suppress(RequestFailed):
                job.result(timeout=30)
        assert client.status(unfetched)["state"] == "done"  # kept: within result_grace_s, never fetched
        assert gone(client, jobs[0].id)  # the fetched ones made room instead
        assert len(client.watch(unfetched).result(timeout=10)) >= MIB
