"""The window's `gpus` setting (1 or 2 GPUs per job), at the session level, against real server
subprocesses: a one-device server refuses `gpus = 2` with `bad_settings` and the status line says
so in the server's words; a server with a pool of two workers runs the job on both. A job refused
later (`bad_settings` from a restarted, stricter server) reads like the refusal at submit.

The servers run the bridge's stand-in engine (tests/bridge/standin_worker.py: worldgen.worker's
real loop and the real two-worker peer protocol, a known pace per step), so these are quick."""

from __future__ import annotations

import json

import pytest

from bridge.client.client import Client
from contracts.episode import ROLLOUT_INFO, ROLLOUT_VIDEO
from contracts.settings import FIELD_BY_NAME, GenerationSettings, SettingsError
from lingbot_isaac.session import Session, SessionSettings, gpu_choices
from tests.bridge.conftest import make_episode, servers, standin_command, wait_for  # noqa: F401  (fixture)
from tests.bridge.test_server import record_of
from tests.bridge.test_worker_pool import POOL, healthy


def session_for(server, **settings) -> Session:
    return Session(SessionSettings(server=server.endpoint, timeout=10.0, compare=False, **settings))


def test_the_gpus_choices_are_the_contracts_range_and_nothing_is_sent_by_default():
    spec = FIELD_BY_NAME["gpus"]
    assert [value for _, value in gpu_choices()] == [None, *range(int(spec.low), int(spec.high) + 1)] == [None, 1, 2]
    assert "gpus" not in SessionSettings().generation()  # the server's preset decides
    assert SessionSettings(gpus=2).generation() == {"gpus": 2}
    with pytest.raises(SettingsError, match=r"^gpus must be in \[1, 2\] \(got 3\)"):
        SessionSettings(gpus=3).generation()


def test_gpus_2_with_model_fast_is_sent_for_the_server_to_decide():
    """A causal job's `gpus = 2` splits each chunk over a two-GPU worker (issue 55): the contract takes it,
    the session sends it, and the server says whether it can (tests/bridge/test_two_gpu_server.py)."""
    generation = SessionSettings(gpus=2, model="fast").generation()
    assert generation["gpus"] == 2 and generation["model"] == "fast"
    assert GenerationSettings.from_dict(generation).gpus == 2


def test_a_one_device_server_refuses_gpus_2_and_the_status_line_says_why(servers, tmp_path):  # noqa: F811
    server = servers(worker=standin_command(step_s=0.01))
    episode = make_episode(tmp_path / "ep")
    session = session_for(server, gpus=2)
    session.generate(episode)
    status = session.wait(timeout=60)
    assert status.state == "failed", status
    # the server's own reason, whole, after a plain lead-in (no code, no "settings:" prefix)
    assert status.message.startswith("The server refused the settings: gpus 2 needs two GPUs, and this server "
                                     "has one worker on one device (0:cpu): use gpus 1"), status.message  # fmt: skip
    assert "bad_settings" in status.error
    assert not (episode / ROLLOUT_VIDEO).exists()
    # the same server runs the job with gpus 1, sent as the job's setting
    session.settings.gpus = 1
    session.generate(episode)
    status = session.wait(timeout=60)
    assert status.state == "done", status
    record = record_of(status.result.read_bytes())  # what the stand-in engine was asked
    assert record["settings"]["gpus"] == 1 and record["peer"] is None


def test_gpus_2_runs_the_job_on_two_workers_of_a_pool(servers, tmp_path):  # noqa: F811
    server = servers(worker=standin_command(step_s=0.01), worker_keys=POOL)
    with Client(server.endpoint, timeout=10) as client:
        names = [w["name"] for w in healthy(client)["workers"]]
    episode = make_episode(tmp_path / "ep")
    session = session_for(server, gpus=2)
    session.generate(episode)
    status = session.wait(timeout=60)
    assert status.state == "done", status
    record = record_of(status.result.read_bytes())
    assert record["settings"]["gpus"] == 2
    assert record["peer"] in names  # the unconditional passes ran on the pool's other worker
    job = json.loads((episode / ROLLOUT_INFO).read_text())["job"]
    assert job["asked"]["gpus"] == 2 and job["client"] == "extension"
    assert f"job {job['id']}: two GPUs" in server.log()


def test_a_job_the_restarted_server_can_no_longer_run_reads_like_a_refusal_at_submit(servers, tmp_path):  # noqa: F811
    """A job accepted under the server's caps, then the server is killed and restarted on the same
    spool with a lower cap: it re-checks the resumed job and fails it with `bad_settings` ("not
    run: ..."); the session follows it across the restart and shows the same line as at submit."""
    server = servers(worker=standin_command(step_s=1.0))  # 30 steps: a job that is still running when killed
    episode = make_episode(tmp_path / "ep")
    session = Session(SessionSettings(server=server.endpoint, steps=30, timeout=30.0, compare=False))
    session.generate(episode)
    wait_for(lambda: session.status().progress > 0, 60, what="the job denoising")
    server.kill_group()  # the server and its worker: the job stays "running" in the spool
    server.tables["server"]["bind"] = server.endpoint  # same port, same spool
    server.tables["limits"] = {"max_steps": 4}
    server.start()
    status = session.wait(timeout=120)
    assert status.state == "failed", status
    assert status.message == "The server refused the settings: steps 30 > the server's cap 4", status.message
    assert "bad_settings" in status.error and "not run" in status.error
    assert not (episode / ROLLOUT_VIDEO).exists()
    assert "1 job(s) resumed" in server.log()
