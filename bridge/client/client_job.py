"""A submitted job as its client sees it: its events (arriving on the client's I/O thread), read
from any thread, its outcome, and cancel/status through the client that follows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from bridge.client.client_errors import JobFailed
from bridge.client.job_events import Chunk, Event, EventCallback, JobError, Progress, Result

log = logging.getLogger("bridge.client.client")


def wanted(chunks: bool, stills: bool) -> dict[str, bool]:
    """The `want_chunks` / `want_stills` fields of a submit, live open or watch: sent only when asked
    (older servers ignore them; a client that never asked never meets a `chunk` or its `still`)."""
    return {"want_chunks": True, **({"want_stills": True} if stills else {})} if chunks else {}


class Job:
    """A submitted job. Its events arrive on the client's I/O thread; read them from any thread.
    `client`: the `bridge.client.client.Client` that follows it (its cancel and status)."""

    def __init__(
        self, client: Any, job_id: str, queue_position: int | None, wants: dict[str, bool] | None = None
    ) -> None:
        self.id = job_id
        self.queue_position = queue_position
        # what the client asked for beyond the outcome (want_chunks, want_stills): each `watch` of the
        # job asks again, so a new connection (a reconnect, a restarted server) keeps getting them
        self.wants = dict(wants or {})
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
