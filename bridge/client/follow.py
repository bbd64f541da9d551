"""`submit_and_follow`: submit an episode and follow its job to its end, the one follow loop of
the `submit` command, `replay` and the Isaac window."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from bridge.client.client import Client
from bridge.client.client_errors import BridgeError, JobFailed, ServerUnavailable
from bridge.client.client_job import Job
from bridge.client.episode_payload import EpisodePayload
from bridge.client.job_events import Chunk, JobError, Progress, Result
from contracts.settings import GenerationSettings


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
