"""Many episodes through one client (`lingbot-isaac replay` of a dataset): a bounded window of
jobs in flight, `busy` answers back off, results land as they come, and `rollout.pending.json`
lets a rerun follow the jobs an interrupted one left on the server."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from contracts import atomic
from contracts.episode import read_episode, write_rollout
from lingbot_isaac.first_frame import describe_first_frame, first_frame_record

PENDING = "rollout.pending.json"  # {job, server}: submitted, no result yet (a rerun follows it again)
BUSY_BACKOFF_S = (0.5, 8.0)  # first and longest wait after a `busy` answer


class Batch:
    """Many episodes through one client: a bounded window, `busy` backs off, results land as they come."""

    def __init__(self, client, server: str, window: int, job_timeout: float | None, bar, model: str | None) -> None:
        self.client, self.server, self.window, self.job_timeout, self.bar = client, server, window, job_timeout, bar
        self.model = model  # what the server runs (health); rollout.json has the worker's own record
        self.in_flight: dict[str, tuple[Path, dict[str, Any], float]] = {}  # job -> (folder, settings, t0)
        self.jobs: dict[str, Any] = {}
        self.last_event: dict[str, float] = {}
        self.wake = threading.Event()
        self.done: list[Path] = []
        self.failed: dict[Path, str] = {}
        self.busy_answers = 0

    def _on_event(self, event) -> None:  # on the client's I/O thread
        self.last_event[event.job] = time.monotonic()
        from bridge.client.job_events import JobError, Result

        if isinstance(event, (Result, JobError)):
            self.wake.set()

    def _follow(self, job, folder: Path, settings: dict[str, Any]) -> None:
        self.in_flight[job.id] = (folder, settings, time.monotonic())
        self.jobs[job.id] = job
        self.last_event[job.id] = time.monotonic()

    def resume(self, folder: Path, settings: dict[str, Any]) -> bool:
        """Follow the job an earlier run left on the server; False if the server no longer has it."""
        from bridge.client.client_errors import RequestFailed

        try:
            pending = json.loads((folder / PENDING).read_text())
            job = self.client.watch(str(pending["job"]), on_event=self._on_event)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        except RequestFailed as exc:
            if exc.code != "not_found":
                raise
            (folder / PENDING).unlink(missing_ok=True)
            return False
        self._follow(job, folder, settings)
        return True

    def run(self, todo: list[tuple[Path, dict[str, Any]]]) -> None:
        from bridge.client.client_errors import RequestFailed
        from bridge.client.episode_payload import EpisodePayload

        todo = list(todo)
        backoff = 0.0
        while todo or self.in_flight:
            while todo and len(self.in_flight) < self.window and backoff == 0.0:
                folder, settings = todo[0]
                try:
                    job = self.client.submit(EpisodePayload.from_dir(folder), settings or None, on_event=self._on_event)
                except RequestFailed as exc:
                    if exc.code != "busy":
                        todo.pop(0)
                        self._fail(folder, f"{exc.code}: {exc.message}")
                        continue
                    self.busy_answers += 1
                    if self.busy_answers == 1:  # say why nothing is sent for a while (once; the summary counts)
                        print(f"the server is busy ({exc.message}): waiting for a job to end, then sending again",
                              file=sys.stderr, flush=True)  # fmt: skip
                    backoff = BUSY_BACKOFF_S[0]  # the server is full: wait for a job to end, then retry
                    break
                todo.pop(0)
                atomic.write_json(folder / PENDING, {"job": job.id, "server": self.server}, indent=1)
                self._follow(job, folder, settings)
            self._postfix()
            self.wake.wait(backoff or 0.5)
            self.wake.clear()
            finished = self._collect()
            if backoff:
                backoff = 0.0 if finished else min(BUSY_BACKOFF_S[1], backoff * 2)
                if finished == 0 and not self.in_flight:
                    backoff = 0.0  # nothing of ours holds the queue: try again now-ish

    def _collect(self) -> int:
        from bridge.client.job_events import JobError

        finished = 0
        now = time.monotonic()
        for job_id in list(self.in_flight):
            job = self.jobs[job_id]
            folder, settings, started = self.in_flight[job_id]
            if not job.done():
                if self.job_timeout and now - self.last_event.get(job_id, now) > self.job_timeout:
                    self.client.cancel_async(job_id)
                    del self.in_flight[job_id]
                    (folder / PENDING).unlink(missing_ok=True)
                    self._fail(folder, f"no progress from job {job_id} for {self.job_timeout} s; cancelled it")
                    finished += 1
                continue
            del self.in_flight[job_id]
            finished += 1
            outcome = job.outcome
            if isinstance(outcome, JobError):
                if outcome.code in ("unreachable", "closed"):
                    self._fail(folder, f"{outcome.code}: {outcome.message}")  # the job may go on: keep PENDING
                    continue
                (folder / PENDING).unlink(missing_ok=True)
                self._fail(folder, f"{outcome.code}: {outcome.message}")
                continue
            info = {"id": job_id, "queue_position": job.queue_position, "server_seconds": outcome.seconds,
                    "seconds": round(time.monotonic() - started, 3), "server": self.server,
                    "episode": str(folder), "asked": settings, "provenance": outcome.provenance,
                    "first_frame": first_frame_record(read_episode(folder))}  # fmt: skip
            print(f"{folder.name}: first frame: {describe_first_frame(info['first_frame'])}", file=sys.stderr)
            for line in (outcome.provenance or {}).get("adjustments", []):  # what the engine changed, once
                print(f"{folder.name}: {line}", file=sys.stderr)
            print(write_rollout(folder, outcome.video, info), flush=True)
            (folder / PENDING).unlink(missing_ok=True)
            self.done.append(folder)
            self.bar.update(1)
        return finished

    def _fail(self, folder: Path, reason: str) -> None:
        self.failed[folder] = reason
        self.bar.update(1)
        print(f"{folder.name}: failed: {reason}", file=sys.stderr, flush=True)

    def _postfix(self) -> None:
        with contextlib.suppress(AttributeError):
            self.bar.set_postfix(in_flight=len(self.in_flight), failed=len(self.failed), refresh=False)


def dataset_bar(total: int, initial: int, enabled: bool):
    """One bar over the dataset (episodes), or a stand-in with the same methods."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        return _NoBar()
    return tqdm(total=total, initial=initial, unit="episode", desc="replay", file=sys.stderr)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass
