"""The client's I/O thread: the one owner of the DEALER socket, its connection and every timer.

Reliability (zguide's Lazy Pirate): a request that gets no reply in its share of the timeout is
re-sent on a fresh socket (LINGER 0, so nothing lingers), with backoff between reconnects. While
jobs run, a `watch` heartbeat per job re-subscribes after a reconnect or a server restart and
fetches an outcome that was lost on the way; after `give_up_s` without contact, unfinished jobs
end with a JobError("unreachable"). A mixin of `bridge.client.client.Client`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from bridge.client.client_errors import BridgeError, RequestFailed, ServerUnavailable, Unauthorized
from bridge.client.job_events import Chunk, JobError, Progress, Result
from bridge.wire import protocol
from bridge.wire.protocol import ProtocolError
from bridge.wire.security import load_public, load_secret, secure_client_socket

log = logging.getLogger("bridge.client.client")


_AUTH_EVENTS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the server rejected this client's CurveZMQ key (it is not in the "
    "server's client_keys_dir allowlist)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security handshake failed: the client and the server disagree on "
    "CurveZMQ (one of them has keys, the other not, or the server key is wrong)",
}


@dataclasses.dataclass
class Request:
    rid: str
    frames: list
    future: concurrent.futures.Future
    timeout: float  # the whole call's budget
    deadline: float  # ... and its end
    try_timeout: float
    try_deadline: float = 0.0
    on_reply: Callable[[protocol.Message], Any] | None = None  # runs on the I/O thread; its value resolves
    heartbeat_of: str | None = None  # the job a heartbeat `watch` is about


class ClientIO:
    """The I/O thread's side of `bridge.client.client.Client` (it runs `_io_loop`)."""

    def _load_curve(self, server_key: Any, client_key: Any) -> tuple[bytes, tuple[bytes, bytes]] | None:
        if server_key is None and client_key is None:
            return None
        if server_key is None or client_key is None:
            raise ValueError("CurveZMQ needs both server_key (the server's public key) and client_key")
        if isinstance(server_key, (bytes, str)) and len(server_key) == 40 and not Path(str(server_key)).exists():
            server_public = server_key.encode() if isinstance(server_key, str) else server_key
        else:
            server_public, _ = load_public(Path(server_key))
        pair = client_key if isinstance(client_key, tuple) else load_secret(Path(client_key))
        return server_public, pair

    def _connect(self) -> None:
        if self._socket is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
        socket = self._context.socket(zmq.DEALER)
        socket.linger = 0
        socket.maxmsgsize = self.limits.max_reply_frame_bytes
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        socket.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        socket.setsockopt(zmq.ROUTING_ID, self._routing_id)
        if self._curve is not None:
            secure_client_socket(socket, *self._curve)
        self._monitor = socket.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )
        socket.connect(self.endpoint)
        self._socket = socket

    def _io_loop(self) -> None:
        try:
            while True:
                if self._run_commands():
                    break
                poller = zmq.Poller()
                poller.register(self._socket, zmq.POLLIN)
                poller.register(self._monitor, zmq.POLLIN)
                poller.register(self._wake_r, zmq.POLLIN)
                wait = max(0.0, min(self._next_deadline() - time.monotonic(), 0.5))
                ready = dict(poller.poll(int(wait * 1000) + 1))
                if ready.get(self._monitor):
                    self._on_monitor()
                if ready.get(self._socket):
                    self._drain_socket()
                self._on_timers()
        except Exception:
            log.exception("client I/O thread crashed")
        finally:
            self._shutdown()

    def _run_commands(self) -> bool:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            if command[0] == "close":
                return True
            request: Request = command[1]
            if self._refused is not None:  # the handshake failed before this request was made
                _settle(request.future, error=Unauthorized(self._refused))
                continue
            self._pending[request.rid] = request
            self._send(request)

    def _send(self, request: Request) -> None:
        request.try_deadline = min(request.deadline, time.monotonic() + request.try_timeout)
        with contextlib.suppress(zmq.Again):  # no room: counts as a lost try
            self._socket.send_multipart(request.frames, zmq.NOBLOCK, copy=False)

    def _next_deadline(self) -> float:
        # An expired try waits for the reconnect backoff (or its call's end), never spins.
        deadlines = [min(r.deadline, max(r.try_deadline, self._next_reconnect)) for r in self._pending.values()]
        if self._jobs:
            deadlines.append(self._next_heartbeat)
        return min(deadlines, default=time.monotonic() + 0.5)

    def _drain_socket(self) -> None:
        for _ in range(256):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._last_contact = time.monotonic()
            self._reconnects = 0
            self._refused = None
            try:
                message = protocol.decode_reply([f.buffer for f in frames], self.limits)
            except ProtocolError as exc:
                log.warning("ignored a malformed message from the server: %s", exc)
                continue
            self._on_message(message)

    def _on_message(self, message: protocol.Message) -> None:
        rid = message.get("rid")
        request = self._pending.pop(rid, None) if rid else None
        if request is not None:
            if message.type == "error":
                _settle(request.future, error=RequestFailed(message.fields["code"], message.fields["message"]))
                if message.get("job") and message.fields["code"] == "not_found":
                    self._end_job(message.fields["job"], "not_found", message.fields["message"])
                return
            try:
                _settle(request.future, request.on_reply(message) if request.on_reply else message)
            except Exception as exc:
                _settle(request.future, error=exc)
            return
        job_id = message.get("job")
        job = self._jobs.get(job_id) if job_id else None
        if message.type == "status" and job is not None:
            self._apply_status(message)  # a heartbeat's answer
        elif message.type == "progress" and job is not None:
            f = message.fields
            job._deliver(Progress(job_id, f["phase"], f["step"], f["total"], f.get("eta_s"), f.get("queue_position")))
        elif message.type == "chunk" and job is not None:
            f = message.fields
            still = message.blobs.get("still")
            still = still if still is not None and still.startswith(protocol.PNG_MAGIC) else None  # PNG or none
            live = f.get("live")  # a live job's chunk: its poses and timings
            job._deliver(Chunk(job_id, f["index"], f["total"], f["frame_count"], message.blobs["video"], still, live))
        elif message.type == "result" and job is not None:
            frames = message.arrays.get("frames")
            self._jobs.pop(job_id, None)
            provenance = message.get("provenance")
            error = message.get("error")  # a live job ended by a limit: the video is its chunks so far
            job._deliver(Result(job_id, message.blobs["video"], frames, message.get("seconds"), provenance, error))
        elif message.type == "error" and job is not None:
            self._end_job(job_id, message.fields["code"], message.fields["message"])

    def _apply_status(self, message: protocol.Message) -> None:
        if message.type != "status":
            return
        job = self._jobs.get(message.fields["job"])
        if job is None:
            return
        state, error = message.fields["state"], message.get("error")
        if state in ("failed", "cancelled") and isinstance(error, dict):
            self._end_job(job.id, str(error.get("code", state)), str(error.get("message", "")))
        elif state == "queued" and message.get("queue_position") is not None:
            job.queue_position = message.fields["queue_position"]

    def _end_job(self, job_id: str, code: str, text: str) -> None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            job._deliver(JobError(job_id, code, text))

    def _on_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._failed_handshakes = 0
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # A CURVE server drops a plain client mid-handshake (often with no detail): twice
                # in a row, with no success between, is a refusal, not a network hiccup.
                self._failed_handshakes += 1
                if self._failed_handshakes < 2:
                    continue
                kind = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            reason = _AUTH_EVENTS.get(kind)
            if reason is None:
                continue
            log.error("%s (%s)", reason, self.endpoint)
            self._refused = reason
            for request in self._pending.values():
                _settle(request.future, error=Unauthorized(reason))
            self._pending.clear()

    def _on_timers(self) -> None:
        now = time.monotonic()
        expired = [r for r in self._pending.values() if now >= r.try_deadline]
        for request in expired:
            if now >= request.deadline:
                del self._pending[request.rid]
                _settle(
                    request.future,
                    error=ServerUnavailable(
                        f"no answer from {self.endpoint} within {request.timeout:g} s "
                        f"({self.retries} tries); is `lingbot-isaac serve` running there?"
                    ),
                )
        if any(now >= r.try_deadline for r in self._pending.values()) and now >= self._next_reconnect:
            self._reconnect()
        if self._jobs and now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_s
            if now - self._last_contact > self.give_up_s:
                for job_id in list(self._jobs):
                    self._end_job(
                        job_id,
                        "unreachable",
                        f"no contact with {self.endpoint} for "
                        f"{now - self._last_contact:.0f} s; the job may still finish on the server "
                        f"(Client.watch({job_id!r}) follows it again)",
                    )
            else:
                self._heartbeat()

    def _heartbeat(self) -> None:
        """One `watch` per unfinished job (not already being watched): re-subscribes after a
        reconnect or a server restart (to the chunks and stills too, where the job asked for them)
        and fetches outcomes that were lost."""
        watching = {r.heartbeat_of for r in self._pending.values()}
        for job_id, job in list(self._jobs.items()):
            if job_id in watching:
                continue
            rid = self._new_rid()
            frames = protocol.encode("watch", {"rid": rid, "job": job_id, **job.wants})
            request = self._new_request(rid, frames, None, self._apply_status, heartbeat_of=job_id)
            request.future.add_done_callback(_quiet)
            self._pending[rid] = request
            self._send(request)

    def _reconnect(self) -> None:
        """Lazy Pirate: a fresh socket, and every pending request sent again on it."""
        self._reconnects += 1
        self._next_reconnect = time.monotonic() + min(5.0, 0.25 * 2 ** min(self._reconnects, 5))
        log.info("no reply from %s; reconnecting (attempt %d)", self.endpoint, self._reconnects)
        self._connect()
        for request in self._pending.values():
            self._send(request)
        self._next_heartbeat = time.monotonic()  # re-watch every job on the new connection

    def _shutdown(self) -> None:
        for request in self._pending.values():
            _settle(request.future, error=BridgeError("client closed"))
        self._pending.clear()
        for job_id in list(self._jobs):
            self._end_job(job_id, "closed", "the client was closed before the job finished")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "request":
                _settle(command[1].future, error=BridgeError("client closed"))
        if self._socket is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
        self._context.term()
        self._closed.set()


def _settle(future: concurrent.futures.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future unless its caller already cancelled it (or it was resolved)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled by its caller in the meantime


def _quiet(future: concurrent.futures.Future) -> None:
    future.exception()  # a heartbeat that failed is retried by the next one
