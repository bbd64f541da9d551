"""The README's first command: `lingbot-isaac demo` runs serve -> replay -> compare -> report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.report_checks import assert_tiny_rollout_is_traceable


def test_demo_writes_rollout_and_report(tmp_path):
    out = tmp_path / "demo"
    env = {"LINGBOT_ISAAC_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "lingbot_cli", "demo", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "noise" in result.stdout
    rollout = out / "episode" / "rollout.mp4"
    report = out / "report" / "report.html"
    assert f"rollout: {rollout}" in result.stdout and str(report) in result.stdout
    assert rollout.stat().st_size > 1000 and report.stat().st_size > 1000
    numbers = json.loads((out / "report" / "report.json").read_text())
    assert numbers  # every number of the report is in the JSON
    assert_tiny_rollout_is_traceable(rollout, report, client="demo")
    # the page is small: the videos are referenced beside it (relative paths), thumbnails inline
    assert report.stat().st_size < 1_000_000 and "src='side_by_side.mp4'" in report.read_text()
    moved = shutil.move(out / "report", tmp_path / "moved")  # a moved folder still holds its video
    assert (Path(moved) / "side_by_side.mp4").is_file()
    assert "Failed to load CPU gemm_4bit_forward" not in (out / "server.log").read_text()
    assert not (out / "spool").exists(), "the demo's own spool (job copies, results) is removed when it ends"
    # the sample episode in data/ was not touched: results go beside the copy
    assert not (REPO / "data" / "sample_room" / "rollout.mp4").exists()
    # the server was stopped
    assert "Traceback" not in (out / "server.log").read_text()
