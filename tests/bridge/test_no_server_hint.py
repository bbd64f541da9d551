"""`replay` and `submit` with no server: the answer comes at once and says how to start one (or that the
address is taken by something that is not a lingbot-isaac server). Real sockets, the real CLI."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest

from lingbot_cli.main import main as cli

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_room"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


@pytest.mark.parametrize("command", ["replay", "submit"])
def test_a_closed_port_says_how_to_start_a_server_within_3_s(tmp_path, capsys, command):
    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    endpoint = f"tcp://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    code = cli([command, str(episode), "--server", endpoint])  # the default --timeout (10 s) is not waited for
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and seconds < 3.0, (code, seconds, err)
    assert f"no server at {endpoint}: nothing listens" in err
    assert f"lingbot-isaac serve --bind {endpoint}" in err
    assert not (episode / "rollout.mp4").exists()


def test_an_address_held_by_another_program_is_named(tmp_path, capsys):
    episode = shutil.copytree(SAMPLE, tmp_path / "ep")
    with socket.socket() as squatter:  # accepts TCP connections, never speaks ZeroMQ
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)
        endpoint = f"tcp://127.0.0.1:{squatter.getsockname()[1]}"
        code = cli(["replay", str(episode), "--server", endpoint, "--timeout", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not answer as a lingbot-isaac server" in err and "another program holds the address" in err
    assert not (episode / "rollout.mp4").exists()
