"""Is an mp4 complete? The server checks every result before it calls the job "done".

A writer that runs out of disk leaves a file with `ftyp` and part of `mdat` but no `moov` (the
index, written last): players refuse it. This walks the ISO BMFF boxes without decoding anything:
the top-level boxes must tile the file exactly, `moov` and `mdat` must be there, and the video
track's sample table (`stsz`) must hold the expected number of frames.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

_CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl")
_MAX_BOXES = 4096


class IncompleteVideo(ValueError):
    """The file is not a complete mp4 (truncated, no index, wrong frame count)."""


def _boxes(data, start: int, end: int):
    offset, count = start, 0
    while offset < end:
        count += 1
        if end - offset < 8 or count > _MAX_BOXES:
            raise IncompleteVideo(f"a box header is cut at byte {offset}")
        size, kind = struct.unpack_from(">I4s", data, offset)
        header = 8
        if size == 1:
            if end - offset < 16:
                raise IncompleteVideo(f"a 64-bit box header is cut at byte {offset}")
            (size,) = struct.unpack_from(">Q", data, offset + 8)
            header = 16
        elif size == 0:
            size = end - offset  # "to the end of the file"
        if size < header or offset + size > end:
            raise IncompleteVideo(f"box {kind!r} at byte {offset} claims {size} bytes; only {end - offset} remain")
        yield kind, offset + header, offset + size
        offset += size


def _walk(data, start: int, end: int, counts: list[int]) -> None:
    for kind, body, box_end in _boxes(data, start, end):
        if kind in _CONTAINERS:
            _walk(data, body, box_end, counts)
        elif kind == b"stsz":
            if box_end - body < 12:
                raise IncompleteVideo("stsz box is too short")
            counts.append(struct.unpack_from(">I", data, body + 8)[0])


def sample_counts(data) -> list[int]:
    """The number of samples of every track (from each `stsz`), in file order. `data`: bytes or mmap."""
    counts: list[int] = []
    top = {kind: (body, end) for kind, body, end in _boxes(data, 0, len(data))}
    if b"ftyp" not in top:
        raise IncompleteVideo("no ftyp box: not an mp4")
    if b"moov" not in top:
        raise IncompleteVideo("no moov atom: the file was cut short before its index was written")
    if b"mdat" not in top:
        raise IncompleteVideo("no mdat box: the file holds no video data")
    _walk(data, *top[b"moov"], counts)
    return counts


def check_complete(path: Path, expected_frames: int | None = None) -> int:
    """Raise IncompleteVideo unless `path` is a whole mp4 (with `expected_frames` frames); its size."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise IncompleteVideo("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # no copy of a large video
            counts = sample_counts(data)
    if not counts:
        raise IncompleteVideo("the mp4 has no track with a sample table")
    if expected_frames is not None and expected_frames not in counts:
        raise IncompleteVideo(f"the mp4 holds {max(counts)} frames, {expected_frames} were expected")
    return size
