"""The generation server: a ROUTER front end, a fair job queue, a disk spool, a pool of supervised workers.

One thread, one event loop (zguide style): it polls the ROUTER socket and the worker's pipe
together, so a slow or dead worker never stalls the front end, and a flood of clients never
stalls the worker. Every request gets exactly one reply (or an `error`); job events (`progress`,
`result`, `error`) go to every connection subscribed to the job: the one that submitted it and
any that `watch` it later (a client that reconnected, or another process).

Each job is one `bridge.jobs.Job` in `self.jobs` (its request, its state, its subscribers, its
progress); `by_request` is only an index for de-duplicating retried submits. A job is "running"
only once the worker has its `run` message; any spool write error requeues or fails the job it
concerns, marks the spool not writable (health, `storage` answers) and is retried every loop
turn, so the server recovers by itself when space returns.

Identity: with CurveZMQ a client is its authenticated public key; without, its connection (the
ROUTER routing id). A `client` field in a message is only a label. Fair queueing, quotas and
submit de-duplication are per identity; a job's id is its access token (status, watch, cancel).

Sends never block: a peer that is gone or not reading loses that message (ROUTER_MANDATORY
+ NOBLOCK), and the client's heartbeat (`watch`) fetches the job's state and result again.
"""

from __future__ import annotations

import contextlib
import logging
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
from bridge import worker_protocol as wp
from bridge.fair_queue import FairQueue
from bridge.jobs import Job
from bridge.mp4 import IncompleteVideo, check_complete
from bridge.protocol import Health, JobRequest, Limits, ProtocolError, Submit
from bridge.security import check_bind_allowed, secure_server_socket
from bridge.server_config import ServerConfig
from bridge.spool import Spool, describe_os_error
from bridge.supervisor import Event
from bridge.worker_pool import build_pool
from contracts import atomic
from contracts.provenance import read_record
from contracts.settings import GenerationSettings, load_settings

log = logging.getLogger("bridge.server")

MAX_MESSAGES_PER_WAKEUP = 64  # then look at the worker again: neither side starves the other
CLEANUP_EVERY_S = 60.0
PROBE_EVERY_S = 2.0  # how often a writable spool is checked (a failing one: every loop turn)
RESEND_RESULT_AFTER_S = 10.0  # a peer that asks again for a result it was sent gets it again after this
MAX_STORAGE_REQUEUES = 5  # a job that hits spool errors this often in a row is failed


class ListenError(RuntimeError):
    """The server cannot bind its endpoint (address in use, bad endpoint ...)."""


class _Outcome:
    """A finished job's `result` message, read once and shared (zero-copy) by every peer it goes to;
    dropped when no send of it is still in flight."""

    def __init__(self, frames: list) -> None:
        self.frames = frames
        self.in_flight: dict[bytes, zmq.MessageTracker] = {}
        self.sent_at: dict[bytes, float] = {}

    def busy(self) -> bool:
        for peer, tracker in list(self.in_flight.items()):
            if tracker.done:
                del self.in_flight[peer]
        return bool(self.in_flight)


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
        self.jobs: dict[str, Job] = {}
        self.by_request: dict[tuple[str, str], str] = {}  # (identity, rid) -> job id: submit is idempotent
        self.pending_health: dict[str, tuple[bytes, str, float]] = {}
        self.outcomes: dict[str, _Outcome] = {}  # result messages being sent
        self.sent_at: dict[tuple[bytes, str], float] = {}  # (peer, job) -> when its result last went out
        self.unavailable: str | None = None
        self.storage_error: str | None = None
        self._storage_requeues: dict[str, int] = {}
        self.started = time.time()
        self._stop = False
        self._next_cleanup = 0.0
        self._next_probe = 0.0
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
        for job in self.spool.load_all():
            self.jobs[job.id] = job
            self.by_request[(job.client, job.rid)] = job.id
            if job.state == "done" and not job.result_path.is_file():
                # never "done" without its result (it is fsynced before "done" is saved, so only a
                # deleted file gets here; the inputs are gone): say so instead of serving nothing
                log.warning("job %s: done, but its result.mp4 is missing; marking it failed", job.id)
                lost = "the result.mp4 of this job is missing from the spool; submit it again"
                job.state, job.error = "failed", {"code": "internal", "message": lost}
                self._save(job)
            if job.terminal:
                if job.released:
                    self.spool.release_inputs(job)  # left by a server that stopped at the wrong moment
                continue
            if job.state == "running":
                if job.attempts >= self.config.max_attempts:
                    message = f"the server stopped during this job {job.attempts} times; not retried again"
                    self._finish(job, "failed", {"code": "interrupted", "message": message})
                    failed += 1
                    continue
                job.move("queued")
                self._save(job)
                self.queue.push(job.client, job.id, front=True)
            else:
                self.queue.push(job.client, job.id)
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
                except Exception:  # a bug must not take the server down
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
        wait = max_wait_s if not self.storage_error else min(max_wait_s, 0.2)
        deadline = self.supervisor.next_deadline()
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        ready = dict(poller.poll(int(wait * 1000)))
        if ready.get(self.socket):
            self._drain_socket()
        if any(fd in ready for fd, _ in worker_fds):
            self._handle_worker_events(self.supervisor.on_io())
        self._handle_worker_events(self.supervisor.tick())
        now = time.monotonic()
        if now >= self._next_probe:
            self._probe_storage()
        self._dispatch()
        self._release_outcomes()
        if now >= self._next_cleanup:
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
            peer, body = frames[0].bytes, frames[1:]
            rid = protocol.peek_rid(body[0].buffer, self.limits) if body else None
            try:
                self._handle_request(peer, body)
            except Exception as exc:  # a bug must cost one request, never the server
                log.error("internal error on a request: %s\n%s", exc, traceback.format_exc())
                self._send(peer, protocol.error_frames("internal", f"internal server error: {exc}", rid))
            # A new job starts before the next request is read (queue positions stay exact); its
            # own errors are the job's, never an answer to the request that was just accepted.
            try:
                self._dispatch()
            except Exception:
                log.exception("internal error while dispatching; going on")

    # ---------------------------------------------------------------------------------------
    # Storage

    def _save(self, job: Job) -> bool:
        """Write a job's state.json; on failure the job is marked dirty (written again when the
        spool recovers) and the spool is reported not writable."""
        try:
            self.spool.save_state(job)
            return True
        except OSError as exc:
            job.dirty = True
            self._storage_failed(exc, f"job {job.id} state")
            return False

    def _storage_failed(self, exc: OSError, what: str) -> None:
        reason = describe_os_error(exc)
        if self.storage_error != reason:
            log.error("spool: cannot write %s: %s; new jobs are refused until it can be written", what, reason)
        self.storage_error = reason
        self._next_probe = 0.0  # check again at the next loop turn

    def _probe_storage(self) -> None:
        """Is the spool writable (and is there room) now? Clears or sets `storage_error`."""
        now = time.monotonic()
        self._next_probe = now + (0.2 if self.storage_error else PROBE_EVERY_S)
        try:
            self.spool.probe()
            free = self.spool.free_bytes()
        except OSError as exc:
            self._storage_failed(exc, "its probe file")
            return
        if free < self.config.spool_min_free_bytes:
            reason = (
                f"the spool's disk is nearly full: {free >> 20} MiB free, below spool_min_free_bytes "
                f"({self.config.spool_min_free_bytes >> 20} MiB)"
            )
            if self.storage_error != reason:
                log.error("spool: %s", reason)
            self.storage_error = reason
            return
        for job in self.jobs.values():  # state changes that could not be written before
            if job.dirty:
                try:
                    self.spool.save_state(job)
                except OSError as exc:
                    self._storage_failed(exc, f"job {job.id} state")
                    return
                if job.released:
                    self.spool.release_inputs(job)
        if self.storage_error:
            log.info("spool is writable again")
        self.storage_error = None

    def spool_usage(self) -> tuple[int, dict[str, int]]:
        """Bytes the jobs hold in the spool: in all, and per client."""
        per_client: dict[str, int] = {}
        for job in self.jobs.values():
            per_client[job.client] = per_client.get(job.client, 0) + job.spool_bytes
        return sum(per_client.values()), per_client

    # ---------------------------------------------------------------------------------------
    # Requests

    def _identity(self, peer: bytes, header: zmq.Frame) -> str:
        """Who sent a message: the CurveZMQ key ZAP authenticated, else the connection."""
        if self.config.security.curve:
            try:
                return "key:" + header.get("User-Id")
            except (zmq.ZMQError, TypeError):  # pragma: no cover (ZAP always sets it under CURVE)
                pass
        return "peer:" + peer.hex()

    def _handle_request(self, peer: bytes, frames: list) -> None:
        try:
            request = protocol.parse_request([f.buffer for f in frames], self.limits)
        except ProtocolError as exc:
            rid = protocol.peek_rid(frames[0].buffer, self.limits) if frames else None
            log.info("refused a malformed request (%s): %s", exc.code, exc)
            self._send(peer, protocol.error_frames(exc.code, str(exc), rid))
            return
        if isinstance(request, Submit):
            self._on_submit(peer, self._identity(peer, frames[0]), request)
        elif isinstance(request, Health):
            self._on_health(peer, request)
        else:
            getattr(self, f"_on_{request.type}")(peer, request)

    def _refuse(self, peer: bytes, rid: str, code: str, message: str) -> None:
        self._send(peer, protocol.error_frames(code, message, rid))

    def _on_submit(self, peer: bytes, client: str, request: Submit) -> None:
        rid = request.rid
        existing = self.jobs.get(self.by_request.get((client, rid), ""))
        if existing is not None:  # a retry of a submit this client already made
            self._reply_accepted(peer, rid, existing)
            if existing.terminal:
                self._send_outcome(existing, [peer])
            else:
                existing.subscribers.add(peer)
            return
        try:
            settings = self._job_settings(request.settings)
        except ProtocolError as exc:
            self._refuse(peer, rid, exc.code, str(exc))
            return
        if self.unavailable:
            self._refuse(peer, rid, "unavailable", self.unavailable)
            return
        if self.storage_error:
            self._refuse(peer, rid, "storage", f"the server cannot store jobs now: {self.storage_error}")
            return
        waiting, mine = len(self.queue), self.queue.count(client)
        if waiting >= self.config.max_queue:
            self._refuse(peer, rid, "busy", f"the queue is full ({waiting} jobs waiting); try again later")
            return
        if mine >= self.config.max_queue_per_client:
            self._refuse(peer, rid, "busy", f"you already have {mine} jobs waiting (the per-client cap); "
                         "wait for one to finish")  # fmt: skip
            return
        size = len(request.image) + request.poses.nbytes + request.intrinsics.nbytes + len(request.prompt) + 4096
        self._make_room(size, client)
        used, per_client = self.spool_usage()
        if used + size > self.config.spool_quota_bytes:
            self._refuse(peer, rid, "busy", f"the spool quota is used up ({used >> 20} of "
                         f"{self.config.spool_quota_bytes >> 20} MiB); try again when jobs have ended")  # fmt: skip
            return
        if per_client.get(client, 0) + size > self.config.spool_quota_per_client_bytes:
            self._refuse(peer, rid, "busy", f"your share of the spool quota is used up "
                         f"({per_client.get(client, 0) >> 20} of {self.config.spool_quota_per_client_bytes >> 20} "
                         "MiB); wait for your jobs to end")  # fmt: skip
            return
        try:
            job = self.spool.accept(
                client=client,
                rid=rid,
                prompt=request.prompt,
                image=request.image,
                poses=request.poses,
                intrinsics=request.intrinsics,
                settings=settings.to_dict(),
                want_frames=request.want_frames,
                name=request.name,
            )
        except OSError as exc:
            self._storage_failed(exc, "a new job")
            self._refuse(peer, rid, "storage", f"the server cannot store the job: {self.storage_error}")
            return
        self.jobs[job.id] = job
        self.by_request[(client, rid)] = job.id
        job.subscribers.add(peer)
        if request.want_chunks:
            job.chunk_peers.add(peer)
            if request.want_stills:
                job.still_peers.add(peer)
        self.queue.push(client, job.id)
        log.info("job %s accepted from %s (%d waiting)", job.id, client, len(self.queue))
        self._reply_accepted(peer, rid, job)  # the loop hands it to the worker after this turn

    def _make_room(self, size: int, client: str, keep: str | None = None) -> None:
        """Kept results are a cache: before a quota refuses new work, the oldest finished jobs'
        results are deleted (those of this client first for its own quota). Inputs of unfinished
        jobs are never touched."""
        used, per_client = self.spool_usage()
        finished = sorted((j for j in self.jobs.values()
                           if j.terminal and j.result_bytes and not j.dirty and j.id != keep),
                          key=lambda j: j.finished or 0)  # fmt: skip
        for job in finished:
            over_all = used + size > self.config.spool_quota_bytes
            over_mine = (
                job.client == client and per_client.get(client, 0) + size > self.config.spool_quota_per_client_bytes
            )
            if not (over_all or over_mine):
                continue
            log.info("spool quota: deleting the result of job %s (finished %.0f s ago)", job.id,
                     time.time() - (job.finished or 0))  # fmt: skip
            used -= job.result_bytes
            per_client[job.client] = per_client.get(job.client, 0) - job.result_bytes
            self.spool.remove(job)
            del self.jobs[job.id]
            self.by_request.pop((job.client, job.rid), None)

    def _job_settings(self, requested: dict[str, Any]) -> GenerationSettings:
        """The job's settings (the server's preset under the request's), or ProtocolError bad_settings."""
        try:  # the one strict validator (contracts.settings): every field's type and range
            settings = GenerationSettings.from_dict({**self.base_settings.to_dict(), **requested})
        except Exception as exc:  # whatever it refuses is the request's fault, never an internal error
            raise ProtocolError(f"settings: {exc}"[:1000], "bad_settings") from None
        limits = self.limits
        for name, value, cap in (
            ("frame_num", settings.frame_num, limits.max_frame_num),
            ("steps", settings.steps, limits.max_steps),
        ):
            if value > cap:
                raise ProtocolError(f"settings: {name} {value} > the server's cap {cap}", "bad_settings")
        if settings.max_area > limits.max_area:
            raise ProtocolError(
                f"settings: size {settings.size} is above the server's cap of {limits.max_area} pixels",
                "bad_settings",
            )
        refusal = self.supervisor.refusal(settings.gpus)  # e.g. two GPUs from a one-device server
        if refusal:
            raise ProtocolError(f"settings: {refusal}", "bad_settings")
        return settings

    def _reply_accepted(self, peer: bytes, rid: str, job: Job) -> None:
        fields = {"rid": rid, "job": job.id, "queue_position": self._jobs_ahead(job.id)}
        self._send(peer, protocol.encode("accepted", fields))
        if job.state == "queued":
            job.sent_position = fields["queue_position"]

    def _on_cancel(self, peer: bytes, request: JobRequest) -> None:
        job = self._lookup(peer, request)
        if job is None:
            return
        if job.state == "queued":
            self.queue.remove(job.id)
            self._finish(job, "cancelled", {"code": "cancelled", "message": "cancelled while queued"})
            self._broadcast_positions()
        elif job.state == "running":
            self.supervisor.cancel_job(job.id)
            job.live.cancelling = True
        self._reply_status(peer, request.rid, job)

    def _on_status(self, peer: bytes, request: JobRequest) -> None:
        job = self._lookup(peer, request)
        if job is not None:
            self._reply_status(peer, request.rid, job)

    def _on_watch(self, peer: bytes, request: JobRequest) -> None:
        """Subscribe this connection to a job's events; a finished job's outcome is sent again."""
        job = self._lookup(peer, request)
        if job is None:
            return
        self._reply_status(peer, request.rid, job)
        if job.terminal:
            self._send_outcome(job, [peer])
        else:
            job.subscribers.add(peer)

    def _on_health(self, peer: bytes, request: Health) -> None:
        self._probe_storage()  # the answer says whether the spool is writable now
        health_id = uuid.uuid4().hex
        if self.supervisor.request_health(health_id):
            self.pending_health[health_id] = (peer, request.rid, time.monotonic())
        else:
            self._reply_health(peer, request.rid, None, None)

    def _lookup(self, peer: bytes, request: JobRequest) -> Job | None:
        job = self.jobs.get(request.job)
        if job is None:
            message = (
                f"no job {request.job!r} on this server (finished jobs are kept {self.config.result_ttl_s / 3600:g} h)"
            )
            self._send(peer, protocol.error_frames("not_found", message, request.rid, request.job))
        return job

    def _reply_status(self, peer: bytes, rid: str, job: Job) -> None:
        fields: dict[str, Any] = {"rid": rid, "job": job.id, "state": job.state}
        if job.state == "queued":
            fields["queue_position"] = self._jobs_ahead(job.id)
        live = job.live
        if job.state == "running" and live is not None:
            fields.update(phase=live.phase, step=live.step, total=live.total)
            if live.eta_s is not None:
                fields["eta_s"] = live.eta_s
            if live.cancelling:
                fields["cancelling"] = True
        if job.error:
            fields["error"] = job.error
        self._send(peer, protocol.encode("status", fields))

    def _reply_health(self, peer: bytes, rid: str, answers: list[dict | None] | None, asked_at: float | None) -> None:
        """`workers`: every worker of the pool; `worker` (the first) and `gpu`/`memory` (its
        report) stay for one-worker clients. ok: every worker answered and is idle or busy, and
        the spool is writable."""
        supervisor = self.supervisor
        workers = supervisor.status()
        for index, worker in enumerate(workers):
            answer = answers[index] if answers else None
            if answer is not None:
                worker["answer_s"] = round(time.monotonic() - asked_at, 4)
                worker["reported"] = {k: v for k, v in answer.items() if k not in ("type", "id")}
            elif worker["state"] in ("restarting", "stopped"):
                worker["error"] = f"the worker is {worker['state']}"
            elif asked_at is not None:
                worker["error"] = f"the worker did not answer within {supervisor.config.health_timeout_s:g} s"
        workers_ok = all(w.get("reported", {}).get("state") in ("idle", "busy") for w in workers)
        ok = workers_ok and not self.unavailable and not self.storage_error
        reported = workers[0].get("reported", {})
        running = [self.jobs[j] for j in supervisor.jobs if j in self.jobs]
        now = time.monotonic()
        used, _ = self.spool_usage()
        try:
            free = self.spool.free_bytes()
        except OSError:
            free = None
        info = supervisor.info
        fields = {
            "rid": rid,
            "ok": ok,
            "protocol": protocol.PROTOCOL_VERSION,
            "model": {k: info[k] for k in ("model", "device", "dtype", "load_s") if k in info}
            # engine: the model resident now (base | fast, chosen per job); the worker's latest word
            | {k: v for k, v in (("engine", reported.get("engine", info.get("engine"))),) if v is not None},
            "gpu": reported.get("gpu"),
            "memory": reported.get("memory"),
            "queue": {
                "waiting": len(self.queue),
                "running": running[0].id if running else None,
                "running_for_s": round(now - running[0].live.since, 2) if running and running[0].live else None,
                "phase": running[0].live.phase if running and running[0].live else None,
                "running_jobs": [j.id for j in running],
                "running_for_s_by_job": {j.id: round(now - j.live.since, 2) for j in running if j.live},
                "max_queue": self.config.max_queue,
                "max_queue_per_client": self.config.max_queue_per_client,
            },
            "worker": workers[0],
            "workers": workers,
            "spool": {
                "dir": str(self.spool.root),
                "writable": self.storage_error is None,
                "error": self.storage_error,
                "used_bytes": used,
                "quota_bytes": self.config.spool_quota_bytes,
                "quota_per_client_bytes": self.config.spool_quota_per_client_bytes,
                "free_bytes": free,
            },
            "server": {
                "pid": os.getpid(),
                "endpoint": self.endpoint,
                "curve": self.config.security.curve,
                "uptime_s": round(time.time() - self.started, 1),
                "unavailable": self.unavailable,
            },
        }
        self._send(peer, protocol.encode("health", fields))

    # ---------------------------------------------------------------------------------------
    # The worker

    def _dispatch(self) -> None:
        """Hand queued jobs to idle workers, strictly in the queue's fair order: the job at the head
        starts when the workers it needs are idle (two for a `gpus = 2` job: until then the jobs
        behind it wait too, so it is never passed over; bridge/worker_pool.py). A job moves to
        "running" only once its state is on disk and the worker has its message; otherwise it is
        requeued or failed, never left."""
        pool = self.supervisor
        pool.hold(None)
        while pool.idle() and len(self.queue) and not self.storage_error:
            job = self.jobs[self.queue.peek()]
            try:
                settings = self._job_settings(job.settings)  # a job spooled by an older, laxer server
            except ProtocolError as exc:
                self.queue.pop()  # the head (peek): its client's turn ends
                self._finish(job, "failed", {"code": "bad_settings", "message": f"not run: {exc}"})
                continue
            workers = pool.workers_for(settings.gpus)
            if workers > pool.capacity():
                self.queue.pop()  # the head (peek): its client's turn ends
                reasons = self.unavailable or "; ".join(
                    f"{w['name']}: {w['unavailable']}" for w in pool.status() if w["unavailable"]
                )
                self._finish(job, "failed", {"code": "unavailable", "message": f"gpus {settings.gpus} needs "
                             f"{workers} workers and only {pool.capacity()} can serve ({reasons})"})  # fmt: skip
                continue
            if pool.idle_count() < workers:
                pool.hold(job.id)  # the head waits for a second idle worker; nothing passes it
                return
            self.queue.pop()  # the head (peek): its client's turn ends
            job.move("running")
            if not self._save(job):
                job.move("queued")
                job.attempts -= 1  # not a real attempt
                self.queue.push(job.client, job.id, front=True)
                return
            try:
                worker = pool.run_job(
                    job.id,
                    {
                        "episode_dir": str(job.episode_dir),
                        "output": str(job.result_path),
                        "settings": job.settings,
                        "want_frames": job.want_frames,
                        "frames_output": str(job.frames_path) if job.want_frames else None,
                        "want_chunks": bool(job.chunk_peers),
                    },
                    workers=workers,
                )
            except wp.WorkerProtocolError as exc:
                self._finish(job, "failed", {"code": "bad_settings", "message": str(exc)})
                continue
            log.info("job %s started on worker %d (attempt %d)", job.id, worker, job.attempts)
            self._publish(job, protocol.encode("progress", {"job": job.id, "phase": "starting", "step": 0, "total": 0}))
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

    def _worker_progress(self, event: Event) -> None:
        job = self.jobs.get(event.job)
        if job is None or job.live is None:
            return
        data, live, now = event.data, job.live, time.monotonic()
        phase, step, total = str(data.get("phase", ""))[:64], _count(data.get("step")), _count(data.get("total"))
        if phase == "denoise":
            # ETA from the measured pace of the denoising steps (they dominate the job's time).
            if live.phase != "denoise" or live.denoise_t0 is None:
                live.denoise_t0, live.denoise_step0 = now, step
            done = step - live.denoise_step0
            if done > 0 and total >= step:
                live.eta_s = round((now - live.denoise_t0) / done * (total - step), 2)
        else:
            live.eta_s = None
        live.phase, live.step, live.total = phase, step, total
        fields = {"job": job.id, "phase": phase, "step": step, "total": total}
        if live.eta_s is not None:
            fields["eta_s"] = live.eta_s
        self._publish(job, protocol.encode("progress", fields))

    def _worker_chunk(self, event: Event) -> None:
        """A finished chunk (model = fast): its mp4, written by the worker in the job's folder, goes to
        the subscribers that asked for chunks, then is deleted (the result holds every frame); its
        still (a PNG of its last frame) goes along to those that asked for stills too."""
        job = self.jobs.get(event.job)
        if job is None or job.state != "running":
            return
        data = event.data
        still = self._take_chunk_file(job, data.get("still"), ".png", "max_image_bytes") if data.get("still") else None
        video = self._take_chunk_file(job, data.get("path", ""), ".mp4", "max_chunk_bytes")
        if video is None:
            return
        fields = {"job": job.id, "chunk_v": protocol.CHUNK_VERSION, "index": _count(data.get("index")),
                  "total": _count(data.get("total")), "frame_count": _count(data.get("frames"))}  # fmt: skip
        message = protocol.encode("chunk", fields, blobs={"video": video})
        if still is not None and not still.startswith(protocol.PNG_MAGIC):
            log.warning("job %s: a chunk still is not a PNG; not streamed", job.id)
            still = None
        with_still = protocol.encode("chunk", fields, blobs={"video": video, "still": still}) if still else message
        for peer in list(job.chunk_peers & job.subscribers):
            self._send(peer, with_still if peer in job.still_peers else message)

    def _take_chunk_file(self, job: Job, named: Any, suffix: str, cap: str) -> bytes | None:
        """A file the worker wrote in the job's folder for a chunk (its mp4 or still), read and
        deleted; None (logged) when it is elsewhere, unreadable or above the `cap` limit."""
        path = Path(str(named))
        if path.parent != job.dir or path.suffix != suffix:
            log.warning("job %s: chunk file %s is outside the job's folder; ignored", job.id, path)
            return None
        try:
            size = path.stat().st_size
            data = path.read_bytes() if size <= getattr(self.limits, cap) else None
            path.unlink()
        except OSError as exc:
            log.warning("job %s: chunk file %s unreadable (%s); not streamed", job.id, path.name, exc)
            return None
        if data is None:
            log.warning("job %s: chunk file %s is %d bytes, above %s; not streamed", job.id, path.name, size, cap)
        return data

    def _worker_result(self, event: Event) -> None:
        job = self.jobs.get(event.job)
        if job is None or job.state != "running":
            return
        frames = event.data.get("frames")
        expected = _count(frames) if frames is not None else None
        try:
            size = check_complete(job.result_path, expected or None)
            if job.want_frames and not job.frames_path.is_file():
                raise IncompleteVideo("frames.npy is missing")
            atomic.fsync_file(job.result_path)  # durable before "done" (whoever wrote it)
            atomic.fsync_dir(job.dir)
            if job.want_frames:
                atomic.fsync_file(job.frames_path)
                size += job.frames_path.stat().st_size
        except (OSError, IncompleteVideo) as exc:
            if self._storage_suspect(job, f"its result is incomplete ({exc})"):
                return
            self._finish(job, "failed", {"code": "worker_error", "message": f"the result is incomplete: {exc}"})
            return
        job.result_bytes, job.frames = size, expected
        self._storage_requeues.pop(job.id, None)
        self._finish(job, "done", None)
        self._make_room(0, job.client, keep=job.id)  # a result larger than its inputs: stay under the quota

    def _storage_suspect(self, job: Job, why: str) -> bool:
        """A running job failed in a way a full or read-only spool explains: if the spool is not
        writable now, requeue the job (it runs again when the spool recovers) and return True."""
        self._probe_storage()
        count = self._storage_requeues.get(job.id, 0) + 1
        if not self.storage_error or count > MAX_STORAGE_REQUEUES:
            return False
        self._storage_requeues[job.id] = count
        log.warning("job %s: %s; the spool is not writable (%s): requeued", job.id, why, self.storage_error)
        for path in (job.result_path, job.frames_path):
            with contextlib.suppress(OSError):  # a read-only spool keeps them; the next run replaces them
                path.unlink(missing_ok=True)
        job.move("queued")
        job.attempts -= 1
        self._save(job)
        self.queue.push(job.client, job.id, front=True)
        self._publish(job, protocol.encode("progress", {"job": job.id, "phase": "queued", "step": 0, "total": 0,
                                                         "queue_position": self._jobs_ahead(job.id)}))  # fmt: skip
        return True

    def _worker_error(self, event: Event) -> None:
        job = self.jobs.get(event.job)
        if job is None or job.state != "running":
            return
        code = str(event.data.get("code", "worker_error"))
        message = str(event.data.get("message", ""))[:2000]
        if code in ("storage", "worker_error", "worker_crashed") and self._storage_suspect(job, f"{code}: {message}"):
            return
        if code not in protocol.ERROR_CODES:
            code = "worker_error"
        self._storage_requeues.pop(job.id, None)
        if code == "worker_crashed" and self._retry_crashed(job, message):
            return
        state = "cancelled" if code == "cancelled" else "failed"
        self._finish(job, state, {"code": code, "message": message})

    def _retry_crashed(self, job: Job, reason: str) -> bool:
        """[worker] retry_crashed: put a job whose worker died back at the front of the queue
        (any worker may take it), until it has been started max_attempts times."""
        if not self.config.worker.retry_crashed or job.attempts >= self.config.max_attempts:
            return False
        log.warning("job %s: its worker died (%s); running it again (attempt %d of %d)",
                    job.id, reason, job.attempts + 1, self.config.max_attempts)  # fmt: skip
        job.move("queued")
        self._save(job)
        self.queue.push(job.client, job.id, front=True)
        self._broadcast_positions()
        return True

    def _worker_health(self, event: Event) -> None:
        pending = self.pending_health.pop(str(event.data.get("id")), None)
        if pending is None:
            return
        peer, rid, asked_at = pending
        self._reply_health(peer, rid, event.data.get("workers"), asked_at)

    # ---------------------------------------------------------------------------------------
    # Job outcomes and events

    def _finish(self, job: Job, state: str, error: dict[str, str] | None) -> None:
        job.move(state, error)
        if self._save(job) and job.released:
            self.spool.release_inputs(job)  # a failed or cancelled job's episode is never needed again
        log.info("job %s %s%s", job.id, state, f": {error['code']}: {error['message']}" if error else "")
        subscribers, job.subscribers = list(job.subscribers), set()
        self._send_outcome(job, subscribers)

    def _send_outcome(self, job: Job, peers: list[bytes]) -> None:
        if not peers:
            return
        if job.state != "done":
            error = job.error or {"code": "worker_error", "message": "failed without a reason"}
            frames = protocol.error_frames(error["code"], error["message"], job=job.id)
            for peer in peers:
                self._send(peer, frames)
            return
        outcome = self.outcomes.get(job.id)
        now = time.monotonic()
        for peer in peers:
            if outcome is not None and peer in outcome.in_flight and not outcome.in_flight[peer].done:
                continue  # the last copy is still on its way to this peer
            if now - self.sent_at.get((peer, job.id), -1e9) < RESEND_RESULT_AFTER_S:
                continue  # sent moments ago; a client that lost it asks again later
            if outcome is None:
                try:
                    outcome = self.outcomes[job.id] = _Outcome(self._result_frames(job))
                except (OSError, ValueError) as exc:
                    log.error("job %s: cannot read its result: %s", job.id, exc)
                    self._send(peer, protocol.error_frames("storage", f"cannot read the result now: {exc}", job=job.id))
                    continue
            tracker = self._send(peer, outcome.frames, track=True)
            if tracker is not None:
                outcome.in_flight[peer] = tracker
                self.sent_at[(peer, job.id)] = now

    def _release_outcomes(self) -> None:
        """Forget result messages no send still holds (their memory returns)."""
        for job_id, outcome in list(self.outcomes.items()):
            if not outcome.busy():
                del self.outcomes[job_id]
        if len(self.sent_at) > 4096:
            cutoff = time.monotonic() - RESEND_RESULT_AFTER_S
            self.sent_at = {k: t for k, t in self.sent_at.items() if t >= cutoff}

    def _result_frames(self, job: Job) -> list:
        video = job.result_path.read_bytes()
        arrays = {}
        if job.want_frames and job.frames_path.is_file():
            arrays["frames"] = np.load(job.frames_path, allow_pickle=False)
        seconds = (job.finished or 0) - (job.started or 0)
        fields: dict[str, Any] = {"job": job.id, "seconds": round(seconds, 3)}
        provenance, note = read_record(job.result_path)  # the worker's record beside result.mp4
        if provenance is not None:
            fields["provenance"] = provenance
        elif note:
            log.warning("job %s: %s", job.id, note)
        return protocol.encode("result", fields, arrays, {"video": video})

    def _publish(self, job: Job, frames: list) -> None:
        for peer in list(job.subscribers):
            self._send(peer, frames)

    def _jobs_ahead(self, job_id: str) -> int:
        running = len(self.supervisor.jobs)
        return running + self.queue.positions().get(job_id, 0)

    def _broadcast_positions(self) -> None:
        running = len(self.supervisor.jobs)
        for job_id, position in self.queue.positions().items():
            job, ahead = self.jobs[job_id], running + position
            if job.sent_position != ahead:
                job.sent_position = ahead
                fields = {"job": job_id, "phase": "queued", "step": 0, "total": 0, "queue_position": ahead}
                self._publish(job, protocol.encode("progress", fields))

    def _send(self, peer: bytes, frames: list, track: bool = False) -> zmq.MessageTracker | None:
        try:
            return self.socket.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False, track=track)
        except zmq.Again:
            log.debug("client %s is not reading; message dropped", peer.hex())
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            for job in self.jobs.values():  # that connection is gone
                job.subscribers.discard(peer)
        return None

    def _cleanup(self) -> None:
        """Forget finished jobs older than result_ttl_s (and delete their folders)."""
        self._next_cleanup = time.monotonic() + CLEANUP_EVERY_S
        cutoff = time.time() - self.config.result_ttl_s
        for job in list(self.jobs.values()):
            if job.terminal and (job.finished or 0) < cutoff and not job.dirty:
                self.spool.remove(job)
                del self.jobs[job.id]
                self.by_request.pop((job.client, job.rid), None)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else 0
