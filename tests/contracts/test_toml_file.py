"""The one TOML reader: every config file is read by `contracts.toml_file.read_toml`, and a missing,
unreadable or malformed file is refused with the caller's own error, naming the file."""

from __future__ import annotations

import os

import pytest

from bridge.server.server_config import ConfigError, load_server_config
from contracts.settings import SettingsError, load_presets
from contracts.toml_file import TomlError, read_toml
from lingbot_isaac.replay import ReplayError, config_quat_order
from tests.conftest import files_matching


def test_only_toml_file_parses_toml():
    assert files_matching(r"^\s*(?:import|from) tomll?i") == ["contracts/toml_file.py"]


def test_tables_are_read(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('[server]\nbind = "tcp://127.0.0.1:1"\n[worker]\ndevices = ["cpu", "cpu"]\n')
    assert read_toml(path) == {"server": {"bind": "tcp://127.0.0.1:1"}, "worker": {"devices": ["cpu", "cpu"]}}


def test_a_missing_file_is_named_with_the_fix(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(TomlError, match=r"^server config .*nope\.toml not found \(try config/server\.toml\)$"):
        read_toml(path, "server config", "try config/server.toml")
    with pytest.raises(TomlError, match=r"^TOML file .*nope\.toml not found$"):
        read_toml(path)


@pytest.mark.parametrize("data", [b"[server\n", b"a = 1\na = 2\n", b"a = '\xff'\n"])
def test_malformed_toml_is_named_with_where(tmp_path, data):
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    with pytest.raises(TomlError) as info:
        read_toml(path)
    assert str(info.value).startswith(f"{path}: not valid TOML: ")


def test_an_unreadable_file_is_named(tmp_path):
    path = tmp_path / "secret.toml"
    path.write_text("a = 1\n")
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(TomlError, match=r"secret\.toml: cannot be read: Permission denied"):
            read_toml(path)
    # root reads any file it may open; a regular file whose read fails still must be named
    # (CI runs as root): Linux's /proc/self/mem at offset 0 is unmapped memory, EIO
    if not os.path.isfile("/proc/self/mem"):
        return
    with pytest.raises(TomlError, match=r"^/proc/self/mem: cannot be read: Input/output error$"):
        read_toml("/proc/self/mem")


def test_each_caller_gets_its_own_error(tmp_path):
    """The server, the presets and replay's config/isaac.toml read through the one reader and
    report a bad file as their own bad input."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    for load, error in ((load_server_config, ConfigError), (load_presets, SettingsError),
                        (config_quat_order, ReplayError)):  # fmt: skip
        with pytest.raises(error, match=r"bad\.toml: not valid TOML: "):
            load(bad)
    with pytest.raises(ConfigError, match=r"not found \(try config/server\.toml\)"):
        load_server_config(tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match=r"^generation presets file .*missing\.toml not found$"):
        load_presets(tmp_path / "missing.toml")
    assert config_quat_order(tmp_path / "missing.toml") is None  # no isaac.toml: ask
