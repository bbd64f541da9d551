"""Atomic file writes: write beside the target under a temporary name, then rename.

A reader (a browser, the summary page, another process) never sees half a file, and a failed write
leaves no partial file behind. Temporary names keep the target's suffix (ffmpeg picks the container
from it) and are created with the process umask, like any other output file.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def sibling_temp_path(path: Path) -> Path:
    """A fresh hidden name in the target's folder, with the same suffix."""
    return path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_temp_path(path)
    try:
        with open(tmp, "xb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
