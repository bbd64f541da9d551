"""The generation server: a ROUTER front end, a fair job queue, a disk spool, a pool of supervised workers.

One thread, one event loop (zguide style): it polls the ROUTER socket and the worker's pipe
together, so a slow or dead worker never stalls the front end, and a flood of clients never
stalls the worker. Every request gets exactly one reply (or an `error`); job events (`progress`,
`result`, `error`) go to every connection subscribed to the job: the one that submitted it and
any that `watch` it later (a client that reconnected, or another process).

Each job is one `bridge.server.jobs.Job` in `self.jobs` (its request, its state, its subscribers, its
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

import dataclasses
import logging
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import zmq

from bridge.server.eviction import Eviction
from bridge.server.fair_queue import FairQueue
from bridge.server.job_lifecycle import JobLifecycle
from bridge.server.jobs import Job
from bridge.server.live_jobs import LiveJobs
from bridge.server.request_handling import RequestHandling
from bridge.server.result_streaming import Outcome, ResultStreaming
from bridge.server.server_config import ServerConfig
from bridge.server.spool import Spool
from bridge.server.storage_watch import StorageWatch
from bridge.wire import protocol
from bridge.wire.protocol import Limits
from bridge.wire.security import check_bind_allowed, secure_server_socket
from bridge.workers.worker_pool import build_pool
from contracts.settings import load_settings

log = logging.getLogger("bridge.server.server")

MAX_MESSAGES_PER_WAKEUP = 64  # then look at the worker again: neither side starves the other
CLEANUP_EVERY_S = 60.0


class ListenError(RuntimeError):
    """The server cannot bind its endpoint (address in use, bad endpoint ...)."""


class Server(RequestHandling, JobLifecycle, ResultStreaming, StorageWatch, LiveJobs, Eviction):
    """The server: its socket, its spool-backed jobs, its pool, and the loop that serves them
    (requests: `bridge.server.request_handling`; the worker side: `bridge.server.job_lifecycle`; results and
    events: `bridge.server.result_streaming`; the spool's health: `bridge.server.storage_watch`; kept results
    as a cache: `bridge.server.eviction`)."""

    def __init__(self, config: ServerConfig) -> None:
        check_bind_allowed(config.bind, config.security.curve)
        self.config = config
        self.limits: Limits = config.limits
        self.base_settings = load_settings(config.generation_config, config.preset())
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
        self.outcomes: dict[str, Outcome] = {}  # result messages being sent
        self.sent_at: dict[tuple[bytes, str], float] = {}  # (peer, job) -> when its result last went out
        self.unavailable: str | None = None
        self.storage_error: str | None = None
        self._storage_requeues: dict[str, int] = {}
        self.started = time.time()
        self._stop = False
        self._next_cleanup = 0.0
        self._next_probe = 0.0
        worker = config.worker
        if worker.engine.warm_up:  # the workers warm up for the jobs this server gets: its generation preset
            engine = worker.engine.replace(warm_up_settings=self.base_settings.to_dict())
            worker = dataclasses.replace(worker, engine=engine)
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
        self._live_tick()
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
