"""What a job tells its client, in order: Progress ..., Chunks (model = fast), then one Result or JobError."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


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
    live: dict[str, Any] | None = None  # a live job's chunk: poses, poses_received_s, started_s, sent_s, lag_s, behind


@dataclasses.dataclass(frozen=True)
class Result:
    job: str
    video: bytes  # the mp4
    frames: np.ndarray | None = None  # uint8 [F, H, W, 3], if asked for (read-only)
    seconds: float | None = None
    provenance: dict[str, Any] | None = None  # what made the video (contracts.provenance), from the worker
    # a live job ended by a limit ({"code": "live_gap" | "live_deadline", "message"}): the video is its chunks so far
    error: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class JobError:
    job: str
    code: str
    message: str


Event = Progress | Chunk | Result | JobError
EventCallback = Callable[[Event], None]
