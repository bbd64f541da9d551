"""A pool of warm generation workers behind one server: one supervised worker per device.

`[worker] devices = ["cuda:0", "cuda:1"]` starts one `python -m worldgen.worker` per GPU (each
holds its own model, warm); `backend = "ray"` makes each worker a Ray actor instead
(`bridge.workers.ray_backend`). Every worker has its own `Supervisor`, so a worker that dies costs only
the job it was running (failed with the reason, or retried: `[worker] retry_crashed`) while the
others keep serving, and it is restarted on its own.

The pool looks like one supervisor to the server's event loop (fds, on_io, tick, next_deadline),
plus what a pool adds: `idle()` to see whether a job can start, `run_job` to start it on an idle
worker, `worker_of(job)`, and health answers gathered from every worker into one event.

A job that asks for two GPUs (setting `gpus = 2`) runs on two idle workers at once: the first runs
the job as always, the second serves its classifier-free guidance's unconditional passes
(`worldgen.pipelines.multi_gpu`: the first worker's `PeerDevice` talks to the second's `serve_guidance` over a
Unix socket; the latent goes over and the prediction comes back, once per step). Why two workers
and not one worker reloaded with the two-device pipeline: every worker already holds its experts
warm on its own GPU, so pairing two of them loads nothing, keeps exactly one copy of the experts
per GPU (a worker that also held copies on the other GPU would need both GPUs' memory twice over),
and both go back to single jobs the moment the pair ends; the exchange is 2 x 8.4 MB per step at
480p (milliseconds beside a forward of seconds). The pool reserves both for the job; each is free again
when its part ends (the second after the last denoising step: the first decodes alone). The job's
outcome is its first worker's, held back until the second one has ended too; if the second worker
died, the outcome says so (`worker_crashed`, its reason) and `[worker] retry_crashed` applies as
to any crashed job.

Fair order and no starvation: the server never lets a job pass the one at the head of the fair
queue. A two-GPU job at the head waits until two workers are idle (`hold`: health shows the idle
worker held for it); jobs behind it wait too, so it starts as soon as the first running job
ends, never later. The cost is that one GPU may idle for that long. A pool that cannot give two
workers refuses such jobs at submit (`refusal`): one worker on one device, or the Ray backend
(its actors may sit on different machines, with no socket between them).
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from bridge.workers.supervisor import Event, Supervisor, SupervisorConfig
from bridge.workers.worker_config import WorkerConfig

log = logging.getLogger("bridge.workers.worker_pool")


class WorkerPool:
    def __init__(self, supervisors: list[Supervisor], backend: str = "local") -> None:
        if not supervisors:
            raise ValueError("a worker pool needs at least one worker")
        self.supervisors = supervisors
        self.config = supervisors[0].config
        self.backend = backend
        self._unavailable: dict[int, str] = {}
        self._health: dict[str, dict[str, Any]] = {}  # health id -> {"answers": [...], "waiting": set}
        self._next = 0  # round-robin start for picking an idle worker
        self._pairs: dict[str, tuple[int, int]] = {}  # two-GPU job -> (its worker, its second worker)
        self._ended: dict[str, dict[str, Event]] = {}  # two-GPU job -> the outcome of each that has ended
        self.held_for: str | None = None  # the two-GPU job at the head of the queue, waiting for a 2nd worker

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        for supervisor in self.supervisors:
            supervisor.start()

    def stop(self) -> None:
        for supervisor in self.supervisors:
            supervisor.stop()

    def reload(self) -> int:
        """Start again every worker given up on (a configuration error, or failed starts in a row);
        -> how many were started. They count as serving until they fail again."""
        restarted = [i for i, s in enumerate(self.supervisors) if s.reload()]
        for index in restarted:
            self._unavailable.pop(index, None)
        return len(restarted)

    def idle(self) -> bool:
        """True if some worker can take a job now."""
        return self.idle_count() > 0

    def idle_count(self) -> int:
        return sum(s.state == "idle" for s in self.supervisors)

    def capacity(self) -> int:
        """Workers that serve or will again (not those given up on after failing to start)."""
        return len(self.supervisors) - len(self._unavailable)

    def workers_for(self, gpus: int) -> int:
        """Workers a job of `gpus` GPUs takes: one, unless it asks for more GPUs than one worker's
        engine spans (a worker started with `gpus = "0,1"` runs every rollout on two GPUs alone)."""
        per_worker = len(self.config.options.get("devices") or ("",))
        return 1 if gpus <= per_worker else 2

    def refusal(self, gpus: int, model: str = "base") -> str | None:
        """Why this pool can never run a job of `gpus` GPUs of `model` (None: it can). A causal job (model
        fast or causal) splits each chunk forward over the GPUs of one worker (`worldgen.pipelines.two_gpu`):
        two workers cannot share it."""
        if self.workers_for(gpus) == 1:
            return None
        if model != "base":
            return (f"gpus {gpus} with model {model} splits each chunk over the two GPUs of one worker, and this "
                    "server's workers have one device each: use gpus 1, or start the server with one worker on "
                    "two GPUs ([worker] gpus = \"0,1\" or serve --gpus 0,1)")  # fmt: skip
        if self.backend == "ray":
            return (f"gpus {gpus} needs two workers of one machine, and the Ray backend's actors may be on "
                    "different machines: use gpus 1, or a local pool ([worker] backend = \"local\", devices)")  # fmt: skip
        if len(self.supervisors) < 2:
            return (f"gpus {gpus} needs two GPUs, and this server has one worker on one device "
                    f"({self.supervisors[0].name}): use gpus 1, or start the server with two devices "
                    "([worker] devices = [\"cuda:0\", \"cuda:1\"] or serve --devices cuda:0,cuda:1)")  # fmt: skip
        return None

    def fp8_unsupported(self) -> str | None:
        """Why a job's `compute = "fp8"` cannot run here, as a ready worker reported it (None: every
        worker that is ready can, or none has said yet)."""
        return next((s.info["fp8_unsupported"] for s in self.supervisors if s.info.get("fp8_unsupported")), None)

    def run_job(self, job: str, message: dict[str, Any], workers: int = 1) -> int:
        """Start `job` on idle workers (they take turns): one, or two for a two-GPU job (the second
        serves its unconditional passes); returns the index of the worker that runs it."""
        count = len(self.supervisors)
        order = [(self._next + offset) % count for offset in range(count)]
        idle = [i for i in order if self.supervisors[i].state == "idle"]
        if len(idle) < workers:
            raise RuntimeError(f"run_job needs {workers} idle worker(s), {len(idle)} idle")
        if workers == 1:
            index = idle[0]
            self.supervisors[index].run_job(job, message)
            self._next = index + 1
            return index
        first, second = idle[:2]
        helper = self.supervisors[second]
        address = f"\0lingbot-isaac/guidance/{os.getpid()}/{secrets.token_hex(8)}"  # Linux abstract socket
        token = secrets.token_hex(16)  # abstract sockets are listed in /proc/net/unix: the peer proves itself
        device = (helper.config.options.get("devices") or ["cpu"])[0]
        peer = {"address": address, "token": token, "device": device, "name": helper.name}
        self.supervisors[first].run_job(job, {**message, "peer": peer})  # raises before anything changed
        helper.run_job(job, {"address": address, "token": token}, kind="guide")
        self._pairs[job], self._ended[job] = (first, second), {}
        self._next = second + 1
        self.held_for = None
        log.info("job %s: two GPUs: runs on worker %s, unconditional passes on %s", job,
                 self.supervisors[first].name, helper.name)  # fmt: skip
        return first

    def hold(self, job: str | None) -> None:
        """The two-GPU job at the head of the queue waits for a second idle worker (None: none waits)."""
        self.held_for = job

    def cancel_job(self, job: str) -> None:
        index = self.worker_of(job)  # a two-GPU job: its worker; the second one ends when it does
        if index is not None:
            self.supervisors[index].cancel_job(job)

    def tell_job(self, job: str, message: dict[str, Any]) -> None:
        """A message about a running job to its worker (a live job's `live_poses`)."""
        index = self.worker_of(job)
        if index is not None:
            self.supervisors[index].tell_job(job, message)

    def worker_of(self, job: str) -> int | None:
        if job in self._pairs:
            return self._pairs[job][0]
        return next((i for i, s in enumerate(self.supervisors) if s.job == job), None)

    @property
    def jobs(self) -> list[str]:
        """The running jobs, in worker order (a two-GPU job once)."""
        return list(dict.fromkeys(s.job for s in self.supervisors if s.job is not None))

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
        """Each worker's status, with `reserved_for` (the job it is held for, or None) and `role`:
        job (runs it), two-GPU job (runs it, a second worker beside it), second GPU (that job's
        unconditional passes), held (idle, kept for the two-GPU job at the head of the queue)."""
        roles = {}
        for job, (first, second) in self._pairs.items():
            roles[first], roles[second] = (job, "two-GPU job"), (job, "second GPU")
        out = []
        for index, supervisor in enumerate(self.supervisors):
            status = {**supervisor.status(), "unavailable": self._unavailable.get(index)}
            job, role = supervisor.job, "job" if supervisor.job else None
            if index in roles and roles[index][0] == job:  # (a worker whose part has ended runs other jobs)
                job, role = roles[index]
            if role is None and self.held_for and supervisor.state == "idle":
                job, role = self.held_for, "held"
            status.update(reserved_for=job, role=role)
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
                if event.job in self._pairs and event.kind in ("progress", "chunk", "result", "error"):
                    out.extend(self._pair_event(index, event))
                elif event.kind == "health":
                    out.extend(self._health_answer(index, event))
                elif event.kind == "unavailable":
                    self._unavailable[index] = event.data["message"]
                    if len(self._unavailable) == len(self.supervisors):  # no worker left to serve
                        reasons = "; ".join(
                            f"{self.supervisors[i].name}: {m}" for i, m in sorted(self._unavailable.items())
                        )
                        permanent = all(s.state == "failed" for s in self.supervisors)  # only `reload` helps
                        out.append(Event("unavailable", data={"message": reasons, "permanent": permanent},
                                         worker=index))  # fmt: skip
                elif event.kind == "ready":
                    self._unavailable.pop(index, None)
                    out.append(event)
                else:
                    out.append(event)
        return out

    def _pair_event(self, index: int, event: Event) -> list[Event]:
        """An event of a two-GPU job: the first worker's progress passes; the outcome waits until both
        have ended (then both are free again); the second worker's own events are not the job's."""
        job = event.job
        first, second = self._pairs[job]
        if event.kind in ("progress", "chunk"):
            return [event] if index == first else []
        if index not in (first, second):
            return []
        ended = self._ended[job]
        ended["first" if index == first else "second"] = event
        if "second" not in ended:
            # the job is over (done, failed, or its worker died): a second worker still waiting for
            # it to connect stops now (a connected one has already seen the connection close). Sent
            # as a bare message: the supervisor's own cancel would count a death now as "cancelled".
            helper = self.supervisors[second]
            if helper.job == job and helper.worker is not None:
                helper.worker.send({"type": "cancel", "job": job})
            return []
        if "first" not in ended:
            return []  # the job's own worker ends next: it lost its peer, or finishes its last step
        del self._pairs[job], self._ended[job]
        outcome, helper = ended["first"], ended["second"]
        if outcome.kind == "error" and helper.data.get("code") == "worker_crashed":
            name = self.supervisors[second].name
            outcome.data = {"code": "worker_crashed",
                            "message": f"the second worker of this two-GPU job ({name}) died: {helper.data.get('message')}"
                                       f" (the job's worker: {outcome.data.get('message')})"}  # fmt: skip
        return [outcome]

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
        from bridge.workers.ray_backend import ray_spawners  # raises a clear error without Ray

        spawners = ray_spawners(worker, devices)
        return WorkerPool(
            [
                Supervisor(
                    SupervisorConfig(argv=worker.argv(), options=options.to_dict(), **supervisor_config),
                    spawn=spawn,
                    name=name,
                )
                for name, options, spawn in spawners
            ],
            backend="ray",
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
