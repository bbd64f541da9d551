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

Every write error reaches the caller as an OSError: the server decides what it means for the job
(requeue it, fail it) and reports the spool as not writable until `probe()` succeeds again.
A failed or cancelled job's inputs (`episode/`) are deleted as soon as it ends; a done job keeps them
beside its result for `result_ttl_s`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bridge.server.jobs import Job
from contracts import atomic, episode

log = logging.getLogger("bridge.server.spool")


class SpoolError(RuntimeError):
    """The spool folder cannot be used (locked by another server, not writable ...)."""


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
            (self.root / "lock").touch()
            # Held for the server's life; read-only, so the spool's filesystem can be remounted
            # read-only under a running server (it then reports the spool as not writable).
            self._lock_file = open(self.root / "lock")  # noqa: SIM115
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
    ) -> Job:
        """Write a job durably (fsynced, renamed into place) and return it."""
        job_id = uuid.uuid4().hex
        staging = self.incoming_dir / job_id
        record = Job(
            id=job_id,
            dir=self.jobs_dir / job_id,
            client=client,
            rid=rid,
            seq=self._next_seq,
            created=time.time(),
            settings=settings,
            want_frames=want_frames,
            name=name,
            input_bytes=input_bytes(image, poses, intrinsics, prompt),
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

    def save_state(self, record: Job) -> None:
        atomic.write_json(record.dir / "state.json", record.state_json())
        record.dirty = False

    def release_inputs(self, record: Job) -> None:
        """Delete the episode of a job that ended (it is never needed again)."""
        shutil.rmtree(record.episode_dir, ignore_errors=True)

    def probe(self) -> None:
        """Raise OSError unless a small file can be written, synced and replaced in the spool now."""
        atomic.write_bytes(self.root / "probe", uuid.uuid4().hex.encode())

    def free_bytes(self) -> int:
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize

    def load_all(self) -> list[Job]:
        """Every job in the spool, oldest first; unreadable folders are moved to `corrupt/`."""
        records = []
        for job_dir in sorted(self.jobs_dir.iterdir()):
            try:
                job = json.loads((job_dir / "job.json").read_text())
                state = json.loads((job_dir / "state.json").read_text())
                record = Job(dir=job_dir, **job, **state)
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

    def remove(self, record: Job) -> None:
        shutil.rmtree(record.dir, ignore_errors=True)


def input_bytes(image: bytes, poses: np.ndarray, intrinsics: np.ndarray, prompt: str) -> int:
    """What a job's inputs take in the spool (file contents; the few small json files aside)."""
    return len(image) + poses.nbytes + intrinsics.nbytes + len(prompt.encode("utf-8")) + 4096


def describe_os_error(exc: OSError) -> str:
    """A spool write error in words an operator acts on."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the spool's disk is full ({exc})"
    if exc.errno == errno.EROFS:
        return f"the spool is on a read-only filesystem ({exc})"
    return f"the spool cannot be written ({exc})"
