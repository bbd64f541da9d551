"""One job: what was asked (job.json), where it stands (state.json) and, while the server runs,
who follows it and how far it got. The server keeps one `Job` per job id, nothing beside it.

States and the only moves between them (`Job.move` refuses any other):

    queued  -> running            handed to a worker (the worker has the message)
    queued  -> failed|cancelled   cancelled while waiting, worker unavailable, cannot be handed over
    running -> queued             requeued: the spool could not record it, or the server restarted
    running -> done|failed|cancelled
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

STATES = ("queued", "running", "done", "failed", "cancelled")
TERMINAL = ("done", "failed", "cancelled")
MOVES = {
    "queued": ("running", "failed", "cancelled"),
    "running": ("queued", "done", "failed", "cancelled"),
    "done": (),
    "failed": (),
    "cancelled": (),
}


class BadMove(RuntimeError):
    """A state change the job state machine does not allow (a bug in the caller)."""


@dataclasses.dataclass
class Live:
    """Progress of a running job (never written to disk)."""

    phase: str = "starting"
    step: int = 0
    total: int = 0
    eta_s: float | None = None
    cancelling: bool = False
    since: float = dataclasses.field(default_factory=time.monotonic)  # when it started running
    denoise_t0: float | None = None
    denoise_step0: int = 0


@dataclasses.dataclass
class Job:
    """One job. The first block is job.json (immutable after accept), the second state.json; the
    rest lives only in the server's memory."""

    id: str
    dir: Path
    client: str  # the submitter's identity: its CurveZMQ key, or its connection (never a message field)
    rid: str
    seq: int
    created: float
    settings: dict[str, Any]
    want_frames: bool = False
    name: str | None = None
    input_bytes: int = 0
    # state.json
    state: str = "queued"
    error: dict[str, str] | None = None
    attempts: int = 0
    started: float | None = None
    finished: float | None = None
    result_bytes: int = 0
    frames: int | None = None  # frames the worker said it wrote (verified in the mp4)
    # memory only
    subscribers: set[bytes] = dataclasses.field(default_factory=set, repr=False)
    chunk_peers: set[bytes] = dataclasses.field(default_factory=set, repr=False)  # subscribers that asked for chunks
    still_peers: set[bytes] = dataclasses.field(default_factory=set, repr=False)  # ... and for their stills too
    live: Live | None = dataclasses.field(default=None, repr=False)
    sent_position: int | None = dataclasses.field(default=None, repr=False)
    dirty: bool = dataclasses.field(default=False, repr=False)  # state.json not yet written
    cap_group: str = dataclasses.field(
        default="", repr=False
    )  # who shares its client's queue cap (bridge/server/peer_process.py)
    fetched: bool = dataclasses.field(
        default=False, repr=False
    )  # its result went to a client (bridge/server/eviction.py)

    JOB_KEYS = ("id", "client", "rid", "seq", "created", "settings", "want_frames", "name", "input_bytes")
    STATE_KEYS = ("state", "error", "attempts", "started", "finished", "result_bytes", "frames")

    @property
    def episode_dir(self) -> Path:
        return self.dir / "episode"

    @property
    def result_path(self) -> Path:
        return self.dir / "result.mp4"

    @property
    def frames_path(self) -> Path:
        return self.dir / "frames.npy"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def released(self) -> bool:
        """Failed and cancelled jobs give their inputs back at once; a done job keeps its episode
        beside its result (what it was generated from) until both are deleted."""
        return self.state in ("failed", "cancelled")

    @property
    def spool_bytes(self) -> int:
        """What the job holds on disk now."""
        return (0 if self.released else self.input_bytes) + self.result_bytes

    def move(self, state: str, error: dict[str, str] | None = None) -> None:
        if state not in MOVES[self.state]:
            raise BadMove(f"job {self.id}: {self.state} -> {state} is not a valid move")
        self.state, self.error = state, error
        if state == "running":
            self.started, self.attempts, self.live = time.time(), self.attempts + 1, Live()
        elif state == "queued":
            self.live = None
        else:
            self.finished, self.live, self.sent_position = time.time(), None, None

    def job_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.JOB_KEYS}

    def state_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.STATE_KEYS}
