"""A pool of workers behind one server (`[worker] devices = ["cpu", "cpu"]`), over real sockets.

Most tests use the stand-in engine (worldgen.worker's real loop, a known pace per step) so a
SIGKILL lands mid-job on cue; the acceptance test at the end runs two real tiny-model workers.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed, RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import JobError, Result
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
        # the server's dispatch shows before the workers' own reports do: wait for both
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2
                        and None not in {w["reported"]["job"] for w in h["workers"]} and h, 10,
                        what="both workers busy, as they report it")  # fmt: skip
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


def test_how_many_workers_a_job_of_two_gpus_takes():
    from bridge.workers.supervisor import Supervisor, SupervisorConfig
    from bridge.workers.worker_pool import WorkerPool

    def pool(devices: list[list[str]], backend: str = "local") -> WorkerPool:
        return WorkerPool([Supervisor(SupervisorConfig(argv=("worker",), options={"devices": d}), name=f"{i}:{d[0]}")
                           for i, d in enumerate(devices)], backend=backend)  # fmt: skip

    two = pool([["cuda:0"], ["cuda:1"]])
    assert (two.workers_for(1), two.workers_for(2), two.refusal(2)) == (1, 2, None)
    spanning = pool([["cuda:0", "cuda:1"]])  # [worker] gpus = "0,1": one worker runs every rollout on both
    assert (spanning.workers_for(2), spanning.refusal(2)) == (1, None)
    assert "one worker on one device (0:cuda:0)" in pool([["cuda:0"]]).refusal(2)
    assert "Ray backend" in pool([["cuda:0"], ["cuda:1"]], backend="ray").refusal(2)
    assert pool([["cuda:0"]]).refusal(1) is None
    # a causal job (model fast or causal) splits each chunk over one worker's two devices: a pool cannot pair it
    for model in ("fast", "causal"):
        assert spanning.refusal(2, model) is None and two.refusal(1, model) is None
        for one_each in (two, pool([["cuda:0"]]), pool([["cuda:0"], ["cuda:1"]], backend="ray")):
            refusal = one_each.refusal(2, model)
            assert f"model {model}" in refusal and "one device each" in refusal and 'gpus = "0,1"' in refusal
    assert two.refusal(2, "base") is None


def test_devices_flag_and_config_validation(tmp_path):
    from bridge.server.server_config import ConfigError, load_server_config

    config = load_server_config(None, {"worker.devices": ["cuda:0", "cuda:1"]})
    assert config.worker.pool_devices() == ("cuda:0", "cuda:1")
    assert config.worker.options_for("cuda:1").devices == ("cuda:1",)
    path = tmp_path / "server.toml"
    path.write_text('[worker]\ndevices = ["gpu0"]\n')
    with pytest.raises(ConfigError, match=r"device 'gpu0': expected auto \(.*\), cpu, cuda or cuda:N"):
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


# -- a job that asks for two GPUs (setting gpus = 2) ------------------------------------------------


def roles(health: dict) -> list[tuple[str | None, str | None]]:
    return [(w["reserved_for"], w["role"]) for w in health["workers"]]


def test_two_gpu_job_waits_at_the_head_holds_both_workers_and_keeps_the_fair_order(servers, episode):
    server = servers(worker=standin_command(step_s=0.05), worker_keys=POOL)
    with Client(server.endpoint, timeout=5, heartbeat_s=0.5) as client:
        healthy(client)
        payload = EpisodePayload.from_dir(episode)
        first = client.submit(payload, {"steps": 30, "seed": 0})
        wait_for(lambda: client.health()["queue"]["running_jobs"] == [first.id], 10, what="the first job running")
        pair = client.submit(payload, {"steps": 20, "seed": 1, "gpus": 2})
        after = [client.submit(payload, {"steps": 4, "seed": s}) for s in (2, 3)]
        # one worker is idle, but the two-GPU job at the head needs two: it is held for it, nothing passes
        held = client.health()
        assert held["queue"]["running_jobs"] == [first.id] and held["queue"]["waiting"] == 3
        assert sorted(roles(held), key=str) == sorted([(first.id, "job"), (pair.id, "held")], key=str)
        # the server's dispatch shows before the workers' own reports do: wait for both
        both = wait_for(lambda: (h := client.health())["queue"]["running_jobs"] == [pair.id]
                        and {w["reported"]["job"] for w in h["workers"]} == {pair.id} and h, 15,
                        what="the two-GPU job on both workers, as they report it")  # fmt: skip
        assert sorted(roles(both)) == [(pair.id, "second GPU"), (pair.id, "two-GPU job")]
        serving = wait_for(lambda: [w["reported"] for w in client.health()["workers"] if w["role"] == "second GPU"
                                    and w["reported"].get("progress", {}).get("phase") == "guidance"], 10,
                           what="the second worker serving guidance passes")  # fmt: skip
        assert serving[0]["job"] == pair.id and serving[0]["progress"]["step"] >= 1
        assert both["queue"]["waiting"] == 2
        records = [record_of(job.result(timeout=30)) for job in (first, pair, *after)]
        helper = next(w["name"] for w in both["workers"] if w["role"] == "second GPU")
        assert [r["peer"] for r in records] == [None, helper, None, None]
        assert [r["settings"]["seed"] for r in records] == [0, 1, 2, 3]
        states = spool_states(server)
        started = {j.id: states[j.id]["started"] for j in (first, pair, *after)}
        # the pair started only after the first job ended, and nothing behind it started before it
        assert states[first.id]["finished"] <= started[pair.id]
        assert all(started[pair.id] <= started[j.id] for j in after)
        assert roles(client.health()) == [(None, None), (None, None)]  # both released
    assert f"job {pair.id}: two GPUs" in server.log()


def test_two_gpu_job_is_refused_at_submit_by_a_one_device_server(servers, episode):
    server = servers(worker=standin_command(step_s=0.01))
    with Client(server.endpoint, timeout=5) as client:
        with pytest.raises(RequestFailed) as refused:
            client.submit(EpisodePayload.from_dir(episode), {"gpus": 2})
        assert refused.value.code == "bad_settings"
        assert "gpus 2 needs two GPUs" in refused.value.message and "devices" in refused.value.message
        # a causal job's gpus 2 splits its forwards over one worker's two GPUs: these workers have one each
        with pytest.raises(RequestFailed) as refused:
            client.submit(EpisodePayload.from_dir(episode), {"gpus": 2, "model": "fast"})
        assert refused.value.code == "bad_settings" and 'gpus = "0,1"' in refused.value.message
        assert client.submit(EpisodePayload.from_dir(episode), {"gpus": 1, "steps": 2}).result(timeout=30)


@pytest.mark.parametrize("victim", ["first", "second"])
def test_sigkill_of_either_worker_of_a_two_gpu_job(servers, episode, victim):
    server = servers(worker=standin_command(step_s=0.05), worker_keys=POOL)
    with Client(server.endpoint, timeout=5, heartbeat_s=0.5) as client:
        healthy(client)
        payload = EpisodePayload.from_dir(episode)
        pair = client.submit(payload, {"steps": 60, "seed": 0, "gpus": 2})
        others = [client.submit(payload, {"steps": 4, "seed": s}) for s in (1, 2, 3)]
        both = wait_for(lambda: (h := client.health()) and all(
            (w.get("reported") or {}).get("progress", {}).get("step", 0) >= 3 for w in h["workers"]) and h,
            15, interval=0.05, what="both workers of the pair mid-job")  # fmt: skip
        role = {"first": "two-GPU job", "second": "second GPU"}[victim]
        killed = next(w for w in both["workers"] if w["role"] == role)
        os.kill(killed["pid"], signal.SIGKILL)
        outcome = pair.wait(timeout=60)
        assert isinstance(outcome, JobError) and outcome.code == "worker_crashed", outcome
        assert "SIGKILL" in outcome.message
        if victim == "second":
            assert f"the second worker of this two-GPU job ({killed['name']}) died" in outcome.message
        results = outcomes(others, timeout=60)
        assert all(isinstance(r, Result) for r in results.values()), results
        assert sorted(record_of(r.video)["settings"]["seed"] for r in results.values()) == [1, 2, 3]
        health = healthy(client)
        assert [w["restarts"] for w in health["workers"]] == [
            int(w["name"] == killed["name"]) for w in health["workers"]
        ]
        assert spool_states(server)[pair.id]["state"] == "failed"


@pytest.mark.slow
def test_two_gpu_job_on_two_tiny_workers_gives_the_one_gpu_output(servers, tmp_path):
    """Acceptance: two real tiny-model workers; a two-GPU job runs on both (its unconditional passes on
    the second worker's warm experts) and its frames equal the same job's on one worker; the
    one-GPU jobs queued around it all complete."""
    from tests.bridge.conftest import make_episode

    server = servers(worker=TINY, worker_keys=POOL)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        healthy(client, timeout=180)
        payload = EpisodePayload.from_dir(make_episode(tmp_path / "ep", n=33))
        settings = {"size": "48*80", "frame_num": 5, "steps": 6, "seed": 7}
        before = client.submit(payload, {**settings, "seed": 1})
        pair = client.submit(payload, {**settings, "gpus": 2}, want_frames=True)
        after = client.submit(payload, {**settings, "seed": 2})
        alone = client.submit(payload, settings, want_frames=True)  # the same job on one worker
        results = outcomes([before, pair, after, alone], timeout=300)
        assert all(isinstance(r, Result) for r in results.values()), results
        two, one = results[pair.id], results[alone.id]
        assert two.frames.shape == one.frames.shape and np.array_equal(two.frames, one.frames)
        assert two.provenance["compute"]["second_device"] == "cpu"  # its passes ran on the other worker
        assert one.provenance["compute"]["second_device"] is None
        assert roles(client.health()) == [(None, None), (None, None)]
    assert f"job {pair.id}: two GPUs" in server.log()


@pytest.mark.slow
def test_sigkill_of_the_second_tiny_worker_mid_two_gpu_job_retries_it(servers, tmp_path):
    from tests.bridge.conftest import make_episode

    server = servers(worker=TINY, worker_keys={**POOL, "retry_crashed": True}, max_attempts=2)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        healthy(client, timeout=180)
        payload = EpisodePayload.from_dir(make_episode(tmp_path / "ep", n=33))
        settings = {"size": "48*80", "frame_num": 5, "steps": 12}
        pair = client.submit(payload, {**settings, "gpus": 2, "seed": 0})
        others = [client.submit(payload, {**settings, "seed": s}) for s in (1, 2, 3)]
        second = wait_for(lambda: next((w for w in client.health()["workers"] if w["role"] == "second GPU" and
                                        (w.get("reported") or {}).get("progress", {}).get("step", 0) >= 2), None),
                          120, interval=0.05, what="the second worker mid-job")  # fmt: skip
        os.kill(second["pid"], signal.SIGKILL)
        results = outcomes([pair, *others], timeout=300)
        assert all(isinstance(r, Result) for r in results.values()), results
        states = spool_states(server)
        assert states[pair.id]["attempts"] == 2 and states[pair.id]["state"] == "done"
        assert all(states[j.id]["attempts"] == 1 for j in others)
        health = healthy(client)
        killed = next(w for w in health["workers"] if w["name"] == second["name"])
        assert killed["restarts"] == 1 and "SIGKILL" in killed["last_exit"]
    log = server.log()
    assert (
        f"job {pair.id}: its worker died" in log
        and f"the second worker of this two-GPU job ({second['name']}) died" in log
    )
