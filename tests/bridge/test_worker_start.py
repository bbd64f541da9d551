"""A server that can never run a job says so at once (issue 25): the checkpoint layout is read
before `serve` and `demo` start anything, and a worker that exits with a configuration error is not
restarted on a timer: health says why, queued and new jobs fail with the reason, and only a
`reload` starts it again. Real processes: `lingbot-isaac serve` / `demo`, the real worker."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bridge.client.client import Client
from bridge.client.client_errors import JobFailed, RequestFailed
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import JobError
from tests.bridge.conftest import REPO, standin_command, wait_for

LAYOUT_MESSAGE = "is neither checkpoint layout: expected high_noise_model/ + low_noise_model/"


@pytest.mark.parametrize(
    "command",
    [["serve", "--ckpt", "{empty}", "--bind", "tcp://127.0.0.1:*"], ["demo", "--ckpt-dir", "{empty}"]],
    ids=["serve", "demo"],
)
def test_an_empty_checkpoint_folder_ends_serve_and_demo_at_once(tmp_path, command):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(empty=empty) for a in command] + ["--spool-dir" if command[0] == "serve" else "--out",
                                                      str(tmp_path / "out")]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lingbot_cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert took < 10, f"{command[0]} took {took:.1f} s to refuse an empty checkpoint folder"
    assert f"error: {empty} {LAYOUT_MESSAGE}" in done.stderr, done.stderr
    assert "listening on" not in done.stdout and "starting a local server" not in done.stdout
    assert "Traceback" not in done.stderr


def test_a_fast_server_without_the_fast_folder_is_refused_by_serve(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lingbot_cli", "serve", "--ckpt", str(tmp_path), "--model", "fast",
                           "--spool-dir", str(tmp_path / "spool")], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and "no LingBot-World-Fast model" in done.stderr, done.stderr


def test_a_fast_only_folder_is_served_with_a_warning_about_the_presets_model(tmp_path):
    """A folder holding only the Fast model (as `lingbot-isaac quantize` writes it, with umT5, VAE and
    tokenizer) under `--model fast`: the default preset's base model is missing, which only jobs that
    leave the model to the preset need, so serve binds and says so once (it refused to start before)."""
    ckpt = tmp_path / "ckpt"
    for name in ("lingbot_world_fast_bnb_nf4/config.json", "lingbot_world_fast_bnb_nf4/quantization_meta.json",
                 "lingbot_world_fast_bnb_nf4/model.safetensors", "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth",
                 "tokenizer/tokenizer.json"):  # fmt: skip
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_text("{}")
    proc = subprocess.Popen([sys.executable, "-m", "lingbot_cli", "serve", "--ckpt", str(ckpt), "--model", "fast",
                             "--bind", "tcp://127.0.0.1:*", "--spool-dir", str(tmp_path / "spool")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert line.startswith("listening on "), err
    assert "jobs that leave the model to the preset (base) will fail" in err, err
    assert "is neither checkpoint layout" in err and "model fast run" in err, err


def test_a_configuration_error_is_said_at_once_and_not_retried_until_reload(servers, episode, tmp_path):
    """The real worker (`python -m worldgen.worker`) on an empty checkpoint folder: it exits with the
    configuration status; within 5 s health says why and the queued job fails with it; no restart
    follows on a timer; `reload` starts it again (and it fails again, with the same words)."""
    empty = tmp_path / "empty-ckpt"
    empty.mkdir()
    server = servers(worker=[sys.executable, "-m", "worldgen.worker"],
                     worker_keys={"ckpt": str(empty), "restart_backoff_s": [0.1, 0.2], "max_start_failures": 3})  # fmt: skip
    payload = EpisodePayload.from_dir(episode)
    with Client(server.endpoint, timeout=10, heartbeat_s=0.2) as client:
        job = client.submit(payload, {"steps": 1})  # queued while the worker loads torch
        failed_at: list[float] = []
        job.add_callback(lambda event: isinstance(event, JobError) and failed_at.append(time.monotonic()))
        health = wait_for(lambda: LAYOUT_MESSAGE in ((h := client.health())["reason"] or "") and h, 120,
                          interval=0.1, what="health to say why")  # fmt: skip
        known_at = time.monotonic()
        assert health["ok"] is False
        assert LAYOUT_MESSAGE in health["reason"] and str(empty) in health["reason"], health["reason"]
        assert "configuration" in health["reason"]
        worker = health["workers"][0]
        assert worker["state"] == "failed" and worker["pid"] is None and "reload" in worker["error"]
        with pytest.raises(JobFailed) as info:
            job.result(timeout=5)
        assert info.value.code == "unavailable" and LAYOUT_MESSAGE in info.value.message
        assert failed_at and failed_at[0] - known_at < 5
        with pytest.raises(RequestFailed) as refused:  # new jobs: refused at once, with the reason
            client.submit(payload, {"steps": 1})
        assert refused.value.code == "unavailable" and LAYOUT_MESSAGE in refused.value.message
        restarts = worker["restarts"]
        time.sleep(3.0)  # far beyond the back-off of 0.1-0.2 s: a timer would have restarted it by now
        later = client.health()["workers"][0]
        assert (later["state"], later["restarts"], later["pid"]) == ("failed", restarts, None)
        assert client.reload() == 1
        assert client.health()["workers"][0]["state"] in ("starting", "failed")
        again = wait_for(lambda: (h := client.health())["workers"][0]["state"] == "failed" and h, 120, interval=0.2,
                         what="the reloaded worker to fail again")  # fmt: skip
        assert again["workers"][0]["restarts"] == restarts + 1 and LAYOUT_MESSAGE in again["reason"]
    assert server.log().count("cannot start: a configuration error") == 2


def test_a_transient_start_failure_is_still_retried_with_back_off(servers, episode, tmp_path):
    """A worker that dies while loading (not a configuration exit) is restarted on its timer."""
    crash = tmp_path / "crash_on_load.py"
    crash.write_text("import sys\nsys.stdin.buffer.read(4)\nsys.exit(3)\n")  # reads `load`, then fails
    server = servers(worker=[sys.executable, str(crash)], worker_keys={"restart_backoff_s": [0.1, 0.2],
                     "max_start_failures": 100})  # fmt: skip
    with Client(server.endpoint, timeout=10) as client:
        health = wait_for(lambda: (h := client.health())["workers"][0]["restarts"] >= 3 and h, 30, interval=0.2,
                          what="restarts on the back-off timer")  # fmt: skip
        assert health["ok"] is False and health["workers"][0]["state"] != "failed"
        assert "exited with status 3" in health["workers"][0]["last_exit"]


def test_the_demo_says_the_servers_reason_when_its_worker_cannot_start(servers, tmp_path):
    """The demo's wait for its server: a worker that cannot start ends it with the server's words
    within seconds (the stand-in worker fails to load as a missing checkpoint would)."""
    from lingbot_cli.demo import DemoError, _wait_healthy

    server = servers(worker=[*standin_command(), "--fail-load"])
    started = time.monotonic()
    with Client(server.endpoint, timeout=10) as client, pytest.raises(DemoError) as info:
        _wait_healthy(client, server.proc, server.log_path, timeout=60)
    assert time.monotonic() - started < 10
    assert "the server cannot run jobs: " in str(info.value) and "/nowhere" in str(info.value)


def test_every_client_shows_the_servers_reason_within_5_s(servers, episode, tmp_path):
    """Once the server knows its worker cannot start: `submit`, `replay` (real processes) and the
    Isaac window's session each end with the server's words within 5 s, none waits for progress."""
    from lingbot_isaac.session import Session, SessionSettings

    server = servers(worker=[*standin_command(), "--fail-load"])
    with Client(server.endpoint, timeout=10) as client:
        wait_for(lambda: "/nowhere" in (client.health()["reason"] or ""), 30, interval=0.1, what="the reason")
    for command in (["submit", str(episode), "--server", server.endpoint, "--out", str(tmp_path / "s.mp4")],
                    ["replay", str(episode), "--server", server.endpoint, "--out", str(tmp_path / "replay")]):  # fmt: skip
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "lingbot_cli", *command], cwd=REPO, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        took = time.monotonic() - started
        assert done.returncode != 0 and "/nowhere" in done.stderr, (command[0], done.stderr)
        assert took < 5, f"{command[0]} took {took:.1f} s to say why"
    session = Session(SessionSettings(server=server.endpoint, output_dir=tmp_path / "window", compare=False))
    started = time.monotonic()
    session.generate(episode)
    status = wait_for(lambda: not session.busy and session.status(), 5, interval=0.05, what="the session's answer")
    assert status.state == "failed" and "/nowhere" in status.message, status.message
    assert time.monotonic() - started < 5
