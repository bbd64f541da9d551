"""`replay` checks every input before it contacts a server (and so long before any model loads): a
missing image, bad poses or a bad setting fail in about a second, with the same messages as everywhere.

The server address is a closed port: had replay contacted it first, the error would be "no server".
"""

from __future__ import annotations

import shutil
import socket

import numpy as np
import pytest

from tests.conftest import REPO, run_cli_measured

SAMPLE = REPO / "data" / "sample_room"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["missing image", "bad poses", "bad setting"])
def test_replay_fails_on_bad_input_before_contacting_the_server(tmp_path, case):
    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    extra: list[str] = []
    if case == "missing image":
        (episode / "image.jpg").unlink()
        expected = "image"
    elif case == "bad poses":
        poses = np.load(episode / "poses.npy")
        poses[3, :3, :3] *= 2.0  # not a rotation any more
        np.save(episode / "poses.npy", poses)
        expected = "poses.npy"
    else:
        extra = ["--steps", "0"]
        expected = "steps must be in [1, 1000] (got 0)"
    result = run_cli_measured(["replay", str(episode), "--server", f"tcp://127.0.0.1:{_closed_port()}", *extra])
    errors = result.errors
    assert result.returncode == 2 and errors[-1].startswith("error: ") and expected in errors[-1], errors
    assert "no server" not in result.stderr, "the server was contacted before the input was checked"
    assert "torch" not in result.imported, "nothing of the generation side was needed"
    assert result.cpu_s < 2.0, f"{result.cpu_s:.2f} s of CPU"
    assert not (episode / "rollout.mp4").exists()
