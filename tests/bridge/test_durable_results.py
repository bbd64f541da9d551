"""Results are persisted like requests (issue 13): result.mp4 is durable before "done" is reported,
and a job is never "done" with a missing or partial result.

A worker SIGKILLed after writing its result and before reporting it (tests/bridge/dying_worker.py):
the job runs again and ends done with a complete, playable mp4. The same with the whole server
killed at that moment, then restarted on its spool. And a "done" job whose result.mp4 is gone when
the server starts is reported failed (its inputs are released once it ended), never done.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import imageio_ffmpeg
import pytest

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed
from bridge.client.episode_payload import EpisodePayload
from tests.bridge.conftest import ServerPool, wait_for

DYING = Path(__file__).with_name("dying_worker.py")
SMALL = {"size": "48*80", "frame_num": 5, "steps": 2}


def playable_frames(path: Path) -> int:
    """Frames ffmpeg decodes from the file (a truncated mp4 fails here)."""
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    return frames


def job_state(spool: Path, job_id: str) -> dict:
    return json.loads((spool / "jobs" / job_id / "state.json").read_text())


@pytest.mark.slow
def test_worker_killed_between_writing_and_reporting_reruns_the_job(tmp_path, episode):
    marker = tmp_path / "died"
    pool = ServerPool(tmp_path)
    try:
        server = pool.start(worker=[sys.executable, str(DYING), str(marker)], worker_keys={"retry_crashed": True})
        spool = Path(server.tables["server"]["spool_dir"])
        with Client(server.endpoint, timeout=10) as client:
            wait_for(lambda: client.health()["ok"], 180, interval=0.5, what="the tiny worker")
            job = client.submit(EpisodePayload.from_dir(episode), SMALL)
            video = job.result(timeout=300)
        assert marker.exists(), "the worker was not killed at the result"
        result = spool / "jobs" / job.id / "result.mp4"
        state = job_state(spool, job.id)
        assert state["state"] == "done" and state["attempts"] == 2  # run again, not reported from the dead worker
        assert result.read_bytes() == video and playable_frames(result) == 5
    finally:
        pool.close()


@pytest.mark.slow
def test_server_and_worker_killed_between_writing_and_reporting(tmp_path, episode):
    marker = tmp_path / "died"
    pool = ServerPool(tmp_path)
    try:
        server = pool.start(worker=[sys.executable, str(DYING), str(marker), "--group"])
        spool = Path(server.tables["server"]["spool_dir"])
        with Client(server.endpoint, timeout=10, heartbeat_s=0.5, give_up_s=300) as client:
            wait_for(lambda: client.health()["ok"], 180, interval=0.5, what="the tiny worker")
            job = client.submit(EpisodePayload.from_dir(episode), SMALL)
            wait_for(lambda: not server.alive(), 120, interval=0.2, what="the server and worker to be killed")
            written = Path(marker.read_text())
            assert written.is_file() and playable_frames(written) == 5  # the result was durable...
            assert job_state(spool, job.id)["state"] == "running"  # ...but never reported done
            server.tables["server"]["bind"] = server.endpoint
            server.start()
            video = job.result(timeout=300)
        state = job_state(spool, job.id)
        assert state["state"] == "done" and state["attempts"] == 2
        result = spool / "jobs" / job.id / "result.mp4"
        assert result.read_bytes() == video and playable_frames(result) == 5
        assert "1 job(s) resumed" in server.log()
    finally:
        pool.close()


def test_a_done_job_whose_result_is_gone_is_not_reported_done(servers, episode):
    server = servers()
    spool = Path(server.tables["server"]["spool_dir"])
    with Client(server.endpoint, timeout=10) as client:
        job = client.submit(EpisodePayload.from_dir(episode), {"steps": 2})
        job.result(timeout=30)
    assert job_state(spool, job.id)["state"] == "done"
    server.kill_group()
    (spool / "jobs" / job.id / "result.mp4").unlink()
    server.tables["server"]["bind"] = server.endpoint
    server.start()
    with Client(server.endpoint, timeout=10) as client:
        status = client.status(job.id)
        with pytest.raises(JobFailed, match="result.mp4 of this job is missing"):
            client.watch(job.id).result(timeout=30)
    assert status["state"] == "failed" and job_state(spool, job.id)["state"] == "failed"
    assert "result.mp4 is missing" in server.log()
