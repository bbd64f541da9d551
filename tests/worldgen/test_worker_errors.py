"""The worker classifies a job's failure by the exception's type, not by its name (issue 13); a two-device
job's lost rank 1 (`PeerLost`) is `peer_lost`, its own code (issue 55)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from bridge.workers import worker_protocol as wp
from contracts.episode import EpisodeError
from contracts.settings import SettingsError
from worldgen.errors import InputError, PeerLost
from worldgen.worker import Worker


class SettingsErrorLookalike(Exception):
    """Named like ours, but not ours: a name must not decide the code."""


SettingsErrorLookalike.__name__ = "SettingsError"


class RaisingEngine:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def generate(self, episode_dir, settings, output, progress):
        raise self.error

    def after_failure(self) -> None:
        pass


@pytest.mark.parametrize(
    "error,code",
    [
        (InputError("poses.npy: 3 poses"), "bad_input"),
        (EpisodeError("intrinsics.npy: row 2 has NaN"), "bad_input"),
        (SettingsError("steps must be an integer"), "bad_input"),
        (MemoryError(), "out_of_memory"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), "out_of_memory"),
        (PeerLost("rank 1 (pid 123) is gone: it exited with code -9"), "peer_lost"),  # a RuntimeError, not worker_error
        (RuntimeError("boom"), "worker_error"),
        (SettingsErrorLookalike("not ours"), "worker_error"),
    ],
)
def test_error_codes_by_type(tmp_path: Path, error, code):
    out = io.BytesIO()
    worker = Worker(io.BytesIO(), out)
    worker.engine = RaisingEngine(error)
    worker.run_job({"type": "run", "job": "j1", "episode_dir": str(tmp_path), "output": str(tmp_path / "r.mp4"),
                    "settings": {}})  # fmt: skip
    out.seek(0)
    message = wp.read_message(out)
    assert message["type"] == "error" and message["job"] == "j1" and message["code"] == code
    assert worker.state == "idle"
