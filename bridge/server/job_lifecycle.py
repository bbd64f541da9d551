"""The job lifecycle on the server's side of the worker pool: queued jobs handed to idle
workers in the fair queue's order, and the worker's events (progress, chunks, result, error,
health) turned into job state changes, retries and requeues.

A mixin of `bridge.server.server.Server`. A job is "running" only once the worker has its `run`
message; a result is checked complete and fsynced before the job is saved "done".
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from pathlib import Path
from typing import Any

from bridge.server.jobs import Job
from bridge.server.mp4 import IncompleteVideo, check_complete
from bridge.wire import protocol
from bridge.wire.protocol import ProtocolError
from bridge.workers import worker_protocol as wp
from bridge.workers.supervisor import Event
from contracts import atomic

log = logging.getLogger("bridge.server.server")

MAX_STORAGE_REQUEUES = 5  # a job that hits spool errors this often in a row is failed


class JobLifecycle:
    def _dispatch(self) -> None:
        """Hand queued jobs to idle workers, strictly in the queue's fair order: the job at the head
        starts when the workers it needs are idle (two for a `gpus = 2` job: until then the jobs
        behind it wait too, so it is never passed over; bridge/workers/worker_pool.py). A job moves to
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
                        **self._live_run_fields(job),  # a live job: where its poses appear
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
                  "total": _count(data.get("total")), "frame_count": _count(data.get("frames")),
                  **self._live_chunk_fields(job, data)}  # fmt: skip
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
        # done, with its video; a live job ended by a limit names it (bridge/server/live_jobs.py)
        self._finish(job, "done", self._live_limit(job))
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
        limit = self._live_limit(job)
        if limit is not None and code == "bad_input":  # a live job a limit ended before its first chunk
            code, message = limit["code"], limit["message"]
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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else 0
