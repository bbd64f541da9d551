"""The server's request handling: who sent a message, and the answer to each request type
(submit, cancel, status, watch, health), with the checks a submit passes before it is spooled
(settings and the server's caps, queue caps, spool quotas).

A mixin of `bridge.server.server.Server`: every request gets exactly one reply (or an `error`).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import zmq

from bridge.server.engine_rules import check_compute, check_engine_rules
from bridge.server.jobs import Job
from bridge.server.peer_process import cap_group
from bridge.wire import protocol
from bridge.wire.live_protocol import LiveOpen, PoseBatch, parse_live
from bridge.wire.protocol import Health, JobRequest, Message, ProtocolError, Reload, Submit
from contracts.settings import GenerationSettings

log = logging.getLogger("bridge.server.server")

# Requests that change a job (`poses` too): only its owner's are accepted (the identity that opened
# it: the connection, or its CurveZMQ key across reconnects); anyone else gets `not_found`, as if the
# job did not exist. Reading a job (status, watch) stays open to whoever holds its id.
MUTATING = ("cancel", "end")


class RequestHandling:
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
            if isinstance(request, Message):  # a live job's `live` or `poses` (bridge/server/live_jobs.py)
                request = parse_live(request)
        except ProtocolError as exc:
            rid = protocol.peek_rid(frames[0].buffer, self.limits) if frames else None
            log.info("refused a malformed request (%s): %s", exc.code, exc)
            self._send(peer, protocol.error_frames(exc.code, str(exc), rid))
            return
        if isinstance(request, Submit):
            identity = self._identity(peer, frames[0])
            group = cap_group(identity, frames[0], self.config.security.curve)  # bridge/server/peer_process.py
            self._on_submit(peer, identity, request, group)
        elif isinstance(request, Health):
            self._on_health(peer, request)
        elif isinstance(request, Reload):
            self._on_reload(peer, request)
        elif isinstance(request, (LiveOpen, PoseBatch)):  # live jobs: bridge/server/live_jobs.py
            handler = self._on_live if isinstance(request, LiveOpen) else self._on_poses
            handler(peer, self._identity(peer, frames[0]), request)
        elif request.type in MUTATING:  # only the job's owner may change it
            getattr(self, f"_on_{request.type}")(peer, request, self._identity(peer, frames[0]))
        else:
            getattr(self, f"_on_{request.type}")(peer, request)

    def _refuse(self, peer: bytes, rid: str, code: str, message: str) -> None:
        self._send(peer, protocol.error_frames(code, message, rid))

    def _on_submit(self, peer: bytes, client: str, request: Submit, group: str | None = None) -> None:
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
            check_engine_rules(
                settings, request.image, request.poses, request.intrinsics
            )  # frames, size: the engine's words
        except ProtocolError as exc:
            self._refuse(peer, rid, exc.code, str(exc))
            return
        if self.unavailable:
            self._refuse(peer, rid, "unavailable", self.unavailable)
            return
        if self.storage_error:
            self._probe_storage()  # a full disk may have been made room on (kept results evicted) since
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
        shared = sum(1 for j in self.queue.order() if self.jobs[j].cap_group == group) if group else 0
        if shared >= self.config.max_queue_per_client:
            who = "the clients of your process" if group.startswith("process:") else (
                "the unauthenticated clients of this server (no CurveZMQ keys: connections of one "
                "process cannot be told apart)")  # fmt: skip
            self._refuse(peer, rid, "busy", f"{who} already have {shared} jobs waiting, the per-client cap; "
                         "wait for one to finish")  # fmt: skip
            return
        size = len(request.image) + request.poses.nbytes + request.intrinsics.nbytes + len(request.prompt) + 4096
        self._make_room(size, client)
        used, per_client = self.spool_usage()
        quota, per_client_quota = self.quota_bytes(), self.quota_per_client_bytes()  # bridge/server/eviction.py
        if used + size > quota:
            self._refuse(peer, rid, "busy", f"the spool quota is used up ({used >> 20} of "
                         f"{quota >> 20} MiB); try again when jobs have ended")  # fmt: skip
            return
        if per_client.get(client, 0) + size > per_client_quota:
            self._refuse(peer, rid, "busy", f"your share of the spool quota is used up "
                         f"({per_client.get(client, 0) >> 20} of {per_client_quota >> 20} "
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
        job.cap_group = group or ""
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
        refusal = self.supervisor.refusal(settings.gpus, settings.model)  # e.g. two GPUs from a one-device server
        if refusal:
            raise ProtocolError(f"settings: {refusal}", "bad_settings")
        check_compute(settings, self.supervisor.fp8_unsupported())  # fp8 where the workers said they cannot
        return settings

    def _reply_accepted(self, peer: bytes, rid: str, job: Job) -> None:
        fields = {"rid": rid, "job": job.id, "queue_position": self._jobs_ahead(job.id)}
        self._send(peer, protocol.encode("accepted", fields))
        if job.state == "queued":
            job.sent_position = fields["queue_position"]

    def _on_cancel(self, peer: bytes, request: JobRequest, client: str) -> None:
        job = self._lookup(peer, request, owner=client)
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
            if request.want_chunks:  # (a chunk already sent is not sent again: the result holds it)
                job.chunk_peers.add(peer)
                if request.want_stills:
                    job.still_peers.add(peer)

    def _on_health(self, peer: bytes, request: Health) -> None:
        self._probe_storage()  # the answer says whether the spool is writable now
        health_id = uuid.uuid4().hex
        if self.supervisor.request_health(health_id):
            self.pending_health[health_id] = (peer, request.rid, time.monotonic())
        else:
            self._reply_health(peer, request.rid, None, None)

    def _on_reload(self, peer: bytes, request: Reload) -> None:
        """Start again the workers given up on (a configuration error is never retried on a timer):
        after the checkpoint or the options were fixed. New submits queue again meanwhile; if a
        worker fails again, they fail with its reason, as before."""
        restarted = self.supervisor.reload()
        if restarted:
            log.info("reload: %d worker(s) started again", restarted)
            self.unavailable = None
        self._send(peer, protocol.encode("reloaded", {"rid": request.rid, "restarted": restarted}))

    def _lookup(self, peer: bytes, request: JobRequest, owner: str | None = None) -> Job | None:
        """The job a request names, or None after a `not_found` reply; with `owner`, only that
        client's job (another's is answered exactly as a missing one: ids are not probed)."""
        job = self.jobs.get(request.job)
        if job is not None and owner is not None and job.client != owner:
            job = None
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
            elif worker["state"] == "failed":
                worker["error"] = f"the worker cannot start: {worker['last_exit']} (send `reload` once it is fixed)"
            elif worker["state"] in ("restarting", "stopped"):
                worker["error"] = f"the worker is {worker['state']}"
            elif asked_at is not None:
                worker["error"] = f"the worker did not answer within {supervisor.config.health_timeout_s:g} s"
        workers_ok = all(w.get("reported", {}).get("state") in ("idle", "busy") for w in workers)
        ok = workers_ok and not self.unavailable and not self.storage_error
        # why not ok, in one line a client shows as it is (the most telling first)
        reason = self.unavailable or (self.storage_error and f"the server cannot store jobs now: {self.storage_error}")
        if not ok and not reason:
            reason = "; ".join(f"{w['name']}: {w.get('error') or w['state']}" for w in workers
                               if w.get("reported", {}).get("state") not in ("idle", "busy"))  # fmt: skip
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
            "reason": None if ok else reason[:2000],
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
                "quota_bytes": self.quota_bytes(),
                "quota_per_client_bytes": self.quota_per_client_bytes(),
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
