"""`lingbot-isaac replay`: sources -> episode folders -> a real server (tiny model) -> rollout.mp4."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from contracts.episode import read_episode
from lingbot_cli.main import main as cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample_room"


def test_export_only_episode_folder_and_usd_stage(tmp_path, capsys):
    pytest.importorskip("pxr", reason="usd-core (pxr) is needed to read the sample stage")
    assert cli(["replay", str(SAMPLE), "--export-only", "--out", str(tmp_path)]) == 0
    copied = read_episode(tmp_path / "sample_room")
    np.testing.assert_array_equal(copied.poses, np.load(SAMPLE / "poses.npy"))

    args = [
        "replay",
        str(SAMPLE / "room.usda"),
        "--export-only",
        "--out",
        str(tmp_path / "usd"),
        "--image",
        str(SAMPLE / "image.jpg"),
        "--prompt-file",
        str(SAMPLE / "prompt.txt"),
    ]
    assert cli(args) == 0
    exported = read_episode(tmp_path / "usd" / "room")
    # The stage's camera exported again gives the sample episode's poses and intrinsics exactly.
    np.testing.assert_array_equal(exported.poses, np.load(SAMPLE / "poses.npy"))
    np.testing.assert_array_equal(exported.intrinsics, np.load(SAMPLE / "intrinsics.npy"))
    assert cli(args) == 2  # exists: needs --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert cli([*args, "--overwrite"]) == 0


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "no prompt"),
        (["--prompt", "p", "--resolution", "832x"], "--resolution must look like"),
        (["--prompt", "p", "--steps", "0"], "steps must be in [1, 1000]"),  # contracts.settings names the range
        (["--prompt", "p", "--camera", "/Nope"], "not found"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, extra, message):
    pytest.importorskip("pxr", reason="usd-core (pxr) is needed to read the sample stage")
    code = cli(["replay", str(SAMPLE / "room.usda"), "--export-only", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_settings_precedence():
    from argparse import Namespace

    from contracts.settings import job_settings
    from lingbot_isaac.replay import settings_overrides

    args = Namespace(preset=None, frame_num=None, steps=3, seed=None, size=None, shift=None, guide_scale="4,6")
    overrides = settings_overrides(args)
    assert overrides == {"steps": 3, "guide_scale": [4.0, 6.0]}
    assert job_settings({"steps": 10, "seed": 7}, overrides) == {
        "steps": 3,
        "seed": 7,
        "guide_scale": [4.0, 6.0],
    }
    whole = settings_overrides(
        Namespace(preset="tiny", frame_num=None, steps=None, seed=1, size=None, shift=None, guide_scale=None)
    )
    assert whole["size"] == "96*160" and whole["seed"] == 1
    fast = settings_overrides(
        Namespace(
            preset="fast40",
            frame_num=None,
            steps=None,
            seed=None,
            size=None,
            shift=None,
            guide_scale=None,
            compute="fp8",
        )  # fmt: skip
    )
    assert (fast["steps"], fast["shift"], fast["compute"]) == (40, 5.0, "fp8")  # per job, on the wire


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_server = pytest.mark.skipif(
    not (_have("bridge.client.client") and _have("worldgen.pipelines.base")),
    reason="bridge.client.client and worldgen.pipelines.base are not on this branch yet (end-to-end replay needs both)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """A real `serve` subprocess (the built-in tiny model on the CPU) -> its endpoint. The server's
    output goes to a log file (a pipe nobody reads would block a chatty server once full); a server
    that does not start fails with that log in the message."""
    from tests.bridge.conftest import TINY, ServerPool

    pool = ServerPool(tmp_path / "server")
    try:
        yield pool.start(worker=TINY, start_timeout=60.0).endpoint
    finally:
        pool.close()


def run_replay(server: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """`lingbot-isaac replay` of the sample room against `server` with the tiny preset, as a user runs it."""
    command = [sys.executable, "-m", "lingbot_cli", "replay", str(SAMPLE), "--server", server, "--out", str(out),
               "--preset", "tiny", "--timeout", "30", "--job-timeout", "600", *extra]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


@needs_server
@pytest.mark.slow
def test_replay_sample_against_a_local_tiny_server(tmp_path, server):
    from contracts.video import read_mp4

    out = tmp_path / "results"
    result = run_replay(server, out)
    assert result.returncode == 0, result.stderr[-3000:]
    video = out / "sample_room" / "rollout.mp4"
    assert video.is_file() and str(video) in result.stdout
    frames, _ = read_mp4(video)
    assert frames.shape[0] == 17 and frames.dtype == np.uint8  # the tiny preset's frame_num
    info = json.loads((out / "sample_room" / "rollout.json").read_text())
    assert info["job"]["id"] and info["job"]["client"] == "replay" and info["settings"]["size"] == "96*160"
    read_episode(out / "sample_room")  # the episode travels with its rollout
    # serve -> replay -> compare: the report shows the model, the noise banner and every setting
    if importlib.util.find_spec("comparison.report") is not None:
        from comparison.report import compare_episode
        from tests.report_checks import assert_tiny_rollout_is_traceable

        report = compare_episode(out / "sample_room", video, tmp_path / "report")
        assert_tiny_rollout_is_traceable(video, report, client="replay")


@needs_server
def test_replay_says_when_no_server_answers(tmp_path, capsys):
    shutil.copytree(SAMPLE, tmp_path / "ep")
    code = cli(["replay", str(tmp_path / "ep"), "--server", f"tcp://127.0.0.1:{_free_port()}", "--timeout", "1"])
    assert code == 2
    assert "lingbot-isaac serve --bind" in capsys.readouterr().err  # says how to start one
    assert not (tmp_path / "ep" / "rollout.mp4").exists()
