"""`[worker] backend = "ray"`: the pool's workers as actors of a real local Ray cluster (CPU).

The test process starts the cluster (2 CPUs, a small object store, loopback only); the server
subprocess joins it by address and places one actor per device (`num_gpus=0` here). Killing an
actor mid-job (as a lost node would) and SIGKILLing the worker process inside an actor must both
cost only the job that ran there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Result
from tests.bridge.conftest import REPO, TINY, make_episode, standin_command, wait_for, write_toml
from tests.bridge.test_server import record_of
from tests.bridge.test_worker_pool import healthy, outcomes, spool_states

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'lingbot-isaac[cluster]')")

# One machine: keep Ray on 127.0.0.1 instead of the machine's network address.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_cluster():
    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    os.environ.update(LOOPBACK_ENV)
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit
    ray.init(num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False, _temp_dir=temp_dir,
             namespace="lingbot-isaac", configure_logging=False)  # fmt: skip
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def ray_keys(address: str, **extra) -> dict:
    return {"backend": "ray", "ray_address": address, "devices": ["cpu", "cpu"], **extra}


def test_actor_killed_and_worker_sigkilled_mid_job_cost_only_their_jobs(servers, episode, ray_cluster):
    server = servers(worker=standin_command(step_s=0.05), worker_keys=ray_keys(ray_cluster))
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        health = healthy(client, timeout=120)
        names = [w["actor"] for w in health["workers"]]
        assert len(set(names)) == 2 and all(n.startswith("lingbot-worker-") for n in names)
        assert [w["name"] for w in health["workers"]] == ["0:ray:cpu", "1:ray:cpu"]
        payload = EpisodePayload.from_dir(episode)
        jobs = [client.submit(payload, {"steps": 30, "seed": i}) for i in range(8)]
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2 and h, 30,
                        what="both actors busy")  # fmt: skip
        # 1. The actor itself goes (as when its node is lost): Ray reports it dead.
        lost = busy["workers"][1]
        ray.kill(ray.get_actor(lost["actor"], namespace="lingbot-isaac"), no_restart=True)
        # 2. The worker process inside the other actor is SIGKILLed (as the OOM killer would).
        busy2 = wait_for(
            lambda: (
                (h := client.health())["workers"][0]["job"] not in (None, lost["job"])
                and (h["workers"][0].get("reported") or {}).get("progress", {}).get("phase") == "denoise"
                and h
            ),
            30,
            what="actor 0 denoising",
        )
        killed = busy2["workers"][0]
        os.kill(killed["pid"], signal.SIGKILL)
        results = outcomes(jobs, timeout=120)
        failed = {job_id: o for job_id, o in results.items() if not isinstance(o, Result)}
        assert set(failed) == {lost["job"], killed["job"]}
        assert failed[lost["job"]].code == "worker_crashed" and "Ray actor" in failed[lost["job"]].message
        assert failed[killed["job"]].code == "worker_crashed" and "SIGKILL" in failed[killed["job"]].message
        seeds = sorted(record_of(o.video)["settings"]["seed"] for o in results.values() if isinstance(o, Result))
        ids = [j.id for j in jobs]
        assert seeds == sorted(set(range(8)) - {ids.index(lost["job"]), ids.index(killed["job"])})
        assert set(spool_states(server)) == set(ids)  # nothing lost, nothing duplicated
        health = healthy(client, timeout=120)  # both replaced by fresh actors
        assert [w["restarts"] for w in health["workers"]] == [1, 1]
        assert health["workers"][1]["actor"] != lost["actor"]


def test_retry_moves_the_job_of_a_killed_actor_to_a_live_one(servers, episode, ray_cluster):
    server = servers(worker=standin_command(step_s=0.05),
                     worker_keys=ray_keys(ray_cluster, retry_crashed=True), max_attempts=2)  # fmt: skip
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        healthy(client, timeout=120)
        payload = EpisodePayload.from_dir(episode)
        jobs = [client.submit(payload, {"steps": 30, "seed": i}) for i in range(4)]
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2 and h, 30,
                        what="both actors busy")  # fmt: skip
        lost = busy["workers"][0]
        ray.kill(ray.get_actor(lost["actor"], namespace="lingbot-isaac"), no_restart=True)
        results = outcomes(jobs, timeout=120)
        assert all(isinstance(o, Result) for o in results.values()), results
        assert sorted(record_of(o.video)["settings"]["seed"] for o in results.values()) == [0, 1, 2, 3]
        assert spool_states(server)[lost["job"]]["attempts"] == 2


def test_ray_backend_without_ray_is_a_clear_error(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if the [cluster] extra were not installed
        "from lingbot_cli.main import main\n"
        f"sys.exit(main(['serve', '--backend', 'ray', '--devices', 'cpu', '--spool-dir', {str(tmp_path)!r},"
        " '--bind', 'tcp://127.0.0.1:*']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "needs Ray" in done.stderr and "lingbot-isaac[cluster]" in done.stderr


@pytest.mark.slow
def test_two_tiny_model_actors_and_an_actor_killed_mid_job(servers, tmp_path, ray_cluster):
    """Acceptance: the tiny model warm in two Ray actors; one actor killed while it denoises."""
    episode = make_episode(tmp_path / "ep", n=33)
    server = servers(worker=TINY, worker_keys=ray_keys(ray_cluster))
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        health = healthy(client, timeout=240)
        assert all(w["reported"]["model"] == "tiny" for w in health["workers"])
        payload = EpisodePayload.from_dir(episode)
        # enough steps that the job seen denoising is still the actor's job when the kill lands,
        # even on 2 busy cores (8 steps once finished in between)
        settings = {"size": "48*80", "frame_num": 5, "steps": 40}
        jobs = [client.submit(payload, {**settings, "seed": i}) for i in range(6)]

        def denoising(h: dict) -> dict | None:
            def early(w: dict) -> bool:
                progress = (w.get("reported") or {}).get("progress", {})
                return progress.get("phase") == "denoise" and progress.get("step", 0) <= progress.get("total", 0) // 4

            return next((w for w in h["workers"] if early(w)), None)

        victim = wait_for(lambda: denoising(client.health()), 120, interval=0.1, what="an actor denoising")
        ray.kill(ray.get_actor(victim["actor"], namespace="lingbot-isaac"), no_restart=True)
        results = outcomes(jobs, timeout=400)
        failed = {k: v for k, v in results.items() if not isinstance(v, Result)}
        assert list(failed) == [victim["job"]] and failed[victim["job"]].code == "worker_crashed"
        assert all(r.video[4:8] == b"ftyp" for r in results.values() if isinstance(r, Result))


def start_ray_client_server(ray_cluster: str, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A Ray Client server (proxy) in front of the test cluster: what `ray_address = "ray://..."` joins."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proxy = subprocess.Popen(
        [sys.executable, "-m", "ray.util.client.server", f"--address={ray_cluster}", "--host=127.0.0.1",
         f"--port={port}", "--mode=proxy"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **env},
    )  # fmt: skip
    return proxy, f"ray://127.0.0.1:{port}"


def stop(proxy: subprocess.Popen) -> None:
    os.killpg(proxy.pid, signal.SIGKILL)
    proxy.wait(timeout=10)


@pytest.fixture
def ray_client_address(ray_cluster):
    # As docs/scale-out.md says to start a head: gRPC's fork support off, else the proxy's forked
    # per-client server can die of SIGSEGV at start (half the connections on 2 busy cores).
    proxy, address = start_ray_client_server(ray_cluster, {"GRPC_ENABLE_FORK_SUPPORT": "0"})
    yield address
    stop(proxy)


@pytest.mark.slow
def test_ray_client_address_places_the_actors_through_ray_client(servers, episode, ray_client_address):
    # the server joins through the Ray Client proxy before it listens: that start alone can take
    # tens of seconds on 2 busy cores
    server = servers(worker=standin_command(step_s=0.05), worker_keys=ray_keys(ray_client_address), start_timeout=180)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.5) as client:
        health = healthy(client, timeout=180)
        assert len({w["actor"] for w in health["workers"]}) == 2
        payload = EpisodePayload.from_dir(episode)
        jobs = [client.submit(payload, {"steps": 30, "seed": i}) for i in range(4)]
        busy = wait_for(lambda: len((h := client.health())["queue"]["running_jobs"]) == 2 and h, 60,
                        what="both actors busy")  # fmt: skip
        lost = busy["workers"][0]
        ray.kill(ray.get_actor(lost["actor"], namespace="lingbot-isaac"), no_restart=True)
        results = outcomes(jobs, timeout=180)
        failed = {job_id: o for job_id, o in results.items() if not isinstance(o, Result)}
        assert list(failed) == [lost["job"]] and failed[lost["job"]].code == "worker_crashed"
        assert sum(isinstance(o, Result) for o in results.values()) == 3


@pytest.mark.slow
def test_a_ray_client_server_whose_client_servers_die_is_tried_three_times_then_named(tmp_path, ray_cluster):
    # Every per-client server this proxy forks exits at once, as the SIGSEGV above does at random.
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "sitecustomize.py").write_text(
        "import os, sys\nif '--mode=specific-server' in sys.argv:\n    os._exit(139)\n"
    )
    pythonpath = os.pathsep.join(p for p in (str(crash), os.environ.get("PYTHONPATH")) if p)
    # the proxy's own wait for a server that never comes: 30 s by default
    proxy, address = start_ray_client_server(
        ray_cluster, {"PYTHONPATH": pythonpath, "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "1"}
    )
    try:
        config = write_toml(tmp_path / "server.toml", {
            "server": {"bind": "tcp://127.0.0.1:*", "spool_dir": str(tmp_path / "spool")},
            "worker": {"command": standin_command(), **ray_keys(address)},
        })  # fmt: skip
        run = subprocess.run([sys.executable, "-m", "lingbot_cli", "serve", "--config", str(config)], cwd=REPO,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        stop(proxy)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.count("trying again") == 2
    last = run.stderr.strip().splitlines()[-1]
    assert address in last and "3 times" in last and "GRPC_ENABLE_FORK_SUPPORT=0 ray start --head" in last
