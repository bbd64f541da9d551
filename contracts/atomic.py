"""Atomic, durable file writes: the one helper every writer uses.

Write beside the target under a hidden temporary name, fsync the file, rename it over the target,
fsync the folder. A reader (or a crash, or a power cut once the call returned) sees the old file or
the new one, never half of one; a failed write leaves no temporary file behind. Temporary names
keep the target's suffix, so tools that pick a container from it (ffmpeg) still work.

Modes: what these helpers create gets the mode a plain `open()` / `mkdir()` would give it (0666 or
0777 less the process umask), so a rollout, record or episode is as shared as any other output of
the user's. Nothing here uses `mkstemp`/`mkdtemp` (always 0600/0700). Files that must be private
(CURVE secret keys) are created by their own writer with an explicit mode (`bridge.wire.security`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def temp_path(path: str | os.PathLike) -> Path:
    """A fresh hidden name in the target's folder, with the same suffix."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")


def staging_dir(target: str | os.PathLike) -> Path:
    """A fresh hidden folder beside `target` (mode 0777 & ~umask, as `mkdir` makes it) to build a
    folder in before `replace_dir` renames it onto `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir()
    return staging


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a written file's data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover (Windows)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and folder under `root` (deepest first), then `root` itself."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(os.path.join(folder, name))
        fsync_dir(folder)


def commit(tmp: str | os.PathLike, path: str | os.PathLike, durable: bool = True) -> Path:
    """Move a finished temporary file onto `path`: fsync it, rename, fsync the folder."""
    path = Path(path)
    if durable:
        fsync_file(tmp)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write the file at; on success it replaces `path` (see `commit`).

    For writers that want a file name (ffmpeg, a library that opens the file itself)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        commit(tmp, path, durable)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", durable: bool = True, **kwargs: Any) -> Iterator[IO]:
    """`open()` for writing, atomically: the file appears at `path` only when the block succeeds."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes whole files: mode must start with 'w' (got {mode!r})")
    with atomic_path(path, durable) as tmp, open(tmp, mode.replace("w", "x", 1), **kwargs) as handle:
        yield handle
        handle.flush()


def write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> Path:
    """Replace `path` with `data` atomically (and durably unless `durable=False`)."""
    with atomic_open(path, "wb", durable) as handle:
        handle.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    return write_bytes(path, text.encode("utf-8"), durable)


def write_json(path: str | os.PathLike, value: Any, durable: bool = True, **dumps: Any) -> Path:
    return write_bytes(path, (json.dumps(value, **dumps) + "\n").encode("utf-8"), durable)


def replace_dir(staging: str | os.PathLike, target: str | os.PathLike, overwrite: bool = False) -> Path:
    """Rename a finished staging folder (fsynced here) to `target`, durably.

    An existing `target` is replaced only with `overwrite` (renamed aside, then removed), so a reader
    sees the old folder or the new one, never a mix. Raises FileExistsError otherwise.
    """
    staging, target = Path(staging), Path(target)
    fsync_tree(staging)
    if not target.exists():
        os.rename(staging, target)
    elif not overwrite:
        raise FileExistsError(f"{target} already exists")
    else:
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
    return target
