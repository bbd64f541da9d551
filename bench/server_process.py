"""A `lingbot-isaac serve` child process for the benchmarks that measure a server end to end (bench_live,
bench_pool): started on a config file, its endpoint read from its first line, stopped with SIGTERM (its
process group killed after 30 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def start(config: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """-> (the server process, its endpoint); its stderr goes to server.log beside `config`."""
    log = open(config.parent / "server.log", "wb")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen([sys.executable, "-m", "lingbot_cli", "serve", "--config", str(config)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=log, start_new_session=True, env=env)  # fmt: skip
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}; see {config.parent / 'server.log'}")
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
