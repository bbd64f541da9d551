"""`lingbot-isaac compare` as a user runs it: a real subprocess, real files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.comparison.scene import write_episode

REPO = Path(__file__).resolve().parents[2]


def lingbot_isaac(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lingbot_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_compare_one_episode_and_then_two(tmp_path, commanded_poses, rendered):
    count = 5
    episode = write_episode(tmp_path / "short_walk", commanded_poses[:count], rendered[:count])
    # the sim video itself as the "rollout": identical frames
    result = lingbot_isaac(
        "compare", str(episode), str(episode / "sim.mp4"), "--out", str(tmp_path / "one"), "--model", "tiny",
        "--sfm-trials", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"report: {tmp_path / 'one' / 'report.html'}" in lines
    assert f"json:   {tmp_path / 'one' / 'report.json'}" in lines
    assert lines[-1].startswith("note: tiny-model output is noise")
    assert any(line.startswith("time:   ") and "whole-clip reconstruction" in line for line in lines)
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    per_frame = report["image_metrics"]["per_frame"]
    assert all(row["psnr_db"] is None and row["identical"] and row["ssim"] == 1.0 for row in per_frame)
    assert report["image_metrics"]["summary"]["psnr_db"]["identical_frames"] == count
    assert "∞" in (tmp_path / "one" / "report.html").read_text()

    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"steps": 4, "seed": 1}))
    result = lingbot_isaac(
        "compare",
        "--pair",
        str(episode),
        str(episode / "sim.mp4"),
        "--pair",
        str(episode),
        str(episode / "sim.mp4"),
        "--out",
        str(tmp_path / "two"),
        "--settings",
        str(settings),
        "--ransac-threshold-px",
        "0.75",
        "--no-sfm",
    )
    assert result.returncode == 0, result.stderr
    assert f"summary: {tmp_path / 'two' / 'summary.html'}" in result.stdout.splitlines()
    assert "tiny-model output is noise" not in result.stdout
    assert {p.name for p in (tmp_path / "two").iterdir()} == {
        "short_walk",
        "short_walk-2",
        "summary.html",
        "summary.json",
    }
    report = json.loads((tmp_path / "two" / "short_walk-2" / "report.json").read_text())
    assert report["settings"]["generation"] == {"steps": 4, "seed": 1}
    assert report["camera_fidelity"]["rollout"]["config"]["ransac_threshold_px"] == 0.75
    assert report["camera_fidelity"]["whole_clip"]["status"] == "unavailable"  # --no-sfm


def test_compare_an_episode_finds_the_rollout_replay_left_in_it(tmp_path, commanded_poses, rendered):
    from contracts.episode import write_rollout

    episode = write_episode(tmp_path / "replayed", commanded_poses[:5], rendered[:5])
    # what `replay EPISODE` leaves: rollout.mp4 (+ rollout.json) in the episode folder, by its writer
    write_rollout(episode, (episode / "sim.mp4").read_bytes(), {"id": "job-1"}, client="replay")
    result = lingbot_isaac("compare", str(episode), "--out", str(tmp_path / "report"), "--model", "tiny")
    assert result.returncode == 0, result.stderr
    assert f"comparing {episode} with {episode / 'rollout.mp4'}" in result.stderr
    assert (tmp_path / "report" / "report.json").is_file()


def test_bad_input_exits_2_with_one_clear_line(tmp_path):
    result = lingbot_isaac("compare", str(tmp_path / "nope"), str(tmp_path / "nope.mp4"))
    assert result.returncode == 2
    assert "error:" in result.stderr and "not a folder" in result.stderr and "Traceback" not in result.stderr
    result = lingbot_isaac("compare", str(tmp_path))
    assert result.returncode == 2 and f"{tmp_path}: no rollout.mp4 in it" in result.stderr
    (tmp_path / "bad.json").write_text("{not json")
    bad = tmp_path / "bad.json"
    result = lingbot_isaac("compare", "--pair", str(tmp_path), "x.mp4", "--settings", str(bad))
    assert result.returncode == 2 and "bad.json: not valid JSON" in result.stderr


def test_comparison_imports_neither_torch_nor_worldgen():
    code = (
        "import sys, lingbot_cli.compare, comparison.report; "
        "bad = [m for m in ('torch', 'worldgen', 'zmq') if m in sys.modules]; "
        "print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
