"""Run the whole loop on the built-in sample: serve, replay through the bridge, compare, report.

Starts a local generation server (the built-in tiny model unless --ckpt-dir is given), sends the
sample episode of data/ through the ZeroMQ bridge exactly as Isaac Sim's replay does, writes the
rollout, compares it with the sim render and writes the HTML + JSON report. Prints their paths.
The tiny model has random weights: its rollout is noise, and the report says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from contracts.checkpoint_layout import check_checkpoint
from contracts.engine_options import AUTO_DEVICE, DEVICE_HELP
from contracts.errors import CheckpointError
from contracts.model_families import preset_for

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample_room"


class DemoError(RuntimeError):
    """The demo could not run (server did not start, sample missing): the message says why."""


USER_ERRORS = (DemoError, CheckpointError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt-dir", default="tiny", help="checkpoint folder, or 'tiny' (random weights, CPU)")
    parser.add_argument("--device", default=None, help=f"{DEVICE_HELP} (default: cpu for tiny, auto otherwise)")
    parser.add_argument("--episode", type=Path, default=SAMPLE, help="episode folder to replay")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="where the rollout and report go")
    parser.add_argument("--port", type=int, default=0, help="server port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--vram-budget", type=float, default=None, metavar="GB", help="GPU memory budget (default: none)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the rollout")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args: argparse.Namespace, endpoint: str, spool: Path, log_path: Path) -> subprocess.Popen:
    """`lingbot-isaac serve` with the demo's settings as flags (each one a value, never config text)."""
    tiny = str(args.ckpt_dir).startswith("tiny")
    device = args.device or ("cpu" if tiny else AUTO_DEVICE)
    argv = [sys.executable, "-m", "lingbot_cli", "serve", "--bind", endpoint, "--spool-dir", str(spool)]
    argv += ["--ckpt", str(args.ckpt_dir), "--device", device, "--preset", preset_for(args.ckpt_dir, None)]
    if args.vram_budget is not None:
        argv += ["--vram-budget", repr(float(args.vram_budget))]
    spool.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115  (kept open for the server's lifetime)
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


# The server runs in its own session (a Ctrl-C in the terminal reaches the demo only, which stops
# the server itself), so SIGTERM (`timeout`, `kill`, a CI runner) and SIGHUP (the terminal closed)
# must end the demo the same way: through `run`'s `finally`, which stops the server.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit_on_signal(signum: int, _frame) -> None:
    print(f"stopped by {signal.Signals(signum).name}: stopping the local server", file=sys.stderr)
    raise SystemExit(128 + signum)


def _stop_on_signals() -> dict:
    return {signum: signal.signal(signum, _exit_on_signal) for signum in STOP_SIGNALS}


def _restore_signals(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _wait_healthy(client, server: subprocess.Popen, log_path: Path, timeout: float) -> dict:
    from bridge.client.client_errors import BridgeError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DemoError(f"the server exited with code {server.returncode}; its log: {log_path}")
        try:
            health = client.health(timeout=5.0)
            if health.get("worker", {}).get("ok") or health.get("ok"):
                return health
            unavailable = (health.get("server") or {}).get("unavailable")
            if unavailable:  # the worker cannot start (a bad checkpoint ...): no job will ever run
                raise DemoError(f"the server cannot run jobs: {unavailable}; its log: {log_path}")
        except BridgeError:
            pass
        time.sleep(1.0)
    raise DemoError(f"the server was not ready after {timeout:.0f} s; its log: {log_path}")


def run(args: argparse.Namespace) -> int:
    from bridge.client.client import Client
    from comparison.report import compare_episode
    from contracts.connection import REQUEST_TIMEOUT_S
    from contracts.episode import ROLLOUT_INFO, ROLLOUT_VIDEO, read_episode, write_rollout
    from contracts.settings import job_settings
    from lingbot_isaac.replay import generate

    if not (args.episode / "poses.npy").exists():
        raise DemoError(f"{args.episode}: not an episode folder (run scripts/make_sample_episode.py for data/)")
    check_checkpoint(args.ckpt_dir)  # before a server starts: the message `generate` and `serve` print
    tiny = str(args.ckpt_dir).startswith("tiny")
    out = args.out.resolve()
    episode_dir = out / "episode"
    if episode_dir.exists():
        shutil.rmtree(episode_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(args.episode, episode_dir)  # results go beside this copy, never into data/
    for stale in (ROLLOUT_VIDEO, ROLLOUT_INFO):
        (episode_dir / stale).unlink(missing_ok=True)
    endpoint = f"tcp://127.0.0.1:{args.port or _free_port()}"
    log_path = out / "server.log"
    if tiny:
        print("note: the built-in tiny model has random weights: its rollout is noise, not a prediction")
    print(f"starting a local server on {endpoint} ({args.ckpt_dir}); log: {log_path}")
    server = None
    previous = _stop_on_signals()
    try:
        server = _start_server(args, endpoint, out / "spool", log_path)
        with Client(endpoint, timeout=REQUEST_TIMEOUT_S) as client:
            _wait_healthy(client, server, log_path, timeout=600.0)
            episode = read_episode(episode_dir)
            settings = job_settings(episode.meta.generation if episode.meta else None, {})
            started = time.monotonic()
            video, info = generate(client, episode_dir, settings, "demo", True, args.timeout)
            info.update({"server": endpoint, "episode": str(episode_dir), "asked": settings})
            rollout = write_rollout(episode_dir, video, info, client="demo")
            generation_seconds = time.monotonic() - started
    finally:
        for signum in STOP_SIGNALS:  # a second signal must not cut the server's stop short
            signal.signal(signum, signal.SIG_IGN)
        if server is not None:
            _stop(server)
        _restore_signals(previous)
        # the demo's private spool: its copies of the episode and the result (of a finished or a
        # cancelled job: Ctrl-C) are not the user's; the rollout is already beside the episode
        shutil.rmtree(out / "spool", ignore_errors=True)
    started = time.monotonic()
    # the model, its settings and the noise banner come from the rollout's provenance record
    report = compare_episode(
        episode_dir, rollout, out / "report", timings={"generation_s": round(generation_seconds, 1)}
    )
    print(f"rollout: {rollout}")
    print(f"report:  {report}  (JSON: {report.with_suffix('.json')}; compared in {time.monotonic() - started:.0f} s)")
    if tiny:
        print("reminder: tiny-model output is noise; pass --ckpt-dir with real weights for a real rollout")
    return 0
