"""Live jobs on the server: a Fast rollout whose camera path arrives while it runs (docs/protocol.md,
"Live jobs").

A live job is an ordinary job (`bridge.server.jobs.Job`: queued, running, done ...; spooled, resumed after a
restart, cancelled, failed with the worker) plus its pose feed, kept on disk in the job's folder:

    SPOOL/jobs/JOB/live/poses-000000.npy ...   pose batch `seq`, written atomically before `poses_ok`
    SPOOL/jobs/JOB/live/end                    the job takes no more poses (`end`, or a limit: then the
                                               limit's {"code", "message"}, JSON)
    SPOOL/jobs/JOB/live.json                   per-chunk timings, written when the job ends

The worker (`worldgen.worker`, `worldgen.live_rollout`) reads the batches from that folder as they
appear (the server nudges it with `live_poses`); chunk k starts once the poses it needs are there
(`worldgen.pipelines.fast_live.poses_needed`; the worker says how many each chunk needs in its `live`
message). Nothing accepted is lost: a restarted server rebuilds the feed from the folder and the job
runs again from the same poses (the same chunks, so a client keeps what it has and takes the rest).

Bounds: a job takes at most `frame_num` poses (its planned length: the frame limit); poses more than
`live_ahead_chunks` chunks ahead of the chunks already sent are refused with `busy` (the reply says
how far behind the model is). Two limits hold a slow or silent client to a live job's promise (a
worker is the server's scarcest part): both count only the time its running model waits for its
poses (never the queue, never a model still making chunks whose poses it holds, which is the model's
time, as a batch job's is), and either ends the job with its chunks so far as its result and names
itself in the job's `error` (`live_gap`, `live_deadline`; a job that made no chunk fails with it):

- `live_max_gap_s`: the longest wait for the next pose batch (from the last batch, the last chunk
  sent or the job's start, whichever is latest);
- the deadline: all the waits together, at most `live_deadline_factor` x the job's real-time length
  (frame_num / fps) + `live_deadline_extra_s` (bridge.server.server_config).

When one fires the model is waiting for poses, so it stops at once (the `end` file and a nudge): the
worker is free for the next job. Chunks go to the client that opened the job like any `chunk`
(non-blocking sends: a client that stops reading loses chunks, never the server's memory; the
result keeps every frame).

A mixin of `bridge.server.server.Server`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bridge.server.engine_rules import check_first_frame
from bridge.server.jobs import Job
from bridge.wire import protocol
from bridge.wire.live_protocol import LiveOpen, PoseBatch
from bridge.wire.protocol import JobRequest, ProtocolError
from bridge.workers import worker_protocol as wp
from contracts import atomic, episode
from contracts.settings import FIELD_BY_NAME

log = logging.getLogger("bridge.server.server")

LIVE_DIR = "live"
END_FILE = wp.LIVE_END_FILE
TIMINGS_FILE = "live.json"
LIMIT_CODES = ("live_gap", "live_deadline")  # error codes of bridge.wire.protocol: the limits that end a job


def batch_path(job: Job, seq: int) -> Path:
    return job.dir / LIVE_DIR / wp.LIVE_BATCH_FILE.format(seq=seq)


def is_live(job: Job) -> bool:
    return (job.dir / LIVE_DIR).is_dir()


@dataclasses.dataclass
class LiveFeed:
    """A live job's poses as the server holds them (the files are the truth; this is their index)."""

    opened: float  # time.time() of the job's acceptance: every timing is in seconds since then
    planned_poses: int  # frame_num: the most poses the job takes
    real_time_s: float  # frame_num / fps: the video's length played back (the deadline's unit)
    batches: int = 0
    poses: int = 0
    ended: bool = False
    # the last batch, chunk sent or start (time.monotonic()): the gap's clock
    last_poses: float = dataclasses.field(default_factory=time.monotonic)
    waited: float = 0.0  # seconds the running model waited for this job's poses: the deadline's clock
    ticked: float | None = None  # the server loop's last look at the clocks (time.monotonic())
    limit: dict[str, str] | None = None  # the limit that ended the feed: {"code": one of LIMIT_CODES, "message"}
    received: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (poses held after a batch, s)
    needed: list[int] | None = None  # poses each chunk needs (the worker's `live` message)
    chunks: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # per sent chunk: poses and timings

    def since_open(self, when: float | None = None) -> float:
        return round((time.time() if when is None else when) - self.opened, 4)

    def model_busy(self) -> bool:
        """The model is not waiting for poses: it has not said what its chunks need (loading, or not
        started), or it holds the poses of a chunk it has not sent yet."""
        return self.needed is None or self.chunks_ready() > len(self.chunks)

    def chunks_ready(self) -> int:
        if self.needed is None:
            return 0
        return sum(1 for need in self.needed if need <= self.poses)

    def received_at(self, count: int) -> float | None:
        """When the server held `count` poses (the batch that brought them)."""
        return next((t for held, t in self.received if held >= count), None)

    def status(self) -> dict[str, Any]:
        ready, sent = self.chunks_ready(), len(self.chunks)
        return {"poses": self.poses, "chunks_ready": ready, "chunks_sent": sent,
                "behind": max(0, ready - sent), "ended": self.ended}  # fmt: skip


def accept_live(spool, client: str, request: LiveOpen, settings: dict[str, Any], size: int) -> Job:
    """Write a live job durably (its episode without poses, its empty pose feed), as `Spool.accept`;
    `size`: what it may hold in the spool (its inputs and room for its poses)."""
    job_id = uuid.uuid4().hex
    staging = spool.incoming_dir / job_id
    record = Job(id=job_id, dir=spool.jobs_dir / job_id, client=client, rid=request.rid, seq=spool._next_seq,
                 created=time.time(), settings=settings, name=request.name, input_bytes=size)  # fmt: skip
    spool._next_seq += 1
    try:
        folder = staging / "episode"
        folder.mkdir(parents=True)
        episode.check_prompt(request.prompt)
        np.save(folder / episode.INTRINSICS_FILE, np.asarray(request.intrinsics, dtype=np.float32))
        name = "image.jpg" if request.image_format == "jpeg" else "image.png"
        (folder / name).write_bytes(request.image)
        (folder / episode.PROMPT_FILE).write_text(request.prompt, encoding="utf-8")
        (staging / LIVE_DIR).mkdir()
        (staging / "job.json").write_text(json.dumps(record.job_json()))
        (staging / "state.json").write_text(json.dumps(record.state_json()))
        atomic.replace_dir(staging, record.dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def real_time_s(settings: dict[str, Any]) -> float:
    """A job's video length played back: frame_num / fps (its settings')."""
    fps = settings.get("fps") or FIELD_BY_NAME["fps"].default
    return int(settings.get("frame_num", 0)) / fps


def read_limit(path: Path) -> dict[str, str] | None:
    """The limit an `end` file names (a client's `end` leaves none)."""
    try:
        limit = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    if isinstance(limit, dict) and limit.get("code") in LIMIT_CODES and isinstance(limit.get("message"), str):
        return {"code": limit["code"], "message": limit["message"]}
    return None


def load_feed(job: Job) -> LiveFeed:
    """A live job's feed rebuilt from its folder (a restarted server): batches in order, up to the first gap."""
    feed = LiveFeed(opened=job.created, planned_poses=int(job.settings.get("frame_num", 0)),
                    real_time_s=real_time_s(job.settings))  # fmt: skip
    while batch_path(job, feed.batches).is_file():
        path = batch_path(job, feed.batches)
        try:
            count = len(np.load(path, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError) as exc:
            log.error("job %s: pose batch %s unreadable (%s); the feed stops before it", job.id, path.name, exc)
            break
        feed.batches += 1
        feed.poses += count
        feed.received.append((feed.poses, round(path.stat().st_mtime - job.created, 4)))
    end = job.dir / LIVE_DIR / END_FILE
    feed.ended = end.exists() or feed.poses >= feed.planned_poses
    feed.limit = read_limit(end) if end.exists() else None
    return feed


class LiveJobs:
    """The server's live-job requests (`live`, `poses`, `end`), the worker's `live` message, the
    chunks' timings and the two limits (gap, deadline)."""

    def _live_feeds(self) -> dict[str, LiveFeed]:
        feeds = getattr(self, "_feeds", None)
        if feeds is None:
            feeds = self._feeds = {}
            for job in self.jobs.values():  # jobs recovered from the spool
                if not job.terminal and is_live(job):
                    feeds[job.id] = load_feed(job)
        return feeds

    def _on_live(self, peer: bytes, client: str, request: LiveOpen) -> None:
        rid = request.rid
        existing = self.jobs.get(self.by_request.get((client, rid), ""))
        if existing is not None:  # a retried open
            self._reply_accepted(peer, rid, existing)
            return
        try:
            settings = self._job_settings(request.settings)
            if settings.model == "fast":  # (another model is refused below, in a live job's words)
                check_first_frame(settings, request.image, "live image")  # the batch door's rules
        except ProtocolError as exc:
            self._refuse(peer, rid, exc.code, str(exc))
            return
        if settings.model != "fast":
            self._refuse(peer, rid, "bad_settings", f"settings: a live job needs model \"fast\" (the causal "
                         f"LingBot-World-Fast); model {settings.model!r} generates from a complete camera path: "
                         "submit it as a batch job")  # fmt: skip
            return
        if not hasattr(self.supervisor, "tell_job"):
            self._refuse(peer, rid, "unavailable", "this server's worker backend does not run live jobs")
            return
        if self.unavailable or self.storage_error:
            self._refuse(peer, rid, "unavailable" if self.unavailable else "storage",
                         self.unavailable or f"the server cannot store jobs now: {self.storage_error}")  # fmt: skip
            return
        if len(self.queue) >= self.config.max_queue or self.queue.count(client) >= self.config.max_queue_per_client:
            self._refuse(peer, rid, "busy", "the queue (or your share of it) is full; try again later")
            return
        size = len(request.image) + request.intrinsics.nbytes + len(request.prompt) + 4096 + settings.frame_num * 128
        self._make_room(size, client)
        used, per_client = self.spool_usage()
        if used + size > self.quota_bytes() or (  # the quota in force (bridge/server/eviction.py)
            per_client.get(client, 0) + size > self.quota_per_client_bytes()
        ):
            self._refuse(peer, rid, "busy", "the spool quota (or your share of it) is used up; try again when "
                         "jobs have ended")  # fmt: skip
            return
        try:
            job = accept_live(self.spool, client, request, settings.to_dict(), size)
        except OSError as exc:
            self._storage_failed(exc, "a new live job")
            self._refuse(peer, rid, "storage", f"the server cannot store the job: {self.storage_error}")
            return
        self.jobs[job.id] = job
        self.by_request[(client, rid)] = job.id
        self._live_feeds()[job.id] = LiveFeed(opened=job.created, planned_poses=settings.frame_num,
                                              real_time_s=real_time_s(job.settings))  # fmt: skip
        job.subscribers.add(peer)
        job.chunk_peers.add(peer)
        if request.want_stills:
            job.still_peers.add(peer)
        self.queue.push(client, job.id)
        log.info("live job %s accepted from %s (%d waiting)", job.id, client, len(self.queue))
        self._reply_accepted(peer, rid, job)

    def _live_job(self, peer: bytes, client: str, rid: str, job_id: str) -> tuple[Job, LiveFeed] | None:
        job = self._lookup(peer, JobRequest("poses", rid, job_id), owner=client)
        if job is None:
            return None
        feed = self._live_feeds().get(job.id)
        if feed is None and not is_live(job):
            self._refuse(peer, rid, "bad_request", f"job {job.id} is not a live job: it takes no pose batches")
            return None
        if job.terminal:
            self._send(peer, protocol.error_frames("job_over", f"live job {job.id} is over ({job.state}); it takes "
                                                   "no more poses", rid, job.id))  # fmt: skip
            return None
        return job, feed

    def _on_poses(self, peer: bytes, client: str, request: PoseBatch) -> None:
        found = self._live_job(peer, client, request.rid, request.job)
        if found is None:
            return
        job, feed = found
        job.subscribers.add(peer)  # the sender follows its job (a reconnected client, a restarted server)
        job.chunk_peers.add(peer)
        if request.seq < feed.batches:  # a retry of a batch already on disk: the same answer
            self._reply_poses(peer, request.rid, job, feed, request.seq)
            return
        if feed.ended:
            why = f" ({feed.limit['code']}: {feed.limit['message']})" if feed.limit else ""
            self._send(peer, protocol.error_frames("job_over", f"live job {job.id} has ended (it holds {feed.poses} "
                                                   f"poses); it takes no more{why}", request.rid, job.id))  # fmt: skip
            return
        if request.seq > feed.batches:
            self._refuse(peer, request.rid, "out_of_order", f"live job {job.id}: pose batch {request.seq} arrived "
                         f"before batch {feed.batches}; send batch {feed.batches} next (batches are appended in "
                         "order of seq, from 0)")  # fmt: skip
            return
        count = len(request.poses)
        if feed.poses + count > feed.planned_poses:
            self._refuse(peer, request.rid, "too_large", f"live job {job.id} plans {feed.planned_poses} poses "
                         f"(its frame_num) and holds {feed.poses}: a batch of {count} goes past it; send at most "
                         f"{feed.planned_poses - feed.poses} more, or open the job with a larger frame_num")  # fmt: skip
            return
        ahead = self._live_ahead(feed, feed.poses + count)
        if ahead > self.config.live_ahead_chunks:
            status = feed.status()
            self._refuse(peer, request.rid, "busy", f"live job {job.id}: these poses would run {ahead} chunks "
                         f"ahead of the model (at most {self.config.live_ahead_chunks}); it has sent "
                         f"{status['chunks_sent']} chunks and is {status['behind']} behind the poses it holds: "
                         "send them again later")  # fmt: skip
            return
        try:
            atomic.write_bytes(batch_path(job, request.seq), _npy(request.poses))
            if request.end:
                atomic.write_bytes(job.dir / LIVE_DIR / END_FILE, b"")
        except OSError as exc:
            self._storage_failed(exc, f"live job {job.id}'s poses")
            self._refuse(peer, request.rid, "storage", f"the server cannot store the poses: {self.storage_error}")
            return
        feed.batches += 1
        feed.poses += count
        feed.last_poses = time.monotonic()
        feed.received.append((feed.poses, feed.since_open()))
        feed.ended = request.end or feed.poses >= feed.planned_poses
        self._nudge_worker(job, feed)
        self._reply_poses(peer, request.rid, job, feed, request.seq)

    def _on_end(self, peer: bytes, request: JobRequest, client: str) -> None:
        found = self._live_job(peer, client, request.rid, request.job)
        if found is None:
            return
        job, feed = found
        if not feed.ended:
            self._end_feed(job, feed, "the client ended it")
        self._reply_status(peer, request.rid, job)

    def _end_feed(self, job: Job, feed: LiveFeed, why: str, limit: dict[str, str] | None = None) -> None:
        """No more poses: the worker makes the chunks whose poses it holds, then the job ends. `limit`:
        the limit that ended it ({"code", "message"}), kept in the `end` file (a restarted server
        names it too) and in the job's outcome."""
        try:
            atomic.write_bytes(job.dir / LIVE_DIR / END_FILE, json.dumps(limit).encode() if limit else why.encode())
        except OSError as exc:
            self._storage_failed(exc, f"live job {job.id}'s end")
        feed.ended, feed.limit = True, limit
        log.info("live job %s: no more poses (%s; %d held)", job.id, limit["message"] if limit else why, feed.poses)
        self._nudge_worker(job, feed)

    def _live_ahead(self, feed: LiveFeed, poses: int) -> int:
        """Chunks whose poses `poses` would complete beyond the chunks already sent (or, before the
        worker said what each chunk needs, a chunk per 12 poses)."""
        ready = sum(1 for need in feed.needed if need <= poses) if feed.needed else poses // 12
        return ready - len(feed.chunks)

    def _reply_poses(self, peer: bytes, rid: str, job: Job, feed: LiveFeed, seq: int) -> None:
        self._send(peer, protocol.encode("poses_ok", {"rid": rid, "job": job.id, "seq": seq, **feed.status()}))

    def _nudge_worker(self, job: Job, feed: LiveFeed) -> None:
        if job.state == "running":
            self.supervisor.tell_job(job.id, {"type": "live_poses", "batches": feed.batches, "ended": feed.ended})

    def _live_run_fields(self, job: Job) -> dict[str, Any]:
        """What a live job's `run` message adds: where its poses appear."""
        feed = self._live_feeds().get(job.id)
        if feed is None:
            return {}
        feed.chunks = []  # a rerun (restart, retry) makes and sends every chunk again
        feed.last_poses, feed.ticked = time.monotonic(), None  # the gap counts from the start, not the queue
        return {"live_dir": str(job.dir / LIVE_DIR), "want_chunks": True}

    def _worker_live(self, event) -> None:
        """The worker's plan of a live job: the poses each chunk needs."""
        feed = self._live_feeds().get(event.job or "")
        needed = event.data.get("poses_needed")
        if feed is not None and isinstance(needed, list) and all(isinstance(n, int) for n in needed):
            feed.needed = needed[:4096]

    def _live_chunk_fields(self, job: Job, data: dict[str, Any]) -> dict[str, Any]:
        """A live chunk's `live` map: the poses it was made from and its timings (seconds since open)."""
        feed = self._live_feeds().get(job.id)
        if feed is None:
            return {}
        poses = data.get("poses") if isinstance(data.get("poses"), int) else 0
        started = data.get("started_at")
        timing = {
            "index": len(feed.chunks),
            "poses": poses,
            "poses_received_s": feed.received_at(poses),
            "started_s": feed.since_open(started) if isinstance(started, (int, float)) else None,
            "sent_s": feed.since_open(),
        }
        if timing["poses_received_s"] is not None:
            timing["lag_s"] = round(timing["sent_s"] - timing["poses_received_s"], 4)
        feed.chunks.append(timing)
        feed.last_poses = time.monotonic()  # the gap's clock starts again once the model caught up
        timing["behind"] = feed.status()["behind"]
        return {"live": {k: v for k, v in timing.items() if v is not None}}

    def _live_tick(self) -> None:
        """The two limits, on the clocks of running live jobs whose model waits for their poses: the
        gap since the last batch (or chunk sent, or start) and all the waits together (the deadline)."""
        now = time.monotonic()
        config = self.config
        for job_id, feed in list(self._live_feeds().items()):
            job = self.jobs.get(job_id)
            if job is None or job.terminal:
                self._live_done(job_id)
                continue
            last, feed.ticked = feed.ticked, now
            if feed.ended or job.state != "running" or feed.model_busy():
                continue  # queued, or the model's time (as a batch job's): the client is not holding it up
            if last is not None:
                feed.waited += now - last
            made = (f"its {len(feed.chunks)} chunk(s) so far ({feed.poses} poses held) are its result" if feed.chunks
                    else f"it made no chunk ({feed.poses} poses held), so it fails")  # fmt: skip
            gap, deadline = now - feed.last_poses, config.live_deadline_s(feed.real_time_s)
            if gap > config.live_max_gap_s:
                self._end_feed(job, feed, "", {"code": "live_gap", "message": (
                    f"live job {job.id} ended: the model waited {gap:.1f} s for the next pose batch, longer than "
                    f"the server's live_max_gap_s ({config.live_max_gap_s:g} s); {made}")})  # fmt: skip
            elif feed.waited > deadline:
                self._end_feed(job, feed, "", {"code": "live_deadline", "message": (
                    f"live job {job.id} ended: the model waited {feed.waited:.1f} s for its poses in all, past its "
                    f"limit of {deadline:.1f} s (the server's live_deadline_factor {config.live_deadline_factor:g} x "
                    f"its real-time length {feed.real_time_s:.2f} s + live_deadline_extra_s "
                    f"{config.live_deadline_extra_s:g} s); {made}: send poses at the video's pace")})  # fmt: skip

    def _live_limit(self, job: Job) -> dict[str, str] | None:
        """The limit that ended a live job's feed (`live_gap`, `live_deadline`), or None."""
        feed = self._live_feeds().get(job.id)
        return feed.limit if feed is not None else None

    def _live_done(self, job_id: str) -> None:
        """A live job ended: its timings go beside its result (`live.json`), its feed is forgotten."""
        feed = self._live_feeds().pop(job_id, None)
        job = self.jobs.get(job_id)
        if feed is None or job is None or not job.dir.is_dir():
            return
        record = {"poses": feed.poses, "batches": feed.batches, "pose_batches": feed.received, "chunks": feed.chunks,
                  "waited_s": round(feed.waited, 3), **({"limit": feed.limit} if feed.limit else {})}  # fmt: skip
        try:
            atomic.write_json(job.dir / TIMINGS_FILE, record)
        except OSError as exc:
            log.warning("live job %s: cannot write its timings: %s", job_id, exc)

    def _live_provenance(self, job: Job, provenance: dict[str, Any] | None) -> dict[str, Any] | None:
        """A finished live job's record gets its per-chunk timings (`live.json`) under `live`."""
        path = job.dir / TIMINGS_FILE
        feed = self._live_feeds().get(job.id)
        if feed is not None:
            self._live_done(job.id)
        if provenance is None or not path.is_file():
            return provenance
        try:
            return {**provenance, "live": {**(provenance.get("live") or {}), **json.loads(path.read_text())}}
        except (OSError, ValueError) as exc:
            log.warning("live job %s: its timings are unreadable: %s", job.id, exc)
            return provenance


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float32 if array.dtype != np.float64 else np.float64))
    return buffer.getvalue()
