"""`[worker] backend = "ray"`: each worker of the pool is a Ray actor, anywhere in a Ray cluster.

The server stays the one ZeroMQ front door and the durable spool; only the workers move. Each
actor (`WorkerActor`, `num_gpus=1` for a GPU, 0 for a CPU worker) starts the very same worker
command as the local backend (`python -m worldgen.worker ...`, or `[worker] command`) as its
child and relays its pipe: the worker loop, its warm model, cancellation and health are the same
code. On the server side `RayWorkerHandle` looks like a local `WorkerProcess` to the
`Supervisor`, so every outcome maps the same way:

- the worker process dies inside its actor -> its exit status (SIGKILL, OOM ...), as locally;
- the actor dies (killed, its Ray worker crashed, its node failed) -> `worker_crashed` with Ray's
  reason; the supervisor then starts a fresh actor (Ray's own actor restarts are off, so a job is
  never silently re-run behind the server's back);
- an actor Ray cannot place (no free GPU) never says `ready`: the start timeout applies.

The actor is a plain (sequential) actor, so messages reach the worker in the order sent; the
server polls it (`poll`, at most POLL_S long) and never blocks on it. Ray is optional
(`pip install 'lingbot-isaac[cluster]'`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bridge.workers import worker_protocol as wp
from bridge.workers.worker_config import ConfigError, WorkerConfig
from contracts.engine_options import EngineOptions

try:
    import ray
except ImportError:  # the optional extra is not installed
    ray = None

log = logging.getLogger("bridge.workers.ray_backend")

POLL_S = 0.1  # longest an actor's poll waits for the worker's next message
NAMESPACE = "lingbot-isaac"
RAY_CLIENT_ATTEMPTS = 3  # the Ray Client server's forked per-client server can crash at start: see connect
ROOT = str(Path(__file__).resolve().parent.parent)


def require_ray() -> Any:
    if ray is None:
        raise ConfigError(
            '[worker] backend = "ray" needs Ray, which is not installed: '
            "pip install 'lingbot-isaac[cluster]' (or set backend = \"local\")"
        )
    return ray


class WorkerActor:
    """Runs inside a Ray worker process: the generation worker as a child, its pipe relayed."""

    def __init__(self, argv: list[str], env: dict[str, str], own_python: bool) -> None:
        if own_python:  # the server's interpreter path may not exist on this node: use ours
            argv = [sys.executable, *argv[1:]]
        child_env = {**os.environ, **env}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=child_env)
        self.messages: queue.Queue = queue.Queue()
        self.write_lock = threading.Lock()
        threading.Thread(target=self._read, name="worker-pipe", daemon=True).start()

    def _read(self) -> None:
        try:
            while (message := wp.read_message(self.proc.stdout)) is not None:
                self.messages.put(("message", message))
        except (wp.WorkerProtocolError, OSError) as exc:
            self.messages.put(("garbage", str(exc)))
        self.messages.put(("exit", self.proc.wait()))

    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        with self.write_lock, contextlib.suppress(OSError):
            wp.write_message(self.proc.stdin, message)

    def poll(self, timeout_s: float) -> dict[str, Any]:
        """The worker's messages since the last poll (waits up to timeout_s for the first);
        `exit`: the worker's exit status once it has ended; `garbage`: an unreadable pipe."""
        out: dict[str, Any] = {"messages": [], "exit": None, "garbage": None}
        try:
            items = [self.messages.get(timeout=timeout_s)]
        except queue.Empty:
            return out
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self.messages.get_nowait())
        for kind, value in items:
            if kind == "message":
                out["messages"].append(value)
            elif kind == "garbage":
                out["garbage"] = value
            else:
                out["exit"] = value
        return out

    def kill_worker(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


class RayWorkerHandle:
    """The supervisor's view of one actor: the interface of `bridge.workers.supervisor.WorkerProcess`."""

    def __init__(self, actor_class: Any, options: dict[str, Any], argv: tuple[str, ...], env: dict[str, str],
                 own_python: bool) -> None:  # fmt: skip
        self.name = f"lingbot-worker-{uuid.uuid4().hex[:12]}"
        self.actor = actor_class.options(name=self.name, namespace=NAMESPACE, **options).remote(
            list(argv), env, own_python
        )
        self.eof = False
        self.eof_at: float | None = None
        self.exit_reason: str | None = None
        self.returncode: int | None = None
        self._poll_ref = None
        self._pid: int | None = None
        self._inbox: list[dict[str, Any]] = []
        self._garbage: str | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    def send(self, message: dict[str, Any]) -> None:
        if not self.eof:
            self.actor.send.remote(message)  # a dead actor shows up in the next poll

    def flush(self) -> None:
        pass

    def fds(self) -> list[tuple[int, bool]]:
        return []  # nothing to poll: the server wakes up at wake_at() and asks Ray

    def wake_at(self) -> float | None:
        return None if self.eof else time.monotonic() + 0.05

    def read(self) -> list[dict[str, Any]]:
        """The worker's messages that arrived since the last read (never waits)."""
        self._fetch()
        messages, self._inbox = self._inbox, []
        if self._garbage is not None:
            garbage, self._garbage = self._garbage, None
            raise wp.WorkerProtocolError(garbage)
        return messages

    def _fetch(self) -> None:
        if self.eof:
            return
        if self._poll_ref is None:
            self._poll_ref = self.actor.poll.remote(POLL_S)
        ready, _ = ray.wait([self._poll_ref], timeout=0)
        if not ready:
            return
        ref, self._poll_ref = self._poll_ref, None
        try:
            reply = ray.get(ref)
        except ray.exceptions.RayError as exc:  # the actor died (killed, crashed, node lost)
            self._ended(1, _first_line(f"Ray actor {self.name} died: {exc}"))
            return
        for message in reply["messages"]:
            if message.get("type") == "ready" and isinstance(message.get("pid"), int):
                self._pid = message["pid"]
        self._inbox.extend(reply["messages"])
        self._garbage = reply["garbage"]
        if reply["exit"] is not None:
            self._ended(reply["exit"], None)

    def _ended(self, returncode: int, reason: str | None) -> None:
        self.eof, self.eof_at = True, time.monotonic()
        self.returncode, self.exit_reason = returncode, reason
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def poll(self) -> int | None:
        self._fetch()  # messages stay in the inbox for the next read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("ray actor", timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            ray.get(self.actor.kill_worker.remote(), timeout=2.0)  # the worker first: a clean exit status
        if self.returncode is None:
            self._ended(-9, None)

    def close(self) -> None:
        if self.returncode is None:
            self.exit_reason = self.exit_reason or "closed"
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:500]


def connect(worker: WorkerConfig) -> None:
    """Join (or start) the Ray cluster, with this checkout importable in every actor."""
    require_ray()
    if ray.is_initialized():
        return
    if worker.ray_address.startswith("ray://"):
        # Ray Client: the actors run on the cluster's machines, which need lingbot-isaac installed
        # themselves (this checkout's path means nothing there).
        _connect_through_ray_client(worker.ray_address)
        return
    pythonpath = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address=worker.ray_address or None,
        namespace=NAMESPACE,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        log_to_driver=True,
        configure_logging=False,
    )


def _connect_through_ray_client(address: str) -> None:
    """`ray.init("ray://...")`, tried RAY_CLIENT_ATTEMPTS times.

    The Ray Client server forks one server per client; with gRPC's fork support on (grpcio's
    default) that child can die of SIGSEGV before it starts (Ray 2.60, grpcio 1.85: half the
    connections on 2 busy cores), and the client sees ConnectionAbortedError. A new connection
    forks again, so a retry usually gets through; the lasting fix is on the cluster's side.
    """
    for attempt in range(1, RAY_CLIENT_ATTEMPTS + 1):
        try:
            ray.init(address=address, namespace=NAMESPACE)
            return
        except ConnectionAbortedError as exc:
            if attempt == RAY_CLIENT_ATTEMPTS:
                raise ConfigError(
                    f"[worker] ray_address = {address!r}: the Ray Client server failed to start a "
                    f"server for this client {attempt} times ({_first_line(str(exc))}). Its log is "
                    "ray_client_server_<port>.err in the head node's Ray log folder; if it is empty, "
                    "the forked server crashed: start the head with GRPC_ENABLE_FORK_SUPPORT=0 in "
                    "its environment (GRPC_ENABLE_FORK_SUPPORT=0 ray start --head ...)"
                ) from exc
            log.warning("Ray Client connection to %s aborted (%s); trying again", address, exc)


def ray_spawners(worker: WorkerConfig, devices: tuple[str, ...]) -> list[tuple[str, EngineOptions, Any]]:
    """(name, engine options, spawn) for each actor of the pool. `[worker] devices` empty: one per GPU."""
    connect(worker)
    if not worker.devices:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise ConfigError(
                '[worker] backend = "ray" with no devices listed runs one actor per GPU, but the Ray '
                f"cluster at {worker.ray_address or 'this machine'} has none; list devices, e.g. "
                'devices = ["cpu", "cpu"]'
            )
        devices = ("cuda",) * gpus
    actor_class = ray.remote(WorkerActor)
    spawners = []
    for index, device in enumerate(devices):
        gpu = device.startswith("cuda")
        # Ray gives the actor one GPU and sets CUDA_VISIBLE_DEVICES: inside, it is always "cuda".
        engine = worker.options_for("cuda" if gpu else device)
        options = {"num_gpus": 1 if gpu else 0, "num_cpus": 1, "max_restarts": 0, "max_task_retries": 0}
        env = {} if gpu else {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

        def spawn(argv_: tuple[str, ...], _env: Any, options=options, env=env) -> RayWorkerHandle:
            return RayWorkerHandle(actor_class, options, argv_, env, own_python=not worker.command)

        spawners.append((f"{index}:ray:{device}", engine, spawn))
    return spawners
