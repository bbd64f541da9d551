"""`host_heap.trim`: glibc's free heap pages handed back, measured on this process, in a fresh one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FRAGMENTED = """
import gc, sys
from worldgen.runtime import host_heap
from worldgen.runtime.metering import rss_gib
blocks = [bytearray(4096) for _ in range(75_000)]  # ~300 MiB through malloc (not Python's small-object arenas)
for block in blocks:
    block[::512] = bytes([1]) * 8  # touched: resident
keep = blocks[::100]  # every hundredth kept: the freed pages lie between live ones, past what free() hands back
del blocks
gc.collect()
held = rss_gib()
released = host_heap.trim()
print(held, released, rss_gib(), len(keep))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_trim_hands_back_the_free_pages_between_live_blocks():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FRAGMENTED)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    held, released, after, kept = done.stdout.split()
    assert float(released) > 0.2  # of ~0.29 GiB freed between the kept blocks
    assert float(after) < float(held) - 0.2
    assert int(kept) == 750  # the live blocks were still there (and untouched by the trim)


def test_trim_says_none_where_there_is_no_malloc_trim(monkeypatch):
    from worldgen.runtime import host_heap

    monkeypatch.setattr(host_heap, "_malloc_trim", lambda: None)
    assert host_heap.trim() is None
