"""The server's disk spool: every accepted job is a folder, so no job is lost to a restart.

zguide's Titanic pattern: a job is written to disk (and fsynced) before the client hears
"accepted", its state changes are atomic file replacements, and a restarted server rebuilds its
queue from the folders.

    SPOOL/lock                      held (flock) by the one server using this spool
    SPOOL/incoming/TMP/             a job being written; never acknowledged; removed on start
    SPOOL/jobs/JOB/job.json         who asked for what (immutable after accept)
    SPOOL/jobs/JOB/state.json       queued | running | done | failed | cancelled, error, attempts
    SPOOL/jobs/JOB/episode/         poses.npy, intrinsics.npy, image.jpg|png, prompt.txt
    SPOOL/jobs/JOB/result.mp4       written by the worker (temp file, fsync, rename) before it reports
    SPOOL/jobs/JOB/frames.npy       the decoded frames, when the client asked for them
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from contracts import atomic, episode

log = logging.getLogger("bridge.spool")


class SpoolError(RuntimeError):
    """The spool folder cannot be used (locked by another server, not writable ...)."""


@dataclasses.dataclass
class JobRecord:
    """One job as the spool knows it (job.json + state.json)."""

    id: str
    dir: Path
    client: str
    rid: str
    seq: int
    created: float
    settings: dict[str, Any]
    want_frames: bool = False
    name: str | None = None
    state: str = "queued"
    error: dict[str, str] | None = None
    attempts: int = 0
    started: float | None = None
    finished: float | None = None

    @property
    def episode_dir(self) -> Path:
        return self.dir / "episode"

    @property
    def result_path(self) -> Path:
        return self.dir / "result.mp4"

    @property
    def frames_path(self) -> Path:
        return self.dir / "frames.npy"

    def job_json(self) -> dict[str, Any]:
        keys = ("id", "client", "rid", "seq", "created", "settings", "want_frames", "name")
        return {k: getattr(self, k) for k in keys}

    def state_json(self) -> dict[str, Any]:
        keys = ("state", "error", "attempts", "started", "finished")
        return {k: getattr(self, k) for k in keys}


class Spool:
    """A folder of jobs, owned by one server at a time."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.jobs_dir = self.root / "jobs"
        self.incoming_dir = self.root / "incoming"
        self.corrupt_dir = self.root / "corrupt"
        try:
            for d in (self.root, self.jobs_dir, self.incoming_dir):
                d.mkdir(parents=True, exist_ok=True)
            self._lock_file = open(self.root / "lock", "a+")  # noqa: SIM115 (held for the server's life)
        except OSError as exc:
            raise SpoolError(f"cannot use spool folder {self.root}: {exc}") from None
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise SpoolError(
                f"spool folder {self.root} is in use by another server; stop it or give this one another spool_dir"
            ) from None
        self._next_seq = 0
        # Jobs never acknowledged: the client got no "accepted", so it will retry.
        for leftover in self.incoming_dir.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()

    def accept(
        self,
        *,
        client: str,
        rid: str,
        prompt: str,
        image: bytes,
        poses: np.ndarray,
        intrinsics: np.ndarray,
        settings: dict[str, Any],
        want_frames: bool = False,
        name: str | None = None,
    ) -> JobRecord:
        """Write a job durably (fsynced, renamed into place) and return its record."""
        job_id = uuid.uuid4().hex
        staging = self.incoming_dir / job_id
        record = JobRecord(
            id=job_id,
            dir=self.jobs_dir / job_id,
            client=client,
            rid=rid,
            seq=self._next_seq,
            created=time.time(),
            settings=settings,
            want_frames=want_frames,
            name=name,
        )
        self._next_seq += 1
        try:
            # the one episode writer; then the whole folder is fsynced and renamed into place
            episode.write_action(staging / "episode", poses, intrinsics, image, prompt)
            (staging / "job.json").write_text(json.dumps(record.job_json()))
            (staging / "state.json").write_text(json.dumps(record.state_json()))
            atomic.replace_dir(staging, record.dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return record

    def save_state(self, record: JobRecord) -> None:
        atomic.write_json(record.dir / "state.json", record.state_json())

    def load_all(self) -> list[JobRecord]:
        """Every job in the spool, oldest first; unreadable folders are moved to `corrupt/`."""
        records = []
        for job_dir in sorted(self.jobs_dir.iterdir()):
            try:
                job = json.loads((job_dir / "job.json").read_text())
                state = json.loads((job_dir / "state.json").read_text())
                record = JobRecord(dir=job_dir, **job, **state)
                if record.id != job_dir.name:
                    raise ValueError(f"job.json id {record.id!r} does not match its folder")
            except (OSError, ValueError, TypeError) as exc:
                log.error("spool: job folder %s is unreadable (%s); moving it to %s", job_dir, exc, self.corrupt_dir)
                self.corrupt_dir.mkdir(exist_ok=True)
                shutil.move(str(job_dir), str(self.corrupt_dir / job_dir.name))
                continue
            records.append(record)
        records.sort(key=lambda r: (r.seq, r.created))
        if records:
            self._next_seq = max(r.seq for r in records) + 1
        return records

    def remove(self, record: JobRecord) -> None:
        shutil.rmtree(record.dir, ignore_errors=True)
