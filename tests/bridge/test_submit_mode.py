"""`lingbot-isaac submit` writes the rollout and its record like any output: mode 0666 & ~umask
(a group-shared folder with umask 002 gets group-writable files; umask 077 keeps them private)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from tests.bridge.conftest import REPO


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_submit_writes_the_mp4_and_record_with_the_umask(servers, episode, tmp_path, umask):
    server = servers()  # the stand-in engine: a real server, a real mp4, in a second
    out = tmp_path / "out" / "rollout.mp4"
    out.parent.mkdir()
    command = [sys.executable, "-m", "lingbot_cli", "submit", str(episode), "--server", server.endpoint,
               "--out", str(out), "--steps", "1"]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(umask)
    )
    assert done.returncode == 0, done.stderr
    for path in (out, out.with_suffix(".json")):
        assert path.is_file(), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, (path, oct(path.stat().st_mode))


def test_submit_gpus_2_reaches_the_server_which_refuses_it_without_a_pool(servers, episode, tmp_path):
    """`submit --gpus 2` sends the per-job setting; a one-device server refuses it, naming `gpus`."""
    server = servers()
    out = tmp_path / "rollout.mp4"
    command = [sys.executable, "-m", "lingbot_cli", "submit", str(episode), "--server", server.endpoint,
               "--out", str(out), "--steps", "1", "--gpus", "2"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "gpus" in done.stderr, done.stderr
    assert not out.exists()


def test_submit_sends_what_episode_json_asks_for_under_its_flags(servers, episode, tmp_path):
    """episode.json's `generation` (what the window saved, e.g. its GPUs) is sent as the job's settings,
    as `replay` sends it; a flag overrides it. A one-device server refuses `gpus = 2`, naming it."""
    meta = json.loads((episode / "episode.json").read_text())
    meta["generation"] = {"gpus": 2}
    (episode / "episode.json").write_text(json.dumps(meta))
    server = servers()
    out = tmp_path / "rollout.mp4"
    command = [sys.executable, "-m", "lingbot_cli", "submit", str(episode), "--server", server.endpoint,
               "--out", str(out), "--steps", "1"]  # fmt: skip
    asked = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert asked.returncode != 0 and "gpus" in asked.stderr, asked.stderr
    assert not out.exists()
    overridden = subprocess.run([*command, "--gpus", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert overridden.returncode == 0, overridden.stderr
    assert json.loads(out.with_suffix(".json").read_text())["settings"]["gpus"] == 1
