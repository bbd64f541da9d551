"""Keeps one generation worker process alive and turns its pipe into events for the server.

The worker (`python -m worldgen.worker`) holds the models warm between jobs. The supervisor:
- starts it with pipes and waits for `ready` (bounded by a start timeout);
- restarts it when it dies (crash, SIGKILL, the kernel's OOM killer), fails the job it was running
  with the reason, and backs off exponentially while it cannot even start;
- kills it when a job stalls (no message for `stall_timeout_s`) or ignores a cancel;
- forwards health checks to it, so a health answer proves the worker still responds.

Everything is non-blocking: the server's single event loop polls the worker's stdout next to
its ROUTER socket (`fds()`, `on_readable()`), writes go through an outbox flushed when the pipe
takes them, and timers run from `tick()`. The supervisor never waits on the worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from typing import Any

from bridge.workers import worker_protocol as wp
from contracts.engine_options import AUTO_DEVICE

log = logging.getLogger("bridge.workers.supervisor")

# How long a dying worker may take to exit after closing its pipe before it is SIGKILLed.
EXIT_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    argv: tuple[str, ...]
    env: dict[str, str] | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # EngineOptions.to_dict(): the `load` message
    startup_timeout_s: float = 600.0
    health_timeout_s: float = 2.5  # below a client's try timeout (10 s / 3 tries by default)
    cancel_grace_s: float = 120.0
    stall_timeout_s: float = 900.0
    restart_backoff_s: tuple[float, float] = (0.5, 30.0)
    max_start_failures: int = 3  # consecutive failed starts before queued jobs are failed


@dataclasses.dataclass
class Event:
    """What happened, for the server. kind: ready | progress | chunk | result | error | health | unavailable
    (data: message, and permanent: True when only a `reload` starts the worker again)."""

    kind: str
    job: str | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    worker: int = 0  # which worker of the pool (bridge.workers.worker_pool) it came from


def describe_exit(returncode: int | None) -> str:
    """Why a worker process ended, in words a user can act on."""
    if returncode is None:
        return "worker process closed its pipe"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        reason = f"worker process was killed by {name}"
        if -returncode == signal.SIGKILL:
            reason += " (the kernel's out-of-memory killer sends SIGKILL: check memory budgets)"
        return reason
    return f"worker process exited with status {returncode}"


class WorkerProcess:
    """One child process with non-blocking message pipes.

    The supervisor only uses: pid, send, flush, read, eof, eof_at, fds, wake_at, poll, wait, kill,
    close, exit_reason; `bridge.workers.ray_backend.RayWorkerHandle` is the same thing for a Ray actor.
    """

    exit_reason: str | None = None  # why it ended, when the exit status cannot say (a Ray actor)

    def __init__(self, argv: tuple[str, ...], env: dict[str, str] | None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self.stdout_fd = self.proc.stdout.fileno()
        self.stdin_fd = self.proc.stdin.fileno()
        os.set_blocking(self.stdout_fd, False)
        os.set_blocking(self.stdin_fd, False)
        self.buffer = wp.MessageBuffer()
        self.outbox = bytearray()
        self.eof = False  # stdout closed: the process is ending
        self.eof_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        self.outbox += wp.encode(message)
        self.flush()

    def flush(self) -> None:
        while self.outbox and not self.eof:
            try:
                written = os.write(self.stdin_fd, self.outbox)
            except BlockingIOError:
                return
            except (BrokenPipeError, OSError):
                self.outbox.clear()
                return
            del self.outbox[:written]

    def read(self) -> list[dict[str, Any]]:
        """All complete messages now available; sets `eof` when the pipe closes."""
        messages: list[dict[str, Any]] = []
        while not self.eof:
            try:
                chunk = os.read(self.stdout_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self.eof, self.eof_at = True, time.monotonic()
                break
            messages.extend(self.buffer.feed(chunk))
        return messages

    def fds(self) -> list[tuple[int, bool]]:
        """(fd, also_wants_write) to poll: stdout (and stdin while the outbox is not empty)."""
        if self.eof:
            return []
        return [(self.stdout_fd, False)] + ([(self.stdin_fd, True)] if self.outbox else [])

    def wake_at(self) -> float | None:
        return None  # everything arrives through fds()

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class Supervisor:
    """The worker's lifecycle. States: starting, idle, busy, restarting, stopped, and failed (it
    exited with a configuration error, `wp.CONFIGURATION_EXITS`: not restarted until `reload`).

    `spawn(argv, env)` starts the worker: a local process by default, or a Ray actor
    (`bridge.workers.ray_backend`); `name` labels it in logs and health answers (e.g. "cuda:1").
    """

    def __init__(self, config: SupervisorConfig, spawn: Any = None, name: str = "worker") -> None:
        self.config = config
        self.spawn = spawn or WorkerProcess
        self.name = name
        self.state = "stopped"
        self.worker: WorkerProcess | None = None
        self.info: dict[str, Any] = {}  # the worker's `ready` message
        self.job: str | None = None
        self.restarts = 0
        self.start_failures = 0
        self.last_exit: str | None = None
        self.last_fatal: str | None = None
        self._started_at = 0.0
        self._restart_at: float | None = None
        self._last_heard = 0.0
        self._cancel_deadline: float | None = None
        self._health_deadlines: dict[str, float] = {}
        self._dying_reason: str | None = None  # why we killed it, for the job's error

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn()

    def stop(self, timeout: float = 3.0) -> None:
        """Ask the worker to exit, then kill it; blocking (only used at server shutdown)."""
        worker, self.worker, self.state = self.worker, None, "stopped"
        if worker is None:
            return
        try:
            worker.send({"type": "shutdown"})
            worker.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, OSError):
            worker.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=timeout)
        worker.close()

    def reload(self) -> bool:
        """Start a worker given up on (state "failed": a configuration exit) now, or one waiting out
        its start back-off; True if it was (re)started."""
        if self.state == "failed" or (self.state == "restarting" and self.start_failures):
            self._restart_at, self.start_failures = None, 0
            self.restarts += 1
            self._spawn()
            return True
        return False

    def run_job(self, job: str, message: dict[str, Any], kind: str = "run") -> None:
        """Hand a job to the idle worker. The message is encoded first: if it cannot be (a value
        msgpack cannot carry), wp.WorkerProtocolError is raised and the worker stays idle.
        `kind` "guide": the worker serves another worker's two-GPU job (bridge/workers/worker_pool.py)."""
        if self.state != "idle" or self.worker is None:
            raise RuntimeError(f"run_job while the worker is {self.state}")
        run = {"type": kind, "job": job, **message}
        try:
            wp.encode(run)  # a value msgpack cannot carry fails here, before anything changes
        except (TypeError, ValueError, OverflowError) as exc:  # msgpack's own errors for such values
            raise wp.WorkerProtocolError(f"the job cannot be sent to the worker: {exc}") from None
        self.state, self.job = "busy", job
        self._last_heard = time.monotonic()
        self.worker.send(run)

    def cancel_job(self, job: str) -> None:
        if self.job != job or self.worker is None or self._cancel_deadline is not None:
            return
        self.worker.send({"type": "cancel", "job": job})
        self._cancel_deadline = time.monotonic() + self.config.cancel_grace_s

    def tell_job(self, job: str, message: dict[str, Any]) -> None:
        """Pass a message about its running job to the worker (a live job's `live_poses`)."""
        if self.job == job and self.worker is not None:
            self.worker.send({**message, "job": job})

    def request_health(self, health_id: str) -> bool:
        """Ask the worker; an Event("health") with data {} follows (or its timeout). False: no worker."""
        if self.worker is None or self.worker.eof:
            return False
        self.worker.send({"type": "health", "id": health_id})
        self._health_deadlines[health_id] = time.monotonic() + self.config.health_timeout_s
        return True

    # -- event loop hooks ----------------------------------------------------------------

    def fds(self) -> list[tuple[int, bool]]:
        """(fd, also_wants_write) to poll: the worker's stdout (and stdin while its outbox is full)."""
        if self.worker is None:
            return []
        return self.worker.fds()

    def on_io(self) -> list[Event]:
        worker = self.worker
        if worker is None:
            return []
        worker.flush()
        events: list[Event] = []
        try:
            messages = worker.read()
        except wp.WorkerProtocolError as exc:
            log.error("worker %s wrote garbage on its protocol pipe (%s); killing it", worker.pid, exc)
            self._dying_reason = f"worker wrote an invalid message ({exc})"
            worker.kill()
            messages = []
            worker.eof, worker.eof_at = True, time.monotonic()
        for message in messages:
            self._last_heard = time.monotonic()
            events.extend(self._on_message(message))
        return events

    def next_deadline(self) -> float | None:
        deadlines = list(self._health_deadlines.values())
        if self._restart_at is not None:
            deadlines.append(self._restart_at)
        if self._cancel_deadline is not None:
            deadlines.append(self._cancel_deadline)
        if self.worker is not None:
            wake = self.worker.wake_at()
            if wake is not None:
                deadlines.append(wake)
            if self.worker.eof:
                deadlines.append(time.monotonic() + 0.05)  # poll for its exit
            elif self.state == "starting":
                deadlines.append(self._started_at + self.config.startup_timeout_s)
            elif self.state == "busy":
                deadlines.append(self._last_heard + self.config.stall_timeout_s)
        return min(deadlines) if deadlines else None

    def tick(self) -> list[Event]:
        now = time.monotonic()
        events: list[Event] = []
        for health_id, deadline in list(self._health_deadlines.items()):
            if now >= deadline:
                del self._health_deadlines[health_id]
                events.append(Event("health", data={"id": health_id, "timeout": True}))
        if self._restart_at is not None and now >= self._restart_at:
            self._restart_at = None
            self._spawn()
        worker = self.worker
        if worker is None:
            return events
        if self.state == "starting" and now - self._started_at > self.config.startup_timeout_s:
            self._kill(f"worker did not load its model within {self.config.startup_timeout_s:.0f} s")
        elif self.state == "busy" and now - self._last_heard > self.config.stall_timeout_s:
            self._kill(f"job made no progress for {self.config.stall_timeout_s:.0f} s; worker restarted")
        elif self._cancel_deadline is not None and now >= self._cancel_deadline:
            self._kill(f"worker did not stop within {self.config.cancel_grace_s:.0f} s of the cancel")
        returncode = worker.poll()
        if returncode is None and worker.eof and now - (worker.eof_at or now) > EXIT_GRACE_S:
            worker.kill()
            returncode = worker.wait()
        if returncode is not None:
            events.extend(self.on_io())  # read what it wrote before it died
            events.extend(self._on_exit(returncode))
        return events

    # -- internals -----------------------------------------------------------------------

    def _spawn(self) -> None:
        self.worker = self.spawn(self.config.argv, self.config.env)
        self.worker.send({"type": "load", "options": self.config.options})  # engine options, as data
        self.state, self.info = "starting", {}
        self._started_at = self._last_heard = time.monotonic()
        self._dying_reason = None
        log.info("worker %s started: pid %s: %s", self.name, self.worker.pid, " ".join(self.config.argv))

    def _kill(self, reason: str) -> None:
        log.warning("killing worker %s (pid %s): %s", self.name, self.worker.pid, reason)
        self._dying_reason = reason
        self.worker.kill()

    def _on_message(self, message: dict[str, Any]) -> list[Event]:
        kind = message.get("type")
        if kind == "ready" and self.state == "starting":
            self.state, self.info, self.start_failures = "idle", message, 0
            if self.name.endswith(f":{AUTO_DEVICE}") and message.get("device"):  # the device "auto" took
                self.name = f"{self.name.removesuffix(AUTO_DEVICE)}{message['device']}"
            log.info("worker %s ready: %s", self.name, {k: v for k, v in message.items() if k != "type"})
            return [Event("ready", data=message)]
        if kind == "fatal":
            self.last_fatal = f"{message.get('code', 'fatal')}: {message.get('message', '')}"
            log.error("worker %s cannot start: %s", self.name, self.last_fatal)
            return []
        if kind == "health":
            health_id = str(message.get("id"))
            if self._health_deadlines.pop(health_id, None) is None:
                return []  # answered after its timeout
            return [Event("health", data=message)]
        job = message.get("job")
        if job is None or job != self.job:
            log.warning("worker sent %s for job %r, but its job is %r; ignored", kind, job, self.job)
            return []
        if kind in (
            "progress",
            "chunk",
            "live",
        ):  # chunk: a finished part of the video (model = fast); live: a live job's plan
            return [Event(kind, job, message)]
        if kind in ("result", "error"):
            self.state, self.job, self._cancel_deadline = "idle", None, None
            return [Event(kind, job, message)]
        log.warning("unknown worker message type %r; ignored", kind)
        return []

    def _on_exit(self, returncode: int) -> list[Event]:
        worker = self.worker
        worker.close()
        self.worker = None
        reason = self._dying_reason or worker.exit_reason or describe_exit(returncode)
        self.last_exit = reason
        events: list[Event] = []
        for health_id in list(self._health_deadlines):
            del self._health_deadlines[health_id]
            events.append(Event("health", data={"id": health_id, "timeout": True}))
        if self.state == "busy":
            code = "cancelled" if self._cancel_deadline is not None else "worker_crashed"
            if self._dying_reason and "no progress" in self._dying_reason:
                code = "stalled"
            events.append(Event("error", self.job, {"code": code, "message": reason}))
            log.error("worker %s (pid %s) died during job %s: %s", self.name, worker.pid, self.job, reason)
            delay = self.config.restart_backoff_s[0]
        elif self.state == "starting" and returncode in wp.CONFIGURATION_EXITS:
            # starting it again cannot help (a bad checkpoint, options the engine cannot run, a missing
            # package): no timer; the server says why at once and waits for `reload` (or a restart)
            self.start_failures += 1
            detail = f"{self.last_fatal} ({reason})" if self.last_fatal else reason
            self.last_exit = detail
            log.error("worker %s cannot start: %s, %s; not restarted until a reload", self.name,
                      wp.CONFIGURATION_EXITS[returncode], detail)  # fmt: skip
            self.job, self._cancel_deadline, self.last_fatal = None, None, None
            self.state = "failed"
            message = f"worker cannot start ({wp.CONFIGURATION_EXITS[returncode]}): {detail}"
            return [*events, Event("unavailable", data={"message": message, "permanent": True})]
        elif self.state == "starting":
            self.start_failures += 1
            detail = f"{self.last_fatal} ({reason})" if self.last_fatal else reason
            self.last_exit = detail
            log.error("worker %s failed to start (%d in a row): %s", self.name, self.start_failures, detail)
            if self.start_failures >= self.config.max_start_failures:
                events.append(Event("unavailable", data={"message": f"worker cannot start: {detail}"}))
            low, high = self.config.restart_backoff_s
            delay = min(high, low * 2 ** (self.start_failures - 1))
        else:
            log.error("worker %s (pid %s) died while idle: %s", self.name, worker.pid, reason)
            delay = self.config.restart_backoff_s[0]
        self.job, self._cancel_deadline, self.last_fatal = None, None, None
        self.state = "restarting"
        self.restarts += 1
        self._restart_at = time.monotonic() + delay
        return events

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.worker.pid if self.worker else None,
            "job": self.job,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }
