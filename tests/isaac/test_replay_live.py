"""`lingbot-isaac replay data/sample_room --live --model fast` as a user runs it: real subprocesses
(the CLI, a real server with its real worker and the built-in tiny model on the CPU), the sample
episode's poses streamed at their recorded pace, each chunk's lag printed, and an ordinary rollout
beside the episode that `compare` reports on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.video import read_mp4
from tests.conftest import pythonpath_with_repo

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def lingbot_isaac(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": pythonpath_with_repo()}
    return subprocess.run([sys.executable, "-m", "lingbot_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)  # fmt: skip


def test_replay_live_prints_each_chunks_lag_and_writes_a_rollout_compare_reports_on(tiny_server, tmp_path):
    episode = Path(shutil.copytree(REPO / "data" / "sample_room", tmp_path / "sample_room"))
    result = lingbot_isaac("replay", str(episode), "--live", "--model", "fast", "--server", tiny_server.endpoint)
    assert result.returncode == 0, result.stderr[-3000:]
    lags = re.findall(r"sample_room: chunk (\d)/3 \((\d+) frames\): lag ([\d.]+) s after its last pose", result.stderr)
    assert [(c, f) for c, f, _ in lags] == [("1", "9"), ("2", "12"), ("3", "12")], result.stderr[-3000:]
    assert str(episode / "rollout.mp4") in result.stdout
    frames, _ = read_mp4(episode / "rollout.mp4")
    assert frames.shape[0] == 33  # the sample's 33 poses: three whole chunks
    record = json.loads((episode / "rollout.json").read_text())
    assert record["job"]["mode"] == "live" and record["settings"]["model"] == "fast"
    live = record["live"]
    assert live["poses_needed"] == [9, 21, 33] and [c["poses"] for c in live["chunks"]] == [9, 21, 33]
    assert all(c["poses_received_s"] <= c["started_s"] <= c["sent_s"] for c in live["chunks"])
    report = lingbot_isaac("compare", str(episode), str(episode / "rollout.mp4"), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-3000:]
    numbers = json.loads((tmp_path / "report" / "report.json").read_text())
    assert len(numbers["image_metrics"]["per_frame"]) == 33


def test_replay_live_needs_the_fast_model(tmp_path):
    episode = Path(shutil.copytree(REPO / "data" / "sample_room", tmp_path / "sample_room"))
    result = lingbot_isaac("replay", str(episode), "--live", "--server", "tcp://127.0.0.1:9", timeout=120)
    assert result.returncode != 0 and "--live streams poses to LingBot-World-Fast: add --model fast" in result.stderr
    assert not (episode / "rollout.mp4").exists()
