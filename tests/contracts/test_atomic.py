"""contracts.atomic: the file appears whole or not at all; nothing is left behind on failure."""

from __future__ import annotations

import json
import os

import pytest

from contracts import atomic


def test_write_bytes_replaces_whole_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "state.json"
    atomic.write_json(target, {"state": "queued"})
    atomic.write_json(target, {"state": "done"})
    assert json.loads(target.read_text()) == {"state": "done"}
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "result.mp4"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.atomic_open(target) as handle:
        handle.write(b"half of a new one")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.mp4"]


def test_atomic_path_keeps_the_suffix_for_tools_that_need_it(tmp_path):
    with atomic.atomic_path(tmp_path / "video.mp4") as tmp:
        assert tmp.suffix == ".mp4" and tmp.parent == tmp_path and tmp.name.startswith(".")
        tmp.write_bytes(b"mp4")
    assert (tmp_path / "video.mp4").read_bytes() == b"mp4"


def test_atomic_open_refuses_read_modes(tmp_path):
    with pytest.raises(ValueError, match="mode"), atomic.atomic_open(tmp_path / "x", "rb"):
        pass


def test_replace_dir_swaps_whole_folders(tmp_path):
    for content in ("first", "second"):
        staging = tmp_path / f".ep.{content}"
        staging.mkdir()
        (staging / "a.txt").write_text(content)
        if content == "first":
            atomic.replace_dir(staging, tmp_path / "ep")
        else:
            with pytest.raises(FileExistsError):
                atomic.replace_dir(staging, tmp_path / "ep")
            atomic.replace_dir(staging, tmp_path / "ep", overwrite=True)
    assert (tmp_path / "ep" / "a.txt").read_text() == "second"
    assert sorted(os.listdir(tmp_path)) == ["ep"]
