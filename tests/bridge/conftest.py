"""Fixtures for the bridge tests: episode folders, and real server subprocesses that are always
killed afterwards (each server runs in its own process group, with its worker)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from contracts.episode import EpisodeMeta

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_worker.py")
TINY = "tiny"  # ServerPool.start(worker=TINY): the real worker with the built-in tiny model


def make_episode(
    folder: Path,
    n: int = 17,
    prompt: str = "a corridor, the camera moves forward",
    image_format: str = "png",
    seed: int = 0,
) -> Path:
    """An episode folder in the LingBot action layout (plus episode.json, as the Isaac side writes)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, size=(96, 160, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG" if image_format == "png" else "JPEG")
    (folder / ("image.png" if image_format == "png" else "image.jpg")).write_bytes(buffer.getvalue())
    poses = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
    poses[:, 2, 3] = np.linspace(0, 1, n, dtype=np.float32)  # forward along +z (OpenCV)
    poses[:, 0, 3] = rng.normal(0, 0.01, n).astype(np.float32)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", np.tile(np.float32([[502.0, 502.0, 416.0, 240.0]]), (n, 1)))
    (folder / "prompt.txt").write_text(prompt, encoding="utf-8")
    (folder / "episode.json").write_text(json.dumps(EpisodeMeta(source_resolution=(96, 160)).to_json(n)))
    return folder


@pytest.fixture
def episode(tmp_path: Path) -> Path:
    return make_episode(tmp_path / "episode")


def top_speed_first_episode(folder: Path, n: int) -> Path:
    """`make_episode` with the camera at its top speed from the first step: a live job, which fixes its camera scale
    on the first moving chunk, and a batch job of the same poses then scale it alike."""
    make_episode(folder, n=n)
    poses = np.load(folder / "poses.npy")
    poses[:, 2, 3] = np.sqrt(np.linspace(0, 1, n)).astype(np.float32)
    np.save(folder / "poses.npy", poses)
    return folder


def video_frames(video: bytes, path: Path) -> np.ndarray:
    """An mp4's bytes (a result's or a chunk's) -> its uint8 frames [F, H, W, 3], through a file at `path`."""
    from contracts.video import read_mp4

    path.write_bytes(video)
    return read_mp4(path)[0]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_toml(path: Path, tables: dict[str, dict[str, Any]]) -> Path:
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def standin_command(step_s: float = 0.05, hold_until: Path | None = None) -> list[str]:
    """The stand-in worker; with `hold_until`, each job waits before its first step until that file exists."""
    hold = ["--hold-until", str(hold_until)] if hold_until is not None else []
    return [sys.executable, str(STANDIN), "--step-s", str(step_s), *hold]


class ServerProcess:
    """`python -m lingbot_cli serve --config ...` in its own process group."""

    def __init__(self, workdir: Path, tables: dict[str, dict[str, Any]]) -> None:
        self.workdir = workdir
        self.tables = tables
        self.config_path = write_toml(workdir / "server.toml", tables)
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.endpoint: str | None = None

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.config_path = write_toml(self.workdir / "server.toml", self.tables)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lingbot_cli", "serve", "--config", str(self.config_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        line = self._read_line(timeout)
        if not line.startswith("listening on "):
            self.kill_group()
            raise RuntimeError(f"server did not start: {line!r}\n{self.log()}")
        self.endpoint = line.split()[-1]
        # Nobody reads the pipe after this line: drain it into the log, or a server that prints
        # more (Ray's driver echoes its actors' output to stdout) blocks once the pipe is full.
        threading.Thread(target=self._drain_stdout, args=(self.proc.stdout.fileno(),), daemon=True).start()
        return self

    def wait_loaded(self, timeout: float = 120.0, what: str = "the tiny model to load") -> ServerProcess:
        """Wait until the server's health is ok (its worker loaded its model); -> self."""
        from bridge.client.client import Client

        with Client(self.endpoint, timeout=10) as client:
            wait_for(lambda: client.health()["ok"], timeout, interval=0.5, what=what)
        return self

    def _drain_stdout(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError), open(self.log_path, "ab") as log:
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                log.write(chunk)
                log.flush()

    def _read_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        data = b""
        fd = self.proc.stdout.fileno()
        while not data.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace").strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server process only (its worker must notice and exit by itself)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def kill_group(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


class ServerPool:
    """Starts servers in folders under `root` and kills them all (process groups) on close()."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[ServerProcess] = []

    def start(
        self,
        worker: list[str] | str | None = None,
        name: str = "server",
        worker_keys: dict | None = None,
        limits: dict | None = None,
        security: dict | None = None,
        start_timeout: float = 30.0,
        **server_keys: Any,
    ) -> ServerProcess:
        """worker: None for the stand-in, TINY for the server's own default worker command
        (`python -m worldgen.worker`, [worker] ckpt "tiny" on the cpu), or a whole command line."""
        workdir = self.root / name
        workdir.mkdir(parents=True, exist_ok=True)
        worker_table = {"startup_timeout_s": 120.0, "restart_backoff_s": [0.2, 2.0], **(worker_keys or {})}
        if worker != TINY:
            worker_table["command"] = worker or standin_command()
        tables = {
            "server": {"bind": "tcp://127.0.0.1:*", "spool_dir": str(workdir / "spool"), **server_keys},
            "worker": worker_table,
        }
        if limits:
            tables["limits"] = limits
        if security:
            tables["security"] = security
        server = ServerProcess(workdir, tables)
        self.started.append(server)
        return server.start(start_timeout)

    def close(self) -> None:
        for server in self.started:
            server.kill_group()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator:
    """Factory: servers(worker=[argv], **[server] keys) -> a started ServerProcess, killed (with
    its process group) when the test ends."""
    pool = ServerPool(tmp_path)
    yield pool.start
    pool.close()


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def concurrently(fn: Callable[[int], None], count: int, timeout: float) -> list[BaseException]:
    """fn(0) ... fn(count - 1), each in a thread of its own, all at once (e.g. `count` clients of one
    server); -> what they raised, and a TimeoutError for each still running `timeout` s after joining."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            fn(index)
        except Exception as exc:  # returned to the test, which asserts there is none
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return errors + [TimeoutError(f"{t.name} still running after {timeout} s") for t in threads if t.is_alive()]


def rss_mb(pid: int) -> float:
    """Resident memory of another process (a server under test), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
