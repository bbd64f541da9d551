"""Result streaming: a finished job's outcome (its `result` message, or its error) and its
events (progress, queue positions) sent to the connections subscribed to it.

A mixin of `bridge.server.server.Server`. A result message is read once and shared (zero-copy) by every
peer it goes to; sends never block, and a peer that asks again for a result it was sent moments
ago waits `RESEND_RESULT_AFTER_S`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import zmq

from bridge.server.jobs import Job
from bridge.wire import protocol
from contracts.provenance import read_record

log = logging.getLogger("bridge.server.server")

RESEND_RESULT_AFTER_S = 10.0  # a peer that asks again for a result it was sent gets it again after this


class Outcome:
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


class ResultStreaming:
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
                    outcome = self.outcomes[job.id] = Outcome(self._result_frames(job))
                except (OSError, ValueError) as exc:
                    log.error("job %s: cannot read its result: %s", job.id, exc)
                    self._send(peer, protocol.error_frames("storage", f"cannot read the result now: {exc}", job=job.id))
                    continue
            tracker = self._send(peer, outcome.frames, track=True)
            if tracker is not None:
                outcome.in_flight[peer] = tracker
                self.sent_at[(peer, job.id)] = now
                job.fetched = True  # in memory and on its way: the file may go (bridge/server/eviction.py)

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
        if job.error:  # a live job ended by a limit: its video is the chunks made so far
            fields["error"] = job.error
        provenance, note = read_record(job.result_path)  # the worker's record beside result.mp4
        provenance = self._live_provenance(
            job, provenance
        )  # a live job's per-chunk timings (bridge/server/live_jobs.py)
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
