"""A pool of workers behind one server (`[worker] devices = ["cpu", "cpu"]`), over real sockets.

Most tests use the stand-in engine (worldgen.worker's real loop, a known pace per step) so a
SIGKILL lands mid-job on cue; the acceptance test at the end runs two real tiny-model workers.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from bridge.client import Client, EpisodePayload, JobFailed, Result
from tests.bridge.conftest import TINY, pid_alive, standin_command, wait_for
from tests.bridge.test_server import record_of

POOL = {"devices": ["cpu", "cpu"]}


def healthy(client: Client, timeout: float = 30.0) -> dict:
    return wait_for(lambda: (h := client.health())["ok"] and h, timeout, interval=0.2, what="every worker ready")


def spool_states(server) -> dict[str, dict]:
    jobs = server.workdir / "spool" / "jobs"
    return {d.name: json.loads((d / "state.json").read_text()) for d in jobs.iterdir()}


def outcomes(jobs, timeout: float) -> dict[str, Result | object]:
    return {job.id: job.wait(timeout=timeout) for job in jobs}


def test_health_reports_every_worker_and_two_jobs_run_at_once(servers, episode):
    server = servers(worker=standin_command(step_s=0.05), worker_keys=POOL)
    with Client(server.endpoint, timeout=5, heartbeat_s=0.5) as client:
        health = healthy(client)
        workers = health["workers"]
        assert [w["name"] for w in workers] == ["0:cpu", "1:cpu"]
        assert all(w["state"] == "idle" and w["reported"]["state"] == "idle" for w in workers)
        pids = {w["pid"] for w in workers}
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        assert health["worker"] == workers[0]  # what a one-worker client reads
        payload = EpisodePayload.from_dir(episode)
        jobs = [client.submit(payload, {"steps": 30, "seed": i}) for i in range(3)]
        assert [j.queue_position for j in jobs] == [0, 1, 2]  # 0 and 1 start at once, 2 waits for both
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2 and h, 10,
                        what="both workers busy")  # fmt: skip
        assert set(busy["queue"]["running_jobs"]) == {jobs[0].id, jobs[1].id}
        assert busy["queue"]["waiting"] == 1
        assert {w["reported"]["job"] for w in busy["workers"]} == {jobs[0].id, jobs[1].id}
        assert sorted(record_of(j.result(timeout=30))["settings"]["seed"] for j in jobs) == [0, 1, 2]


@pytest.mark.parametrize("retry", [False, True], ids=["fail", "retry"])
def test_sigkill_of_one_worker_costs_only_its_own_job(servers, episode, retry):
    server = servers(worker=standin_command(step_s=0.05), worker_keys={**POOL, "retry_crashed": retry}, max_attempts=2)
    with Client(server.endpoint, timeout=5, heartbeat_s=0.5) as client:
        healthy(client)
        payload = EpisodePayload.from_dir(episode)
        jobs = [client.submit(payload, {"steps": 30, "seed": i}) for i in range(8)]
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2 and h, 10,
                        what="both workers busy")  # fmt: skip
        victim = busy["workers"][1]
        other_pid = busy["workers"][0]["pid"]
        killed_job = victim["job"]
        os.kill(victim["pid"], signal.SIGKILL)
        results = outcomes(jobs, timeout=60)
        for job_id, outcome in results.items():
            if job_id == killed_job and not retry:
                assert outcome.code == "worker_crashed" and "SIGKILL" in outcome.message
            else:
                assert isinstance(outcome, Result), outcome
        seeds = sorted(record_of(o.video)["settings"]["seed"] for o in results.values() if isinstance(o, Result))
        killed_seed = [j.id for j in jobs].index(killed_job)
        expected = list(range(8)) if retry else [s for s in range(8) if s != killed_seed]
        assert seeds == expected  # nothing lost, nothing run twice into a result
        states = spool_states(server)
        assert set(states) == {j.id for j in jobs}  # one spool job per submit, no duplicates
        assert states[killed_job]["attempts"] == (2 if retry else 1)
        assert states[killed_job]["state"] == ("done" if retry else "failed")
        assert all(states[j.id]["attempts"] == 1 for j in jobs if j.id != killed_job)
        health = healthy(client)
        assert health["workers"][0]["pid"] == other_pid and health["workers"][0]["restarts"] == 0
        assert health["workers"][1]["restarts"] == 1 and "SIGKILL" in health["workers"][1]["last_exit"]
    if retry:
        assert f"job {killed_job}: its worker died" in server.log()


def test_devices_flag_and_config_validation(tmp_path):
    from bridge.server_config import ConfigError, load_server_config

    config = load_server_config(None, {"worker.devices": ["cuda:0", "cuda:1"]})
    assert config.worker.pool_devices() == ("cuda:0", "cuda:1")
    assert config.worker.options_for("cuda:1").devices == ("cuda:1",)
    path = tmp_path / "server.toml"
    path.write_text('[worker]\ndevices = ["gpu0"]\n')
    with pytest.raises(ConfigError, match="device 'gpu0': expected cpu, cuda or cuda:N"):
        load_server_config(path)
    path.write_text('[worker]\nbackend = "slurm"\n')
    with pytest.raises(ConfigError, match="backend must be one of"):
        load_server_config(path)


@pytest.mark.slow
def test_two_tiny_workers_survive_a_sigkill_mid_job(servers, tmp_path):
    """Acceptance: two real tiny-model workers, 8 jobs, one worker SIGKILLed mid-job."""
    from tests.bridge.conftest import make_episode

    episode = make_episode(tmp_path / "ep", n=33)
    server = servers(worker=TINY, worker_keys=POOL)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        healthy(client, timeout=180)
        payload = EpisodePayload.from_dir(episode)
        settings = {"size": "48*80", "frame_num": 5, "steps": 8}
        jobs = [client.submit(payload, {**settings, "seed": i}) for i in range(8)]
        busy = wait_for(
            lambda: (
                (h := client.health())
                and any((w.get("reported") or {}).get("progress", {}).get("phase") == "denoise" for w in h["workers"])
                and h
            ),
            60,
            interval=0.1,
            what="a worker denoising",
        )
        victim = next(
            w for w in busy["workers"] if (w.get("reported") or {}).get("progress", {}).get("phase") == "denoise"
        )
        os.kill(victim["pid"], signal.SIGKILL)
        results = outcomes(jobs, timeout=300)
        failed = {k: v for k, v in results.items() if not isinstance(v, Result)}
        assert list(failed) == [victim["job"]]
        assert failed[victim["job"]].code == "worker_crashed" and "SIGKILL" in failed[victim["job"]].message
        assert all(r.video[4:8] == b"ftyp" for r in results.values() if isinstance(r, Result))
        assert set(spool_states(server)) == {j.id for j in jobs}
        with pytest.raises(JobFailed):
            next(j for j in jobs if j.id == victim["job"]).result(timeout=0)
