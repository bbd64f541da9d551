"""Loopback by default; beyond it only with CurveZMQ keys and an allowlist of clients."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from bridge.client.client import Client
from bridge.client.client_errors import Unauthorized
from bridge.client.episode_payload import EpisodePayload
from bridge.wire.security import SecurityError, allow_client, is_loopback, load_secret, write_keypair
from tests.bridge.conftest import REPO, TINY, wait_for


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lingbot_cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5570", True),
        ("tcp://127.0.0.1:*", True),
        ("tcp://127.9.9.9:5570", True),
        ("tcp://localhost:5570", True),
        ("tcp://[::1]:5570", True),
        ("ipc:///tmp/lingbot.sock", True),
        ("tcp://*:5570", False),
        ("tcp://0.0.0.0:5570", False),
        ("tcp://192.168.1.20:5570", False),
        ("tcp://eth0:5570", False),
        ("tcp://[::]:5570", False),
        ("udp://127.0.0.1:5570", False),
    ],
)
def test_is_loopback(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


def test_keys_command_writes_owner_only_secrets_and_never_overwrites(tmp_path):
    keys = tmp_path / "keys"
    done = cli("keys", "server", "--dir", str(keys))
    assert done.returncode == 0, done.stderr
    secret, public = keys / "server.key_secret", keys / "server.key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert "secret-key" not in public.read_text() and "secret-key" in secret.read_text()
    server_public, server_secret = zmq.auth.load_certificate(str(secret))  # ZeroMQ's own reader agrees
    assert zmq.curve_public(server_secret) == server_public
    again = cli("keys", "server", "--dir", str(keys))
    assert again.returncode == 2 and "already exists" in again.stderr
    done = cli("keys", "client", "isaac-1", "--dir", str(keys), "--allow-dir", str(keys / "clients"))
    assert done.returncode == 0, done.stderr
    assert (keys / "clients" / "isaac-1.key").read_text().count("public-key") == 1
    assert stat.S_IMODE((keys / "isaac-1.key_secret").stat().st_mode) == 0o600


def test_a_secret_readable_by_others_is_refused(tmp_path):
    assert cli("keys", "server", "--dir", str(tmp_path)).returncode == 0
    secret = tmp_path / "server.key_secret"
    secret.chmod(0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        load_secret(secret)
    with pytest.raises(SecurityError, match="no secret key"):
        load_secret(tmp_path / "server.key")


@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:5599", "tcp://*:5599"])
def test_non_loopback_bind_without_keys_is_refused(tmp_path, bind):
    done = cli("serve", "--bind", bind, "--spool-dir", str(tmp_path / "spool"))
    assert done.returncode == 2
    assert "refusing to listen on" in done.stderr and "CurveZMQ" in done.stderr and "lingbot-isaac keys" in done.stderr


def make_keys(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    write_keypair(keys, "server")
    allow_client(write_keypair(keys, "known")[0], keys / "clients")
    write_keypair(keys, "stranger")
    return keys


@pytest.mark.parametrize("worker", [None, pytest.param(TINY, marks=pytest.mark.slow)], ids=["standin", "tiny"])
def test_curve_server_serves_known_clients_and_rejects_others(servers, tmp_path, episode, worker):
    keys = make_keys(tmp_path)
    security = {"server_secret_key": str(keys / "server.key_secret"), "client_keys_dir": str(keys / "clients")}
    server = servers(bind="tcp://0.0.0.0:*", security=security, worker=worker)
    port = server.endpoint.rsplit(":", 1)[1]
    endpoint = f"tcp://127.0.0.1:{port}"

    with Client(endpoint, timeout=5, server_key=keys / "server.key", client_key=keys / "known.key_secret") as known:
        health = wait_for(lambda: (h := known.health())["ok"] and h, 120, what="the worker")  # it may still start
        assert health["server"]["curve"] is True
        settings = {"steps": 1, "size": "48*80", "frame_num": 5}
        assert known.submit(EpisodePayload.from_dir(episode), settings).result(timeout=60)

    with (
        Client(
            endpoint, timeout=5, server_key=keys / "server.key", client_key=keys / "stranger.key_secret"
        ) as stranger,
        pytest.raises(Unauthorized, match="not in the server's client_keys_dir"),
    ):
        stranger.health()

    with Client(endpoint, timeout=5) as plain, pytest.raises(Unauthorized, match="disagree on CurveZMQ"):
        plain.health()


def test_curve_server_refuses_a_world_readable_secret(tmp_path):
    keys = make_keys(tmp_path)
    (keys / "server.key_secret").chmod(0o640)
    config = tmp_path / "server.toml"
    config.write_text(
        f'[server]\nbind = "tcp://0.0.0.0:5598"\nspool_dir = "{tmp_path / "spool"}"\n'
        f'[security]\nserver_secret_key = "{keys / "server.key_secret"}"\nclient_keys_dir = "{keys / "clients"}"\n'
    )
    done = cli("serve", "--config", str(config))
    assert done.returncode == 2 and "chmod 600" in done.stderr


def test_half_a_security_config_is_an_error(tmp_path):
    config = tmp_path / "server.toml"
    config.write_text('[security]\nserver_secret_key = "keys/server.key_secret"\n')
    done = cli("serve", "--config", str(config))
    assert done.returncode == 2 and "set both" in done.stderr
