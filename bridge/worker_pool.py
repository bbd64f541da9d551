"""A pool of warm generation workers behind one server: one supervised worker per device.

`[worker] devices = ["cuda:0", "cuda:1"]` starts one `python -m worldgen.worker` per GPU (each
holds its own model, warm); `backend = "ray"` makes each worker a Ray actor instead
(`bridge.ray_backend`). Every worker has its own `Supervisor`, so a worker that dies costs only
the job it was running (failed with the reason, or retried: `[worker] retry_crashed`) while the
others keep serving, and it is restarted on its own.

The pool looks like one supervisor to the server's event loop (fds, on_io, tick, next_deadline),
plus what a pool adds: `idle()` to see whether a job can start, `run_job` to start it on an idle
worker, `worker_of(job)`, and health answers gathered from every worker into one event.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from bridge.server_config import WorkerConfig
from bridge.supervisor import Event, Supervisor, SupervisorConfig

log = logging.getLogger("bridge.worker_pool")


class WorkerPool:
    def __init__(self, supervisors: list[Supervisor]) -> None:
        if not supervisors:
            raise ValueError("a worker pool needs at least one worker")
        self.supervisors = supervisors
        self.config = supervisors[0].config
        self._unavailable: dict[int, str] = {}
        self._health: dict[str, dict[str, Any]] = {}  # health id -> {"answers": [...], "waiting": set}
        self._next = 0  # round-robin start for picking an idle worker

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        for supervisor in self.supervisors:
            supervisor.start()

    def stop(self) -> None:
        for supervisor in self.supervisors:
            supervisor.stop()

    def idle(self) -> bool:
        """True if some worker can take a job now."""
        return any(s.state == "idle" for s in self.supervisors)

    def run_job(self, job: str, message: dict[str, Any]) -> int:
        """Start `job` on an idle worker (they take turns); returns the worker's index."""
        count = len(self.supervisors)
        for offset in range(count):
            index = (self._next + offset) % count
            if self.supervisors[index].state == "idle":
                self._next = index + 1
                self.supervisors[index].run_job(job, message)
                return index
        raise RuntimeError("run_job with no idle worker")

    def cancel_job(self, job: str) -> None:
        index = self.worker_of(job)
        if index is not None:
            self.supervisors[index].cancel_job(job)

    def worker_of(self, job: str) -> int | None:
        return next((i for i, s in enumerate(self.supervisors) if s.job == job), None)

    @property
    def jobs(self) -> list[str]:
        """The running jobs, in worker order."""
        return [s.job for s in self.supervisors if s.job is not None]

    @property
    def info(self) -> dict[str, Any]:
        """The `ready` message of the first worker that has one (model, device, dtype, load_s)."""
        return next((s.info for s in self.supervisors if s.info), {})

    def request_health(self, health_id: str) -> bool:
        """Ask every worker; one Event("health", data={"id", "workers": [answer | None, ...]}) follows
        once each has answered or timed out. False: no worker could be asked at all."""
        answers: list[dict[str, Any] | None] = [None] * len(self.supervisors)
        waiting = {i for i, s in enumerate(self.supervisors) if s.request_health(f"{health_id}#{i}")}
        if not waiting:
            return False
        self._health[health_id] = {"answers": answers, "waiting": waiting}
        return True

    def status(self) -> list[dict[str, Any]]:
        out = []
        for index, supervisor in enumerate(self.supervisors):
            status = {**supervisor.status(), "unavailable": self._unavailable.get(index)}
            if hasattr(supervisor.worker, "actor"):
                status["actor"] = supervisor.worker.name  # a Ray actor: ray.get_actor(name, "lingbot-isaac")
            out.append(status)
        return out

    # -- event loop hooks ----------------------------------------------------------------

    def fds(self) -> list[tuple[int, bool]]:
        return [fd for s in self.supervisors for fd in s.fds()]

    def on_io(self) -> list[Event]:
        return self._events([s.on_io() for s in self.supervisors])

    def tick(self) -> list[Event]:
        # A worker with nothing to poll (a Ray actor) is read here, on every turn of the loop.
        return self._events([(s.on_io() if s.worker is not None and not s.worker.fds() else []) + s.tick()
                             for s in self.supervisors])  # fmt: skip

    def next_deadline(self) -> float | None:
        deadlines = [d for s in self.supervisors if (d := s.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def _events(self, per_worker: list[list[Event]]) -> list[Event]:
        out: list[Event] = []
        for index, events in enumerate(per_worker):
            for event in events:
                event.worker = index
                if event.kind == "health":
                    out.extend(self._health_answer(index, event))
                elif event.kind == "unavailable":
                    self._unavailable[index] = event.data["message"]
                    if len(self._unavailable) == len(self.supervisors):  # no worker left to serve
                        reasons = "; ".join(
                            f"{self.supervisors[i].name}: {m}" for i, m in sorted(self._unavailable.items())
                        )
                        out.append(Event("unavailable", data={"message": reasons}, worker=index))
                elif event.kind == "ready":
                    self._unavailable.pop(index, None)
                    out.append(event)
                else:
                    out.append(event)
        return out

    def _health_answer(self, index: int, event: Event) -> list[Event]:
        health_id, _, part = str(event.data.get("id")).rpartition("#")
        pending = self._health.get(health_id)
        if pending is None or part != str(index) or index not in pending["waiting"]:
            return []
        pending["waiting"].discard(index)
        if not event.data.get("timeout"):
            pending["answers"][index] = event.data
        if pending["waiting"]:
            return []
        del self._health[health_id]
        return [Event("health", data={"id": health_id, "workers": pending["answers"]})]


def cpu_threads(devices: tuple[str, ...]) -> int | None:
    """Threads for each CPU worker: the cores shared out, so two CPU workers do not fight over
    the same cores (None: a single CPU worker keeps torch's own choice)."""
    cpu_workers = sum(1 for d in devices if d == "cpu")
    if cpu_workers < 2:
        return None
    return max(1, (os.cpu_count() or 1) // cpu_workers)


def build_pool(worker: WorkerConfig, env: dict[str, str]) -> WorkerPool:
    """The server's workers, as configured by [worker]."""
    devices = worker.pool_devices()
    supervisor_config = dict(
        env=env,
        startup_timeout_s=worker.startup_timeout_s,
        health_timeout_s=worker.health_timeout_s,
        cancel_grace_s=worker.cancel_grace_s,
        stall_timeout_s=worker.stall_timeout_s,
        restart_backoff_s=worker.restart_backoff_s,
        max_start_failures=worker.max_start_failures,
    )
    if worker.backend == "ray":
        from bridge.ray_backend import ray_spawners  # raises a clear error without Ray

        spawners = ray_spawners(worker, devices)
        return WorkerPool(
            [
                Supervisor(
                    SupervisorConfig(argv=worker.argv(), options=options.to_dict(), **supervisor_config),
                    spawn=spawn,
                    name=name,
                )
                for name, options, spawn in spawners
            ]
        )
    threads = cpu_threads(devices)
    supervisors = []
    for index, device in enumerate(devices):
        device_env = dict(env)
        if device == "cpu" and threads is not None:
            device_env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        name = f"{index}:{device}"
        supervisors.append(
            Supervisor(
                SupervisorConfig(
                    argv=worker.argv(),
                    options=worker.options_for(device).to_dict(),
                    **{**supervisor_config, "env": device_env},
                ),
                name=name,
            )
        )
    return WorkerPool(supervisors)
