"""Acceptance with the real engine: `lingbot-isaac serve` with its default worker, `python -m
worldgen.worker` loading the built-in tiny model on the CPU, over real loopback sockets.

Loading the tiny model takes ~10 s on 2 CPU cores, so the tests share one server where they can;
most jobs use small settings (SMALL: ~2 s a job) and one uses the full `[tiny]` preset.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed, RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Progress, Result
from contracts.settings import load_settings
from tests.bridge.conftest import REPO, TINY, ServerPool, concurrently, make_episode, pid_alive, wait_for

SMALL = {"size": "48*80", "frame_num": 5, "steps": 2}


def is_mp4(data: bytes) -> bool:
    return len(data) > 1000 and data[4:8] == b"ftyp"


def mp4_frame_count(path: Path) -> int:
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    return frames


@pytest.fixture(scope="module")
def tiny_episode(tmp_path_factory) -> Path:
    return make_episode(tmp_path_factory.mktemp("episode") / "ep", n=33)


@pytest.fixture
def client(tiny_server):
    with Client(tiny_server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        yield client


def test_tiny_episode_in_progress_out_mp4_from_the_library(client, tiny_episode, tmp_path):
    health = client.health()
    assert health["ok"] and health["model"]["model"] == "tiny" and health["model"]["device"] == "cpu"
    assert health["gpu"] is None and health["memory"]["rss_mb"] > 0
    job = client.submit(EpisodePayload.from_dir(tiny_episode), want_frames=True)  # the server's [tiny] preset
    events = list(job.events(timeout=120))
    phases = [e.phase for e in events if isinstance(e, Progress)]
    for phase in ("text", "encode", "denoise", "decode", "write"):
        assert phase in phases
    tiny = load_settings(preset="tiny")
    denoise = [e for e in events if isinstance(e, Progress) and e.phase == "denoise"]
    assert denoise[-1].step == denoise[-1].total == tiny.steps and denoise[-1].eta_s == 0
    result = events[-1]
    assert isinstance(result, Result) and is_mp4(result.video)
    video = tmp_path / "rollout.mp4"
    video.write_bytes(result.video)
    assert mp4_frame_count(video) == tiny.frame_num
    assert result.frames.dtype == np.uint8 and result.frames.shape[0] == tiny.frame_num
    height, width = result.frames.shape[1:3]
    assert result.frames.shape[3] == 3 and height * width <= tiny.max_area
    # what made it travels with it: the worker's provenance record, every setting as used
    record = result.provenance
    assert record["producer"] == "worker" and record["model"]["random_weights"] is True and record["job"] is None
    assert record["settings"] == {**tiny.to_dict(), "frame_num": tiny.frame_num}
    assert record["output"] == {"frames": tiny.frame_num, "height": height, "width": width, "fps": tiny.fps}


def test_tiny_episode_from_the_command_line(tiny_server, tiny_episode, tmp_path):
    out = tmp_path / "cli.mp4"
    done = subprocess.run(
        [sys.executable, "-m", "lingbot_cli", "submit", str(tiny_episode), "--server", tiny_server.endpoint,
         "--out", str(out), "--steps", "2", "--frame-num", "5", "--size", "48*80"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert "accepted" in done.stderr and "denoise 2/2" in done.stderr and "write" in done.stderr
    assert is_mp4(out.read_bytes()) and mp4_frame_count(out) == 5
    # the server path: the worker's record beside the spooled result, then beside the client's copy
    assert list(tiny_server.workdir.glob("spool/jobs/*/result.json")), "the record sits beside result.mp4"
    from comparison.report import compare_episode
    from tests.report_checks import assert_tiny_rollout_is_traceable

    report = compare_episode(tiny_episode, out, tmp_path / "report")
    record = assert_tiny_rollout_is_traceable(out, report, client="submit")
    assert (record["settings"]["steps"], record["settings"]["frame_num"], record["settings"]["size"]) == (2, 5, "48*80")


def test_tiny_engine_input_errors_come_back_as_bad_input(client, tmp_path):
    too_short = make_episode(tmp_path / "short", n=3)  # the engine needs at least 5 poses
    with pytest.raises(RequestFailed) as info:  # the engine's rule, applied at the door (issue 25)
        client.submit(EpisodePayload.from_dir(too_short), SMALL)
    assert info.value.code == "bad_input" and "poses" in info.value.message
    assert client.health()["worker"]["restarts"] == 0


def test_fp8_compute_per_job_is_refused_on_a_cpu_worker(client, tiny_episode):
    """fp8 on a machine without FP8 tensor cores is the user's to fix: refused at the door (issue 25)
    with the engine's own reason (the worker's `ready` carries it) and what to use instead."""
    with pytest.raises(RequestFailed) as info:
        client.submit(EpisodePayload.from_dir(tiny_episode), {**SMALL, "compute": "fp8"})
    assert info.value.code == "bad_settings" and "FP8 tensor cores" in info.value.message
    assert "--compute exact" in info.value.message
    assert client.submit(EpisodePayload.from_dir(tiny_episode), {**SMALL, "compute": "bf16"}).result(timeout=60)
    assert client.health()["worker"]["restarts"] == 0


def test_tiny_cancel_queued_and_running_jobs(client, tiny_episode):
    payload = EpisodePayload.from_dir(tiny_episode)
    running = client.submit(payload, {**SMALL, "steps": 30})
    queued = client.submit(payload, SMALL)
    assert client.cancel(queued.id)["state"] == "cancelled"
    with pytest.raises(JobFailed, match="cancelled"):
        queued.result(timeout=10)
    wait_for(lambda: running.latest and running.latest.phase == "denoise" and running.latest.step >= 1, 60,
             what="denoising")  # fmt: skip
    step_at_cancel = running.latest.step
    client.cancel(running.id)
    with pytest.raises(JobFailed) as info:
        running.result(timeout=30)
    assert info.value.code == "cancelled" and "denoise" in info.value.message
    last = [e for e in running.events() if isinstance(e, Progress)][-1]
    assert last.phase == "denoise" and last.step <= step_at_cancel + 2 < 30  # stopped at the next step or so
    health = client.health()
    assert health["ok"] and health["worker"]["restarts"] == 0  # the worker stopped the job, it was not killed
    assert is_mp4(client.submit(payload, SMALL).result(timeout=60))


@pytest.mark.slow
def test_tiny_worker_sigkill_mid_job(client, tiny_episode):
    payload = EpisodePayload.from_dir(tiny_episode)
    job = client.submit(payload, {**SMALL, "steps": 30})
    wait_for(lambda: job.latest and job.latest.phase == "denoise" and job.latest.step >= 1, 60, what="denoising")
    health = client.health()
    old_pid, restarts = health["worker"]["pid"], health["worker"]["restarts"]
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(JobFailed) as info:
        job.result(timeout=30)
    assert info.value.code == "worker_crashed" and "SIGKILL" in info.value.message
    health = wait_for(lambda: (h := client.health())["ok"] and h, 120, interval=0.5, what="the worker to reload")
    assert health["worker"]["pid"] != old_pid and health["worker"]["restarts"] == restarts + 1
    assert is_mp4(client.submit(payload, SMALL).result(timeout=60))


@pytest.mark.slow
def test_tiny_eight_clients_three_jobs_each(tmp_path, tiny_episode):
    payload = EpisodePayload.from_dir(tiny_episode)
    videos: dict[int, list[bytes]] = {}
    # Without keys all loopback connections share one client's queue cap (bridge/server/peer_process.py):
    # room for the 24 jobs of these 8 clients (a server of several users would give them keys)
    pool = ServerPool(tmp_path)
    server = pool.start(worker=TINY, max_queue_per_client=24).wait_loaded()

    def one_client(index: int) -> None:
        with Client(server.endpoint, timeout=10, heartbeat_s=1.0) as client:
            jobs = [client.submit(payload, {**SMALL, "seed": 10 * index + k}) for k in range(3)]
            videos[index] = [job.result(timeout=400) for job in jobs]

    try:
        errors = concurrently(one_client, 8, timeout=420)
    finally:
        pool.close()
    assert not errors, errors
    assert sorted(videos) == list(range(8))
    assert all(len(v) == 3 and all(is_mp4(x) for x in v) for v in videos.values())


@pytest.mark.slow
def test_tiny_server_sigkill_with_queued_jobs(tmp_path, tiny_episode):
    pool = ServerPool(tmp_path)
    try:
        server = pool.start(worker=TINY).wait_loaded()
        with Client(server.endpoint, timeout=10, heartbeat_s=0.5, give_up_s=200) as client:
            payload = EpisodePayload.from_dir(tiny_episode)
            jobs = [client.submit(payload, {**SMALL, "steps": 6, "seed": i}) for i in range(3)]
            wait_for(lambda: jobs[0].latest and jobs[0].latest.phase == "denoise", 60, what="the first job running")
            worker_pid = client.health()["worker"]["pid"]
            server.kill()
            wait_for(lambda: not pid_alive(worker_pid), 15, what="the orphaned worker to exit")
            assert not any(job.done() for job in jobs)
            started = time.monotonic()
            server.tables["server"]["bind"] = server.endpoint
            server.start()
            videos = [job.result(timeout=200) for job in jobs]  # each completes: none lost
            assert all(is_mp4(v) for v in videos)
            assert time.monotonic() - started < 200
        assert "3 job(s) resumed" in server.log()
    finally:
        pool.close()
