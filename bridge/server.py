"""The generation server: a ROUTER front end, a fair job queue, a disk spool, a pool of supervised workers.

One thread, one event loop (zguide style): it polls the ROUTER socket and the worker's pipe
together, so a slow or dead worker never stalls the front end, and a flood of clients never
stalls the worker. Every request gets exactly one reply (or an `error`); job events (`progress`,
`result`, `error`) go to every connection subscribed to the job: the one that submitted it and
any that `watch` it later (a client that reconnected, or another process).

Sends never block: a peer that is gone or not reading loses that message (ROUTER_MANDATORY
+ NOBLOCK), and the client's heartbeat (`watch`) fetches the job's state and result again.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from bridge import protocol
from bridge.fair_queue import FairQueue
from bridge.protocol import Limits, Message, ProtocolError
from bridge.security import check_bind_allowed, secure_server_socket
from bridge.server_config import ServerConfig
from bridge.spool import JobRecord, Spool
from bridge.supervisor import Event
from bridge.worker_pool import build_pool
from contracts.provenance import read_record
from contracts.settings import GenerationSettings, SettingsError, load_settings

log = logging.getLogger("bridge.server")

MAX_MESSAGES_PER_WAKEUP = 64  # then look at the worker again: neither side starves the other
CLEANUP_EVERY_S = 60.0


class ListenError(RuntimeError):
    """The server cannot bind its endpoint (address in use, bad endpoint ...)."""


class Server:
    def __init__(self, config: ServerConfig) -> None:
        check_bind_allowed(config.bind, config.security.curve)
        self.config = config
        self.limits: Limits = config.limits
        self.base_settings = load_settings(config.generation_config, config.generation_preset)
        self.spool = Spool(config.spool_dir)
        self.context = zmq.Context()
        self.authenticator = None
        self.socket = self.context.socket(zmq.ROUTER)
        try:
            self._open_socket()
        except BaseException:
            self.close()
            raise
        self.queue = FairQueue()
        self.jobs: dict[str, JobRecord] = {}
        self.by_request: dict[tuple[str, str], str] = {}  # (client, rid) -> job: submit is idempotent
        self.subscribers: dict[str, set[bytes]] = {}
        self.live: dict[str, dict[str, Any]] = {}  # running job -> phase, step, total, eta
        self.sent_positions: dict[str, int] = {}
        self.pending_health: dict[str, tuple[bytes, str, float]] = {}
        self.unavailable: str | None = None
        self.started = time.time()
        self._stop = False
        self._next_cleanup = 0.0
        worker = config.worker
        env = dict(os.environ)
        # The worker imports worldgen from the same tree as this bridge, wherever we were started.
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self.supervisor = build_pool(worker, env)  # one supervised worker per device
        except BaseException:
            self.close()
            raise
        self.recover()

    def _open_socket(self) -> None:
        socket = self.socket
        socket.linger = 0
        socket.router_mandatory = 1  # sends to vanished peers fail fast instead of vanishing
        socket.maxmsgsize = self.limits.max_request_frame_bytes  # ZeroMQ drops larger frames itself
        socket.rcvhwm = 256
        socket.sndhwm = 1024
        socket.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        security = self.config.security
        if security.curve:
            self.authenticator = secure_server_socket(
                self.context, socket, security.server_secret_key, security.client_keys_dir
            )
        try:
            socket.bind(self.config.bind)
        except zmq.ZMQError as exc:
            raise ListenError(f"cannot listen on {self.config.bind}: {exc}") from None
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)

    # ---------------------------------------------------------------------------------------
    # Start-up: rebuild the queue from the spool

    def recover(self) -> None:
        resumed = failed = 0
        for record in self.spool.load_all():
            self.jobs[record.id] = record
            self.by_request[(record.client, record.rid)] = record.id
            if record.state == "running":
                if record.attempts >= self.config.max_attempts:
                    self._finish(
                        record,
                        "failed",
                        {
                            "code": "interrupted",
                            "message": f"the server stopped during this job {record.attempts} times; not retried again",
                        },
                    )
                    failed += 1
                    continue
                record.state = "queued"
                self.spool.save_state(record)
                self.queue.push(record.client, record.id, front=True)
                resumed += 1
            elif record.state == "queued":
                self.queue.push(record.client, record.id)
                resumed += 1
        if resumed or failed:
            log.info("spool: %d job(s) resumed, %d failed as interrupted", resumed, failed)
        self._cleanup()

    # ---------------------------------------------------------------------------------------
    # The loop

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def serve_forever(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        log.info(
            "listening on %s (CurveZMQ %s), spool %s",
            self.endpoint,
            "on" if self.config.security.curve else "off",
            self.spool.root,
        )
        self.supervisor.start()
        try:
            while not self._stop:
                try:
                    self.step()
                except Exception:  # a bug (or a full disk) must not take the server down
                    log.exception("internal error in the event loop; going on")
                    time.sleep(0.1)
        finally:
            self.close()

    def step(self, max_wait_s: float = 0.5) -> None:
        """One turn of the loop: wait for the socket, the worker or a timer, then handle them."""
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        worker_fds = self.supervisor.fds()
        for fd, wants_write in worker_fds:
            poller.register(fd, zmq.POLLOUT if wants_write else zmq.POLLIN)
        wait = max_wait_s
        deadline = self.supervisor.next_deadline()
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        ready = dict(poller.poll(int(wait * 1000)))
        if ready.get(self.socket):
            self._drain_socket()
        if any(fd in ready for fd, _ in worker_fds):
            self._handle_worker_events(self.supervisor.on_io())
        self._handle_worker_events(self.supervisor.tick())
        self._dispatch()
        if time.monotonic() >= self._next_cleanup:
            self._cleanup()

    def close(self) -> None:
        supervisor = getattr(self, "supervisor", None)
        if supervisor is not None:
            supervisor.stop()
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        self.socket.close(linger=0)
        self.context.term()
        self.spool.close()

    def _drain_socket(self) -> None:
        for _ in range(MAX_MESSAGES_PER_WAKEUP):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, body = frames[0].bytes, frames[1:]
            rid = protocol.peek_rid(body[0].buffer, self.limits) if body else None
            try:
                self._handle_request(identity, body)
            except Exception as exc:  # a bug must cost one request, never the server
                log.error("internal error on a request: %s\n%s", exc, traceback.format_exc())
                self._send(identity, protocol.error_frames("internal", f"internal server error: {exc}", rid))

    # ---------------------------------------------------------------------------------------
    # Requests

    def _handle_request(self, identity: bytes, frames: list) -> None:
        try:
            message = protocol.decode_request([f.buffer for f in frames], self.limits)
        except ProtocolError as exc:
            rid = protocol.peek_rid(frames[0].buffer, self.limits) if frames else None
            log.info("refused a malformed request (%s): %s", exc.code, exc)
            self._send(identity, protocol.error_frames(exc.code, str(exc), rid))
            return
        handler = getattr(self, f"_on_{message.type}")
        handler(identity, message)

    def _on_submit(self, identity: bytes, message: Message) -> None:
        rid = message.fields["rid"]
        client = message.get("client") or f"conn-{identity.hex()}"
        existing = self.by_request.get((client, rid))
        if existing is not None and existing in self.jobs:  # a retry of a submit we already took
            record = self.jobs[existing]
            self._reply_accepted(identity, rid, record)
            if record.state in protocol.TERMINAL_STATES:
                self._send_outcome(record, [identity])
            else:
                self.subscribers.setdefault(existing, set()).add(identity)
            return
        try:
            image = message.blobs["image"]
            protocol.image_format(image)
            poses, intrinsics = message.arrays["poses"], message.arrays["intrinsics"]
            protocol.check_episode_arrays(poses, intrinsics)
            settings = self._job_settings(message.get("settings") or {})
        except ProtocolError as exc:
            self._send(identity, protocol.error_frames(exc.code, str(exc), rid))
            return
        if self.unavailable:
            self._send(identity, protocol.error_frames("unavailable", self.unavailable, rid))
            return
        if len(self.queue) >= self.config.max_queue:
            self._send(
                identity,
                protocol.error_frames(
                    "busy", f"the queue is full ({len(self.queue)} jobs waiting); try again later", rid
                ),
            )
            return
        if self.queue.count(client) >= self.config.max_queue_per_client:
            self._send(
                identity,
                protocol.error_frames(
                    "busy",
                    f"you already have {self.queue.count(client)} jobs waiting (the per-client cap); "
                    "wait for one to finish",
                    rid,
                ),
            )
            return
        try:
            record = self.spool.accept(
                client=client,
                rid=rid,
                prompt=message.fields["prompt"],
                image=image,
                poses=poses,
                intrinsics=intrinsics,
                settings=settings.to_dict(),
                want_frames=bool(message.get("want_frames", False)),
                name=message.get("name"),
            )
        except OSError as exc:
            log.error("cannot spool a job: %s", exc)
            self._send(identity, protocol.error_frames("internal", f"server cannot store the job: {exc}", rid))
            return
        self.jobs[record.id] = record
        self.by_request[(client, rid)] = record.id
        self.subscribers[record.id] = {identity}
        self.queue.push(client, record.id)
        log.info("job %s accepted from %s (%d waiting)", record.id, client, len(self.queue))
        self._reply_accepted(identity, rid, record)
        self._dispatch()

    def _job_settings(self, requested: dict[str, Any]) -> GenerationSettings:
        try:
            settings = GenerationSettings.from_dict({**self.base_settings.to_dict(), **requested})
        except (SettingsError, TypeError, OverflowError) as exc:
            raise ProtocolError(f"settings: {exc}", "bad_settings") from None
        numbers = (settings.shift, settings.boundary, *settings.guide_scale)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers):
            raise ProtocolError("settings: shift, boundary and guide_scale must be finite numbers", "bad_settings")
        limits = self.limits
        if settings.frame_num > limits.max_frame_num:
            raise ProtocolError(
                f"settings: frame_num {settings.frame_num} > the server's cap {limits.max_frame_num}",
                "bad_settings",
            )
        if settings.steps > limits.max_steps:
            raise ProtocolError(
                f"settings: steps {settings.steps} > the server's cap {limits.max_steps}", "bad_settings"
            )
        if settings.max_area > limits.max_area:
            raise ProtocolError(
                f"settings: size {settings.size} is above the server's cap of {limits.max_area} pixels",
                "bad_settings",
            )
        return settings

    def _reply_accepted(self, identity: bytes, rid: str, record: JobRecord) -> None:
        fields = {"rid": rid, "job": record.id, "queue_position": self._jobs_ahead(record.id)}
        self._send(identity, protocol.encode("accepted", fields))
        if record.state == "queued":
            self.sent_positions[record.id] = fields["queue_position"]

    def _on_cancel(self, identity: bytes, message: Message) -> None:
        record = self._lookup(identity, message)
        if record is None:
            return
        if record.state == "queued":
            self.queue.remove(record.id)
            self._finish(record, "cancelled", {"code": "cancelled", "message": "cancelled while queued"})
            self._broadcast_positions()
        elif record.state == "running":
            self.supervisor.cancel_job(record.id)
            self.live.setdefault(record.id, {})["cancelling"] = True
        self._reply_status(identity, message.fields["rid"], record)

    def _on_status(self, identity: bytes, message: Message) -> None:
        record = self._lookup(identity, message)
        if record is not None:
            self._reply_status(identity, message.fields["rid"], record)

    def _on_watch(self, identity: bytes, message: Message) -> None:
        """Subscribe this connection to a job's events; a finished job's outcome is sent again."""
        record = self._lookup(identity, message)
        if record is None:
            return
        self._reply_status(identity, message.fields["rid"], record)
        if record.state in protocol.TERMINAL_STATES:
            self._send_outcome(record, [identity])
        else:
            self.subscribers.setdefault(record.id, set()).add(identity)

    def _on_health(self, identity: bytes, message: Message) -> None:
        rid = message.fields["rid"]
        health_id = uuid.uuid4().hex
        if self.supervisor.request_health(health_id):
            self.pending_health[health_id] = (identity, rid, time.monotonic())
        else:
            self._reply_health(identity, rid, None, None)

    def _lookup(self, identity: bytes, message: Message) -> JobRecord | None:
        record = self.jobs.get(message.fields["job"])
        if record is None:
            self._send(
                identity,
                protocol.error_frames(
                    "not_found",
                    f"no job {message.fields['job']!r} on this server (finished jobs are kept "
                    f"{self.config.result_ttl_s / 3600:g} h)",
                    message.fields["rid"],
                    message.fields["job"],
                ),
            )
        return record

    def _reply_status(self, identity: bytes, rid: str, record: JobRecord) -> None:
        fields: dict[str, Any] = {"rid": rid, "job": record.id, "state": record.state}
        if record.state == "queued":
            fields["queue_position"] = self._jobs_ahead(record.id)
        live = self.live.get(record.id)
        if record.state == "running" and live:
            fields.update(
                {k: live[k] for k in ("phase", "step", "total", "eta_s", "cancelling") if live.get(k) is not None}
            )
        if record.error:
            fields["error"] = record.error
        self._send(identity, protocol.encode("status", fields))

    def _reply_health(
        self, identity: bytes, rid: str, answers: list[dict | None] | None, asked_at: float | None
    ) -> None:
        """`workers`: every worker of the pool; `worker` (the first) and `gpu`/`memory` (its
        report) stay for one-worker clients. ok: every worker answered and is idle or busy."""
        supervisor = self.supervisor
        workers = supervisor.status()
        for index, worker in enumerate(workers):
            answer = answers[index] if answers else None
            if answer is not None:
                worker["answer_s"] = round(time.monotonic() - asked_at, 4)
                worker["reported"] = {k: v for k, v in answer.items() if k not in ("type", "id")}
            elif asked_at is not None:
                worker["error"] = f"the worker did not answer within {supervisor.config.health_timeout_s:g} s"
        ok = not self.unavailable and all(w.get("reported", {}).get("state") in ("idle", "busy") for w in workers)
        reported = workers[0].get("reported", {})
        info = supervisor.info
        running = supervisor.jobs
        fields = {
            "rid": rid,
            "ok": ok,
            "protocol": protocol.PROTOCOL_VERSION,
            "model": {k: info[k] for k in ("model", "device", "dtype", "load_s") if k in info},
            "gpu": reported.get("gpu"),
            "memory": reported.get("memory"),
            "queue": {
                "waiting": len(self.queue),
                "running": running[0] if running else None,
                "running_jobs": running,
                "max_queue": self.config.max_queue,
                "max_queue_per_client": self.config.max_queue_per_client,
            },
            "worker": workers[0],
            "workers": workers,
            "server": {
                "pid": os.getpid(),
                "endpoint": self.endpoint,
                "curve": self.config.security.curve,
                "uptime_s": round(time.time() - self.started, 1),
                "unavailable": self.unavailable,
            },
        }
        self._send(identity, protocol.encode("health", fields))

    # ---------------------------------------------------------------------------------------
    # The worker

    def _dispatch(self) -> None:
        while self.supervisor.idle() and len(self.queue):
            self._start_next()

    def _start_next(self) -> None:
        job_id = self.queue.pop()
        record = self.jobs[job_id]
        record.state, record.started = "running", time.time()
        record.attempts += 1
        record.error = None
        self.spool.save_state(record)
        self.sent_positions.pop(job_id, None)
        self.live[job_id] = {"phase": "starting", "step": 0, "total": 0}
        worker = self.supervisor.run_job(
            job_id,
            {
                "episode_dir": str(record.episode_dir),
                "output": str(record.result_path),
                "settings": record.settings,
                "want_frames": record.want_frames,
                "frames_output": str(record.frames_path) if record.want_frames else None,
            },
        )
        log.info("job %s started on worker %d (attempt %d)", job_id, worker, record.attempts)
        self._publish(job_id, protocol.encode("progress", {"job": job_id, "phase": "starting", "step": 0, "total": 0}))
        self._broadcast_positions()

    def _handle_worker_events(self, events: list[Event]) -> None:
        for event in events:
            try:
                getattr(self, f"_worker_{event.kind}")(event)
            except Exception as exc:
                log.error("internal error on worker event %s: %s\n%s", event.kind, exc, traceback.format_exc())

    def _worker_ready(self, event: Event) -> None:
        if self.unavailable:
            log.info("worker is available again")
        self.unavailable = None

    def _worker_unavailable(self, event: Event) -> None:
        self.unavailable = event.data["message"]
        for job_id in self.queue.order():
            self.queue.remove(job_id)
            self._finish(self.jobs[job_id], "failed", {"code": "unavailable", "message": self.unavailable})
        self.sent_positions.clear()

    def _worker_progress(self, event: Event) -> None:
        data = event.data
        live = self.live.setdefault(event.job, {})
        now = time.monotonic()
        phase, step, total = (
            str(data.get("phase", ""))[:64],
            _count(data.get("step")),
            _count(data.get("total")),
        )
        if phase == "denoise":
            # ETA from the measured pace of the denoising steps (they dominate the job's time).
            if live.get("phase") != "denoise":
                live["denoise_t0"], live["denoise_step0"] = now, step
            done = step - live["denoise_step0"]
            if done > 0 and total >= step:
                live["eta_s"] = round((now - live["denoise_t0"]) / done * (total - step), 2)
        else:
            live["eta_s"] = None
        live.update(phase=phase, step=step, total=total)
        fields = {"job": event.job, "phase": phase, "step": step, "total": total}
        if live.get("eta_s") is not None:
            fields["eta_s"] = live["eta_s"]
        self._publish(event.job, protocol.encode("progress", fields))

    def _worker_result(self, event: Event) -> None:
        record = self.jobs[event.job]
        if not record.result_path.is_file():
            self._finish(
                record,
                "failed",
                {"code": "internal", "message": "the worker reported a result, but result.mp4 is missing"},
            )
            return
        self._finish(record, "done", None)

    def _worker_error(self, event: Event) -> None:
        record = self.jobs.get(event.job)
        if record is None:
            return
        code = str(event.data.get("code", "worker_error"))
        if code not in protocol.ERROR_CODES:
            code = "worker_error"
        if code == "worker_crashed" and self._retry_crashed(record, str(event.data.get("message", ""))):
            return
        state = "cancelled" if code == "cancelled" else "failed"
        self._finish(record, state, {"code": code, "message": str(event.data.get("message", ""))[:2000]})

    def _retry_crashed(self, record: JobRecord, reason: str) -> bool:
        """[worker] retry_crashed: put a job whose worker died back at the front of the queue
        (any worker may take it), until it has been started max_attempts times."""
        if not self.config.worker.retry_crashed or record.attempts >= self.config.max_attempts:
            return False
        log.warning("job %s: its worker died (%s); running it again (attempt %d of %d)",
                    record.id, reason, record.attempts + 1, self.config.max_attempts)  # fmt: skip
        record.state = "queued"
        self.spool.save_state(record)
        self.live.pop(record.id, None)
        self.queue.push(record.client, record.id, front=True)
        self._broadcast_positions()
        return True

    def _worker_health(self, event: Event) -> None:
        pending = self.pending_health.pop(str(event.data.get("id")), None)
        if pending is None:
            return
        identity, rid, asked_at = pending
        self._reply_health(identity, rid, event.data.get("workers"), asked_at)

    # ---------------------------------------------------------------------------------------
    # Job outcomes and events

    def _finish(self, record: JobRecord, state: str, error: dict[str, str] | None) -> None:
        record.state, record.error, record.finished = state, error, time.time()
        self.spool.save_state(record)
        self.live.pop(record.id, None)
        self.sent_positions.pop(record.id, None)
        log.info("job %s %s%s", record.id, state, f": {error['code']}: {error['message']}" if error else "")
        self._send_outcome(record, list(self.subscribers.pop(record.id, ())))

    def _send_outcome(self, record: JobRecord, identities: list[bytes]) -> None:
        if not identities:
            return
        if record.state == "done":
            try:
                frames = self._result_frames(record)
            except (OSError, ValueError) as exc:
                frames = protocol.error_frames("internal", f"cannot read the result: {exc}", job=record.id)
        else:
            error = record.error or {"code": "internal", "message": "failed without a reason"}
            frames = protocol.error_frames(error["code"], error["message"], job=record.id)
        for identity in identities:
            self._send(identity, frames)

    def _result_frames(self, record: JobRecord) -> list:
        video = record.result_path.read_bytes()
        arrays = {}
        if record.want_frames and record.frames_path.is_file():
            arrays["frames"] = np.load(record.frames_path, mmap_mode="r", allow_pickle=False)
        seconds = (record.finished or 0) - (record.started or 0)
        fields: dict[str, Any] = {"job": record.id, "seconds": round(seconds, 3)}
        provenance, note = read_record(record.result_path)  # the worker's record beside result.mp4
        if provenance is not None:
            fields["provenance"] = provenance
        elif note:
            log.warning("job %s: %s", record.id, note)
        return protocol.encode("result", fields, arrays, {"video": video})

    def _publish(self, job_id: str, frames: list) -> None:
        for identity in list(self.subscribers.get(job_id, ())):
            self._send(identity, frames)

    def _jobs_ahead(self, job_id: str) -> int:
        running = len(self.supervisor.jobs)
        return running + self.queue.positions().get(job_id, 0)

    def _broadcast_positions(self) -> None:
        running = len(self.supervisor.jobs)
        for job_id, position in self.queue.positions().items():
            ahead = running + position
            if self.sent_positions.get(job_id) != ahead:
                self.sent_positions[job_id] = ahead
                fields = {"job": job_id, "phase": "queued", "step": 0, "total": 0, "queue_position": ahead}
                self._publish(job_id, protocol.encode("progress", fields))

    def _send(self, identity: bytes, frames: list) -> None:
        try:
            self.socket.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.debug("client %s is not reading; message dropped", identity.hex())
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            for subscribers in self.subscribers.values():  # that connection is gone
                subscribers.discard(identity)

    def _cleanup(self) -> None:
        """Forget finished jobs older than result_ttl_s (and delete their folders)."""
        self._next_cleanup = time.monotonic() + CLEANUP_EVERY_S
        cutoff = time.time() - self.config.result_ttl_s
        for record in list(self.jobs.values()):
            if record.state in protocol.TERMINAL_STATES and (record.finished or 0) < cutoff:
                self.spool.remove(record)
                del self.jobs[record.id]
                self.by_request.pop((record.client, record.rid), None)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else 0
