"""`bridge.client.follow.submit_and_follow`, the one follow loop of `submit`, `replay` and the Isaac
window: its cancel check, and no job left running on the server when a caller's callback fails.
A real server subprocess with the stand-in engine over loopback ZeroMQ."""

from __future__ import annotations

import threading
import time

import pytest

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.follow import submit_and_follow
from tests.bridge.conftest import standin_command, wait_for


def ended_state(client: Client, job_id: str) -> str:
    return wait_for(lambda: (s := client.status(job_id))["state"] not in ("queued", "running") and s["state"], 30,
                    what="the job to end")  # fmt: skip


def test_a_cancel_check_cancels_the_job_on_the_server_and_returns_at_once(servers, episode):
    server = servers(worker=standin_command(step_s=0.2))
    stop = threading.Event()
    steps: list[int] = []

    def on_progress(event) -> None:
        if event.phase == "denoise":
            steps.append(event.step)
            if event.step >= 2:
                stop.set()

    with Client(server.endpoint, timeout=5) as client:
        submitted = []
        started = time.monotonic()
        with pytest.raises(JobFailed) as failed:
            submit_and_follow(client, EpisodePayload.from_dir(episode), {"steps": 50}, on_progress=on_progress,
                              on_submitted=submitted.append, cancelled=stop.is_set)  # fmt: skip
        assert failed.value.code == "cancelled"
        assert time.monotonic() - started < 0.2 * 50 / 2  # long before the job's 10 s
        assert ended_state(client, submitted[0].id) == "cancelled"
    assert max(steps) < 50


def test_a_callback_that_raises_leaves_no_job_running(servers, episode):
    server = servers(worker=standin_command(step_s=0.2))

    def on_progress(event) -> None:
        if event.phase == "denoise":
            raise RuntimeError("the caller's display broke")

    with Client(server.endpoint, timeout=5) as client:
        submitted = []
        with pytest.raises(RuntimeError, match="display broke"):
            submit_and_follow(client, EpisodePayload.from_dir(episode), {"steps": 50}, on_progress=on_progress,
                              on_submitted=submitted.append)  # fmt: skip
        assert ended_state(client, submitted[0].id) == "cancelled"
