"""Client library for the generation server: submit episodes, follow progress, fetch the mp4.

    from bridge.client import Client, EpisodePayload
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
import dataclasses
import itertools
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from bridge import protocol
from bridge.protocol import Limits, ProtocolError
from bridge.security import load_public, load_secret, secure_client_socket
from contracts import connection, episode
from contracts.episode import EpisodeError
from contracts.settings import GenerationSettings

log = logging.getLogger("bridge.client")

DEFAULT_ENDPOINT = connection.DEFAULT_ENDPOINT
_AUTH_EVENTS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the server rejected this client's CurveZMQ key (it is not in the "
    "server's client_keys_dir allowlist)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security handshake failed: the client and the server disagree on "
    "CurveZMQ (one of them has keys, the other not, or the server key is wrong)",
}


class BridgeError(Exception):
    """Base of the client's errors."""


class ServerUnavailable(BridgeError, TimeoutError):
    """No answer from the server within the timeout, after the retries."""


class Unauthorized(BridgeError):
    """The server refused this client's CurveZMQ key, or the security set-ups do not match."""


class RequestFailed(BridgeError):
    """The server answered a request with an error (busy, bad_input, not_found, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class JobFailed(BridgeError):
    """A job ended without a video: failed, cancelled, or the server became unreachable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class PayloadError(EpisodeError):
    """An episode that cannot be sent: the message names the file or field."""


# ---------------------------------------------------------------------------------------------
# Events


@dataclasses.dataclass(frozen=True)
class Progress:
    job: str
    phase: str  # queued | starting | text | encode | denoise | decode | write
    step: int
    total: int
    eta_s: float | None = None  # seconds left, from the pace of the denoising steps
    queue_position: int | None = None  # with phase "queued": jobs that run before this one


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One finished part of the video (model = fast, asked for with want_chunks): chunks arrive in
    order, all before the Result, and their frames together are the result's frames."""

    job: str
    index: int
    total: int
    frames: int  # video frames in this chunk
    video: bytes  # an mp4 of just this chunk's frames
    still: bytes | None = None  # a small PNG of its last frame (asked for with want_stills; None otherwise)


@dataclasses.dataclass(frozen=True)
class Result:
    job: str
    video: bytes  # the mp4
    frames: np.ndarray | None = None  # uint8 [F, H, W, 3], if asked for (read-only)
    seconds: float | None = None
    provenance: dict[str, Any] | None = None  # what made the video (contracts.provenance), from the worker


@dataclasses.dataclass(frozen=True)
class JobError:
    job: str
    code: str
    message: str


Event = Progress | Chunk | Result | JobError
EventCallback = Callable[[Event], None]


# ---------------------------------------------------------------------------------------------
# The episode payload


@dataclasses.dataclass
class EpisodePayload:
    """What a submit carries: the first image, camera poses, intrinsics and the prompt."""

    image: bytes  # JPEG or PNG bytes
    poses: np.ndarray  # [N, 4, 4] camera-to-world, OpenCV axes
    intrinsics: np.ndarray  # [N, 4] fx, fy, cx, cy (LingBot's 480x832 convention)
    prompt: str
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.image, (bytes, bytearray)):
            raise PayloadError("image must be the bytes of a JPEG or PNG file")
        self.image = bytes(self.image)
        try:
            episode.image_format(self.image)
            # the one episode validator (the format's rules; how many poses a rollout needs is
            # the engine's to say, so a short episode comes back from it as bad_input)
            poses, intrinsics = episode.check_action(self.poses, self.intrinsics)
            self.prompt = episode.check_prompt(self.prompt, "prompt (prompt.txt)")
        except EpisodeError as exc:
            raise PayloadError(str(exc)) from None
        # float32 on the wire unless the caller's arrays were float64
        self.poses = poses.astype(np.float64 if np.asarray(self.poses).dtype == np.float64 else np.float32)
        self.intrinsics = intrinsics.astype(
            np.float64 if np.asarray(self.intrinsics).dtype == np.float64 else np.float32
        )

    @classmethod
    def from_dir(cls, episode_dir: str | os.PathLike) -> EpisodePayload:
        """Read an episode folder with the one episode reader (`contracts.episode.read_episode`);
        `episode.json` and anything else is not sent."""
        try:
            read = episode.read_episode(episode_dir)
        except EpisodeError as exc:
            raise PayloadError(str(exc)) from None
        return cls(read.image_path.read_bytes(), read.poses, read.intrinsics, read.prompt, name=read.path.name)

    def check_limits(self, limits: Limits) -> None:
        if len(self.image) > limits.max_image_bytes:
            raise PayloadError(f"image is {len(self.image)} bytes; the server takes at most {limits.max_image_bytes}")
        for name, array in (("poses", self.poses), ("intrinsics", self.intrinsics)):
            if len(array) > limits.max_poses:
                raise PayloadError(f"{name} has {len(array)} rows; the server takes at most {limits.max_poses}")
        if len(self.prompt.encode()) > limits.max_prompt_bytes:
            raise PayloadError(f"prompt is longer than {limits.max_prompt_bytes} bytes")


def settings_dict(settings: GenerationSettings | dict[str, Any] | None) -> dict[str, Any]:
    """Settings for the wire. A dict is a partial override of the server's preset (checked here
    first); a GenerationSettings is sent whole; None: the server's preset as it is."""
    if settings is None:
        return {}
    if isinstance(settings, GenerationSettings):
        return settings.to_dict()
    if not isinstance(settings, dict):
        raise TypeError(f"settings must be a GenerationSettings or a dict (got {type(settings).__name__})")
    GenerationSettings.from_dict(settings)  # raises SettingsError naming the bad key
    return dict(settings)


def submit_and_follow(
    client: Client,
    payload: EpisodePayload,
    settings: GenerationSettings | dict[str, Any] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_submitted: Callable[[Job], None] | None = None,
    timeout: float | None = None,
    on_chunk: Callable[[Chunk], None] | None = None,
    *,
    cancelled: Callable[[], bool] | None = None,
    check_alive_s: float | None = None,
    want_stills: bool = False,
) -> tuple[Job, Result]:
    """Submit an episode and follow it to its end: the one loop of the CLI, replay and the window.

    `on_submitted(job)` once the server accepted it; `on_progress(event)` for each Progress;
    `on_chunk(event)` for each finished chunk (asks for chunks: model = fast). The callbacks run
    on the calling thread, in the order the events came. Returns (job, Result).

    `cancelled()`: checked between events (at least every 0.1 s); once it says True the job is
    cancelled on the server (bounded by the client's timeout; a dead server cannot hold the
    caller) and JobFailed("cancelled") is raised without waiting for the job's end.
    `check_alive_s`: after this many seconds without an event, ask the server's health (raises
    ServerUnavailable when it is gone) instead of waiting for the client's `give_up_s`.
    `want_stills`: each Chunk also brings `still`, a small PNG of its last frame (for a viewer
    without a video decoder; an older server sends none).

    Raises JobFailed with the server's reason; TimeoutError when no event comes for `timeout`
    seconds, and KeyboardInterrupt or what a callback raised, after cancelling the job.
    """
    chunks = on_chunk is not None
    job = client.submit(payload, settings, want_chunks=chunks, want_stills=chunks and want_stills)
    if on_submitted is not None:
        on_submitted(job)
    # Without a cancel check or a liveness check one wait per event is enough (as before).
    poll = _FOLLOW_POLL_S if cancelled is not None or check_alive_s is not None else None
    index = 0
    last_event = last_contact = time.monotonic()
    gone: ServerUnavailable | None = None
    try:
        while gone is None:
            if cancelled is not None and cancelled():
                with contextlib.suppress(BridgeError, TimeoutError):
                    client.cancel(job.id)
                raise JobFailed("cancelled", f"job {job.id} cancelled by this client")
            now = time.monotonic()
            if timeout is not None and now - last_event >= timeout:
                raise TimeoutError(f"no event from job {job.id} for {timeout} s")
            wait = timeout if poll is None else poll
            if timeout is not None:
                wait = min(wait, max(0.0, last_event + timeout - now))
            try:
                event = job.event(index, timeout=wait)
            except TimeoutError:
                if check_alive_s is not None and time.monotonic() - last_contact >= check_alive_s:
                    try:
                        client.health()  # nothing for a while: is the server still there?
                        last_contact = time.monotonic()
                    except ServerUnavailable as exc:
                        gone = exc  # no cancel: there is nobody to send it to
                continue
            index += 1
            last_event = last_contact = time.monotonic()
            if isinstance(event, Progress) and on_progress is not None:
                on_progress(event)
            elif isinstance(event, Chunk) and on_chunk is not None:
                on_chunk(event)
            elif isinstance(event, JobError):
                raise JobFailed(event.code, event.message)
            elif isinstance(event, Result):
                return job, event
    except JobFailed:
        raise  # the job is over (or was cancelled just above)
    except BaseException:  # no progress for `timeout`, Ctrl-C, or a callback that raised: no orphan job
        with contextlib.suppress(BridgeError, TimeoutError):
            client.cancel(job.id)
        raise
    raise ServerUnavailable(f"{client.endpoint} stopped answering while job {job.id} ran ({gone})") from gone


_FOLLOW_POLL_S = 0.1  # how often submit_and_follow looks at `cancelled()` while no event comes


# ---------------------------------------------------------------------------------------------
# Jobs


class Job:
    """A submitted job. Its events arrive on the client's I/O thread; read them from any thread."""

    def __init__(self, client: Client, job_id: str, queue_position: int | None) -> None:
        self.id = job_id
        self.queue_position = queue_position
        self._client = client
        self._cond = threading.Condition()
        self._history: list[Event] = []
        self._callbacks: list[EventCallback] = []
        self.latest: Progress | None = None
        self.outcome: Result | JobError | None = None

    def __repr__(self) -> str:
        state = type(self.outcome).__name__ if self.outcome else (self.latest.phase if self.latest else "submitted")
        return f"Job({self.id!r}, {state})"

    def done(self) -> bool:
        """True once a Result or JobError has arrived (never blocks)."""
        return self.outcome is not None

    def add_callback(self, callback: EventCallback) -> None:
        """Call `callback(event)` for each later event (on the I/O thread); at once if already over."""
        with self._cond:
            self._callbacks.append(callback)
            outcome = self.outcome
        if outcome is not None:
            _call(callback, outcome)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Every event from the start: Progress ..., then one Result or JobError, then stop.
        `timeout`: the longest wait for the next event (TimeoutError); None waits until the job
        ends, which the client bounds by `give_up_s` when the server is unreachable."""
        index = 0
        while True:
            event = self.event(index, timeout)
            index += 1
            yield event
            if isinstance(event, (Result, JobError)):
                return

    def event(self, index: int, timeout: float | None = None) -> Event:
        """The job's `index`-th event (0: the first), waiting at most `timeout` s for it to come
        (TimeoutError). For callers that follow a job in steps, e.g. to check a cancel between."""
        with self._cond:
            while index >= len(self._history):
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no event from job {self.id} for {timeout} s")
            return self._history[index]

    def wait(self, timeout: float | None = None) -> Result | JobError:
        with self._cond:
            if not self._cond.wait_for(lambda: self.outcome is not None, timeout):
                raise TimeoutError(f"job {self.id} not finished after {timeout} s")
            return self.outcome

    def result(self, timeout: float | None = None) -> bytes:
        """The mp4 bytes; raises JobFailed if the job failed or was cancelled, TimeoutError if it
        is not done within `timeout` (the job goes on)."""
        outcome = self.wait(timeout)
        if isinstance(outcome, JobError):
            raise JobFailed(outcome.code, outcome.message)
        return outcome.video

    @property
    def frames(self) -> np.ndarray | None:
        return self.outcome.frames if isinstance(self.outcome, Result) else None

    @property
    def provenance(self) -> dict[str, Any] | None:
        """The provenance record of the result (None before it, or from a worker that wrote none)."""
        return self.outcome.provenance if isinstance(self.outcome, Result) else None

    def cancel(self, timeout: float | None = None) -> dict[str, Any]:
        return self._client.cancel(self.id, timeout=timeout)

    def status(self, timeout: float | None = None) -> dict[str, Any]:
        return self._client.status(self.id, timeout=timeout)

    def _deliver(self, event: Event) -> bool:
        """Called on the I/O thread. False if the job was already over (duplicates are dropped)."""
        with self._cond:
            if self.outcome is not None:
                return False
            if isinstance(event, Progress):
                self.latest = event
                if event.queue_position is not None:
                    self.queue_position = event.queue_position
            elif not isinstance(event, Chunk):
                self.outcome = event
            self._history.append(event)
            self._cond.notify_all()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            _call(callback, event)
        return True


def _call(callback: EventCallback, event: Event) -> None:
    try:
        callback(event)
    except Exception:
        log.exception("job event callback raised; ignored")


# ---------------------------------------------------------------------------------------------
# The client


@dataclasses.dataclass
class _Request:
    rid: str
    frames: list
    future: concurrent.futures.Future
    timeout: float  # the whole call's budget
    deadline: float  # ... and its end
    try_timeout: float
    try_deadline: float = 0.0
    on_reply: Callable[[protocol.Message], Any] | None = None  # runs on the I/O thread; its value resolves
    heartbeat_of: str | None = None  # the job a heartbeat `watch` is about


class Client:
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
        self._pending: dict[str, _Request] = {}
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
        rid = self._new_rid()
        fields = {
            "rid": rid,
            "client": self.client_id,
            "prompt": payload.prompt,
            "settings": settings_dict(settings),
            "want_frames": bool(want_frames),
        }
        if want_chunks:  # sent only when asked: older servers ignore it, older clients never see a chunk
            fields["want_chunks"] = True
            if want_stills:  # the same: only a client that asked meets a chunk's `still` frame
                fields["want_stills"] = True
        if payload.name:
            fields["name"] = payload.name[:200]
        frames = protocol.encode(
            "submit",
            fields,
            {"poses": payload.poses, "intrinsics": payload.intrinsics},
            {"image": payload.image},
        )

        def on_reply(message: protocol.Message) -> Job:
            if message.type != "accepted":
                raise ProtocolError(f"expected 'accepted', got {message.type!r}")
            job = self._jobs.get(message.fields["job"])
            if job is None:
                job = Job(self, message.fields["job"], message.fields["queue_position"])
                if on_event is not None:
                    job.add_callback(on_event)
                self._jobs[job.id] = job
            return job

        return self._request(rid, frames, timeout, on_reply)

    def watch(self, job_id: str, on_event: EventCallback | None = None, timeout: float | None = None) -> Job:
        """Follow a job submitted earlier (by this or another process)."""
        job = Job(self, job_id, None)
        if on_event is not None:
            job.add_callback(on_event)
        rid = self._new_rid()

        def on_reply(message: protocol.Message) -> Job:
            self._jobs.setdefault(job_id, job)
            self._apply_status(message)
            return self._jobs.get(job_id, job)

        frames = protocol.encode("watch", {"rid": rid, "job": job_id})
        return self._wait(self._request(rid, frames, timeout, on_reply), timeout)

    def cancel(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Cancel a queued job (at once) or a running one (at its next denoising step). Returns the
        job's status; the job itself then ends with JobError("cancelled")."""
        return self._wait(self.cancel_async(job_id, timeout), timeout)

    def cancel_async(self, job_id: str, timeout: float | None = None) -> concurrent.futures.Future:
        rid = self._new_rid()
        return self._request(rid, protocol.encode("cancel", {"rid": rid, "job": job_id}), timeout, _fields)

    def status(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """state (queued/running/done/failed/cancelled), queue_position, phase, step, total, error."""
        rid = self._new_rid()
        frames = protocol.encode("status", {"rid": rid, "job": job_id})
        return self._wait(self._request(rid, frames, timeout, _fields), timeout)

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's and the worker's state: ok, model, gpu, memory, queue, worker, server."""
        return self._wait(self.health_async(timeout), timeout)

    def health_async(self, timeout: float | None = None) -> concurrent.futures.Future:
        rid = self._new_rid()
        return self._request(rid, protocol.encode("health", {"rid": rid}), timeout, _fields)

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
    ) -> _Request:
        timeout = self.timeout if timeout is None else float(timeout)
        future: concurrent.futures.Future = concurrent.futures.Future()
        deadline = time.monotonic() + timeout
        return _Request(rid, frames, future, timeout, deadline, timeout / self.retries, 0.0, on_reply, heartbeat_of)

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

    # -- the I/O thread ----------------------------------------------------------------------

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
            request: _Request = command[1]
            if self._refused is not None:  # the handshake failed before this request was made
                _settle(request.future, error=Unauthorized(self._refused))
                continue
            self._pending[request.rid] = request
            self._send(request)

    def _send(self, request: _Request) -> None:
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
            job._deliver(Chunk(job_id, f["index"], f["total"], f["frame_count"], message.blobs["video"], still))
        elif message.type == "result" and job is not None:
            frames = message.arrays.get("frames")
            self._jobs.pop(job_id, None)
            provenance = message.get("provenance")
            job._deliver(Result(job_id, message.blobs["video"], frames, message.get("seconds"), provenance))
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
        reconnect or a server restart and fetches outcomes that were lost."""
        watching = {r.heartbeat_of for r in self._pending.values()}
        for job_id in list(self._jobs):
            if job_id in watching:
                continue
            rid = self._new_rid()
            frames = protocol.encode("watch", {"rid": rid, "job": job_id})
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


def _fields(message: protocol.Message) -> dict[str, Any]:
    return dict(message.fields)


def _quiet(future: concurrent.futures.Future) -> None:
    future.exception()  # a heartbeat that failed is retried by the next one
