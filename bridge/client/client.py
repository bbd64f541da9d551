"""Client library for the generation server: submit episodes, follow progress, fetch the mp4.

    from bridge.client.client import Client, EpisodePayload
    with Client() as client:  # contracts.connection's endpoint (loopback) and request timeout
        job = client.submit(EpisodePayload.from_dir("episode_0001"), {"steps": 4})
        for event in job.events():          # Progress ..., then Result or JobError
            print(event)
        mp4_bytes = job.result(timeout=60)

Threading: one background I/O thread owns the DEALER socket (ZeroMQ sockets are not thread-safe)
and every timer; the public methods hand it work and wait on a future, each for at most its
timeout. So any thread may call the client, a UI thread can use `submit_async` and `job.done()`
and never block, and callbacks (`on_event`) run on the I/O thread (keep them short; marshal to
the UI thread yourself).

Reliability (zguide's Lazy Pirate): a request that gets no reply in its share of the timeout is
re-sent on a fresh socket (LINGER 0, so nothing lingers), with backoff between reconnects;
`submit` carries a request id the server de-duplicates, so a retry never makes two jobs. While
jobs run, the client sends a `watch` heartbeat per job; that re-subscribes after a reconnect or a
server restart, and fetches an outcome that was lost on the way. If the server stays unreachable
for `give_up_s`, unfinished jobs end with a JobError("unreachable"): nothing waits forever.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from bridge.client.client_errors import BridgeError, ServerUnavailable
from bridge.client.client_io import ClientIO, Request
from bridge.client.client_job import Job, wanted
from bridge.client.episode_payload import EpisodePayload, settings_dict
from bridge.client.job_events import EventCallback
from bridge.wire import protocol
from bridge.wire.protocol import Limits, ProtocolError
from contracts import connection
from contracts.settings import GenerationSettings

log = logging.getLogger("bridge.client.client")


DEFAULT_ENDPOINT = connection.DEFAULT_ENDPOINT


class Client(ClientIO):
    """A connection to one generation server. Thread-safe; close() it (or use `with`)."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        timeout: float = connection.REQUEST_TIMEOUT_S,
        retries: int = 3,
        *,
        server_key: bytes | str | os.PathLike | None = None,
        client_key: str | os.PathLike | tuple[bytes, bytes] | None = None,
        client_id: str | None = None,
        heartbeat_s: float = 5.0,
        give_up_s: float = 300.0,
        limits: Limits | None = None,
    ) -> None:
        """`timeout`: the longest any one call waits, retries included (`retries` tries share it).
        CurveZMQ: `server_key` is the server's public key (bytes or its `server.key` file),
        `client_key` this client's `.key_secret` file (or a (public, secret) pair)."""
        if timeout <= 0 or retries < 1:
            raise ValueError("timeout must be > 0 and retries >= 1")
        self.endpoint, self.timeout, self.retries = endpoint, float(timeout), int(retries)
        self.heartbeat_s, self.give_up_s, self.limits = heartbeat_s, give_up_s, limits or Limits()
        self.client_id = client_id or uuid.uuid4().hex
        # The server knows this client by its connection's routing id (or its CurveZMQ key): a
        # random one kept across reconnects, so a retried submit is still recognised as a retry.
        self._routing_id = b"L" + uuid.uuid4().bytes
        if not protocol._ID_RE.match(self.client_id):
            raise ValueError("client_id must be 1-64 characters of [A-Za-z0-9._:@/+=-]")
        self._curve = self._load_curve(server_key, client_key)
        self._rids = itertools.count(1)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._context = zmq.Context()
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._pending: dict[str, Request] = {}
        self._jobs: dict[str, Job] = {}  # unfinished jobs this client follows
        self._last_contact = time.monotonic()
        self._next_heartbeat = time.monotonic() + heartbeat_s
        self._reconnects = 0
        self._next_reconnect = 0.0
        self._closed = threading.Event()
        self._refused: str | None = None  # the server refused our handshake (kept: it will again)
        self._failed_handshakes = 0
        self._connect()
        self._thread = threading.Thread(target=self._io_loop, name="bridge-client-io", daemon=True)
        self._thread.start()

    # -- public API (any thread) -------------------------------------------------------------

    def submit(
        self,
        payload: EpisodePayload,
        settings: GenerationSettings | dict[str, Any] | None = None,
        *,
        want_frames: bool = False,
        want_chunks: bool = False,
        want_stills: bool = False,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
    ) -> Job:
        """Send an episode; returns once the server has it on disk (its queue position known).
        Raises RequestFailed (busy, bad_input, bad_settings ...) or ServerUnavailable.
        `want_chunks`: get each finished chunk as a Chunk event (model = fast); `want_stills`: with
        a PNG of its last frame (`Chunk.still`)."""
        future = self.submit_async(
            payload,
            settings,
            want_frames=want_frames,
            want_chunks=want_chunks,
            want_stills=want_stills,
            on_event=on_event,
            timeout=timeout,
        )
        return self._wait(future, timeout)

    def submit_async(
        self,
        payload: EpisodePayload,
        settings: GenerationSettings | dict[str, Any] | None = None,
        *,
        want_frames: bool = False,
        want_chunks: bool = False,
        want_stills: bool = False,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future:
        """Like submit, without blocking: a Future of the Job."""
        payload.check_limits(self.limits)
        fields = {
            "client": self.client_id,
            "prompt": payload.prompt,
            "settings": settings_dict(settings),
            "want_frames": bool(want_frames),
        }
        wants = wanted(want_chunks, want_stills)
        fields.update(wants)
        if payload.name:
            fields["name"] = payload.name[:200]
        arrays = {"poses": payload.poses, "intrinsics": payload.intrinsics}
        return self.call_async(
            "submit", fields, arrays, {"image": payload.image},
            on_reply=lambda message: self.accepted_job(message, wants, on_event), timeout=timeout,
        )  # fmt: skip

    def watch(
        self,
        job_id: str,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
        *,
        want_chunks: bool = False,
        want_stills: bool = False,
    ) -> Job:
        """Follow a job submitted earlier (by this or another process). `want_chunks` (`want_stills`):
        also get its Chunk events from now on (a Fast job's chunks made before are in its result)."""
        job = Job(self, job_id, None, wanted(want_chunks, want_stills))
        if on_event is not None:
            job.add_callback(on_event)

        def on_reply(message: protocol.Message) -> Job:
            self._jobs.setdefault(job_id, job)
            self._apply_status(message)
            return self._jobs.get(job_id, job)

        return self.call("watch", {"job": job_id, **job.wants}, on_reply=on_reply, timeout=timeout)

    def cancel(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Cancel a queued job (at once) or a running one (at its next denoising step). Returns the
        job's status; the job itself then ends with JobError("cancelled")."""
        return self._wait(self.cancel_async(job_id, timeout), timeout)

    def cancel_async(self, job_id: str, timeout: float | None = None) -> concurrent.futures.Future:
        return self.call_async("cancel", {"job": job_id}, timeout=timeout)

    def status(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """state (queued/running/done/failed/cancelled), queue_position, phase, step, total, error."""
        return self.call("status", {"job": job_id}, timeout=timeout)

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's and the worker's state: ok, model, gpu, memory, queue, worker, server."""
        return self._wait(self.health_async(timeout), timeout)

    def health_async(self, timeout: float | None = None) -> concurrent.futures.Future:
        return self.call_async("health", timeout=timeout)

    def reload(self, timeout: float | None = None) -> int:
        """Ask the server to start again the workers it gave up on (a configuration error is not
        retried on a timer); -> how many it started."""
        return int(self.call("reload", timeout=timeout)["restarted"])

    def call(
        self,
        type_: str,
        fields: dict[str, Any] | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        blobs: dict[str, bytes] | None = None,
        *,
        on_reply: Callable[[protocol.Message], Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One request of `type_` (its rid added here), retried as every request is (Lazy Pirate), and
        its answer: `on_reply(message)`, by default the reply's fields. Raises RequestFailed (the
        server's error answer) or ServerUnavailable. The requests above use it, and so can a protocol
        extension's client (`bridge.client.live_client`)."""
        future = self.call_async(type_, fields, arrays, blobs, on_reply=on_reply, timeout=timeout)
        return self._wait(future, timeout)

    def call_async(
        self,
        type_: str,
        fields: dict[str, Any] | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        blobs: dict[str, bytes] | None = None,
        *,
        on_reply: Callable[[protocol.Message], Any] | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future:
        """`call` without blocking: a Future of the answer."""
        rid = self._new_rid()
        frames = protocol.encode(type_, {"rid": rid, **(fields or {})}, arrays, blobs)
        return self._request(rid, frames, timeout, on_reply or _fields)

    def accepted_job(
        self, message: protocol.Message, wants: dict[str, bool], on_event: EventCallback | None = None
    ) -> Job:
        """The Job an `accepted` answer names: the one this client follows already (the answer to a
        retried request), else a new one it follows from now on."""
        if message.type != "accepted":
            raise ProtocolError(f"expected 'accepted', got {message.type!r}")
        job = self._jobs.get(message.fields["job"])
        if job is None:
            job = Job(self, message.fields["job"], message.fields["queue_position"], wants)
            if on_event is not None:
                job.add_callback(on_event)
            self._jobs[job.id] = job
        return job

    def close(self) -> None:
        """Stop the I/O thread; unfinished jobs end with JobError("closed"). Idempotent, bounded."""
        if self._closed.is_set():
            return
        self._post(("close",))
        if threading.current_thread() is self._thread:
            return  # called from a callback: the I/O thread stops after it returns
        self._thread.join(timeout=5.0)
        self._closed.set()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing between callers and the I/O thread -----------------------------------------

    def _new_rid(self) -> str:
        return f"{self.client_id[:40]}-{next(self._rids)}"

    def _request(self, rid: str, frames: list, timeout: float | None, on_reply) -> concurrent.futures.Future:
        request = self._new_request(rid, frames, timeout, on_reply)
        if self._closed.is_set():
            request.future.set_exception(BridgeError("client is closed"))
        else:
            self._post(("request", request))
        return request.future

    def _new_request(
        self, rid: str, frames: list, timeout: float | None, on_reply: Any, heartbeat_of: str | None = None
    ) -> Request:
        timeout = self.timeout if timeout is None else float(timeout)
        future: concurrent.futures.Future = concurrent.futures.Future()
        deadline = time.monotonic() + timeout
        return Request(rid, frames, future, timeout, deadline, timeout / self.retries, 0.0, on_reply, heartbeat_of)

    def _wait(self, future: concurrent.futures.Future, timeout: float | None) -> Any:
        if threading.current_thread() is self._thread:
            future.cancel()
            raise RuntimeError("a blocking Client call inside an event callback would wait on itself; "
                               "use the *_async variant there")  # fmt: skip
        # The I/O thread resolves every future by its deadline; the margin covers a busy machine.
        try:
            return future.result(timeout=(self.timeout if timeout is None else timeout) + 5.0)
        except concurrent.futures.TimeoutError:
            raise ServerUnavailable(f"no answer from {self.endpoint}") from None

    def _post(self, command: tuple) -> None:
        self._commands.put(command)
        with contextlib.suppress(OSError):  # a full pipe means the I/O thread is due to wake anyway
            os.write(self._wake_w, b"!")


def _fields(message: protocol.Message) -> dict[str, Any]:
    return dict(message.fields)
