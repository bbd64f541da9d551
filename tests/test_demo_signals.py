"""`lingbot-isaac demo` stopped by SIGTERM (`timeout`, `kill`) or SIGHUP (the terminal closed) stops
its local server as Ctrl-C does: a real demo process, its real server and worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stopped_by_a_signal_stops_its_server(tmp_path, signum):
    env = {"LINGBOT_ISAAC_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "lingbot_cli", "demo", "--out", str(tmp_path / "demo")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        server, worker = [], []
        while time.monotonic() < deadline and not worker:  # the server, and the worker it started
            server = children(demo.pid)
            worker = [w for s in server for w in children(s)]
            time.sleep(0.2)
        assert server and worker, "the demo's server and its worker did not start"
        demo.send_signal(signum)
        _out, err = demo.communicate(timeout=60)
        assert demo.returncode == 128 + signum, err
        assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in server + worker):
            time.sleep(0.2)
        assert not any(alive(p) for p in server + worker), "the demo's server outlived it"
        assert not (tmp_path / "demo" / "spool").exists()
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in children(demo.pid):
            os.kill(pid, signal.SIGKILL)
