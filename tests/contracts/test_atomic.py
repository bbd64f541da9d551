"""contracts.atomic: the file appears whole or not at all; nothing is left behind on failure."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import atomic
from tests.conftest import REPO


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


@pytest.fixture
def umask_002():
    """The process umask of a group-shared project folder (restored afterwards)."""
    old = os.umask(0o002)
    yield 0o002
    os.umask(old)


def test_every_writer_gives_the_mode_open_would(tmp_path, umask_002):
    """0666 & ~umask for files, 0777 & ~umask for folders: never mkstemp's 0600 or mkdtemp's 0700."""
    from contracts.provenance import sidecar_path

    atomic.write_bytes(tmp_path / "a.bin", b"x")
    with atomic.atomic_path(tmp_path / "b.mp4") as tmp, open(tmp, "wb") as handle:  # as ffmpeg creates it
        handle.write(b"mp4")
    staging = atomic.staging_dir(tmp_path / "folder")
    (staging / "c.txt").write_text("c")
    atomic.replace_dir(staging, tmp_path / "folder")
    for name in ("a.bin", "b.mp4", "folder/c.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o664, name
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o775
    assert not list(tmp_path.glob(".*")), "no staging or temporary names left behind"
    assert sidecar_path(tmp_path / "b.mp4") == tmp_path / "b.json"


def test_the_tiny_checkpoint_folder_is_made_with_the_umask(tmp_path):
    """The tiny model is built in a staging folder and renamed into the cache: a folder made by
    mkdtemp would stay 0700 (unreadable to the group sharing the cache)."""
    code = "from worldgen.runtime.tiny import ensure_tiny_checkpoint; print(ensure_tiny_checkpoint('bf16'))"
    env = {**os.environ, "LINGBOT_ISAAC_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: os.umask(0o002),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.is_dir() and folder.is_relative_to(tmp_path)
    for path in (folder, *folder.rglob("*")):
        expected = 0o775 if path.is_dir() else 0o664
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_text_cache_entries_get_the_umask_mode(tmp_path, umask_002):
    import torch

    from worldgen.pipelines.text_cache import TextCache

    encoder = tmp_path / "t5.pth"
    encoder.write_bytes(b"weights")
    cache = TextCache(encoder, tmp_path / "cache")
    cache.put("a room", 8, torch.ones(8, 4))
    (entry,) = (tmp_path / "cache").iterdir()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o664
    assert torch.equal(cache.get("a room", 8), torch.ones(8, 4))
