"""A Fast job's chunk files written beside the chunk loop (`worldgen.chunk_files`): the loop never waits
for a write, chunks are written and reported in order, a failed write reaches the loop, a failed job
drops the writes not started."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from contracts.video import read_mp4
from worldgen.chunk_files import ChunkFiles


def frames(count: int, value: float) -> torch.Tensor:
    return torch.full((3, count, 16, 24), value)


def test_chunks_are_written_and_reported_in_order_without_the_loop_waiting(tmp_path):
    reported: list[tuple[int, int, str, int, str]] = []
    first_may_finish = threading.Event()

    def report(index, total, path, count, still):
        if index == 0:
            assert first_may_finish.wait(30)  # the loop goes on meanwhile
        reported.append((index, total, path.name, count, still.name))

    files = ChunkFiles(tmp_path / "out.mp4", 16, report)
    files.submit(0, 2, frames(9, -0.5))
    files.submit(1, 2, frames(12, 0.5))  # returns while chunk 0's report still blocks
    assert reported == []
    first_may_finish.set()
    files.close()
    assert reported == [
        (0, 2, "out.chunk000.mp4", 9, "out.chunk000.png"),
        (1, 2, "out.chunk001.mp4", 12, "out.chunk001.png"),
    ]
    video = read_mp4(tmp_path / "out.chunk001.mp4")[0]
    assert video.shape == (12, 16, 24, 3) and abs(float(video.mean()) - 191) < 3  # 0.5 in [-1, 1] -> 191
    assert (tmp_path / "out.chunk000.png").stat().st_size > 0
    assert b"bframes=0 " in (tmp_path / "out.chunk001.mp4").read_bytes()  # x264's quick settings (contracts.video)


def test_a_failed_write_is_raised_in_the_loop_at_the_next_chunk_or_at_the_end(tmp_path):
    (tmp_path / "a file").write_text("")  # where the chunks' folder should be: no folder can be made there
    files = ChunkFiles(tmp_path / "a file" / "out.mp4", 16, lambda *args: None)
    files.submit(0, 2, frames(9, 0.0))
    with pytest.raises(OSError):
        files.close()
    later = ChunkFiles(tmp_path / "a file" / "out.mp4", 16, lambda *args: None)
    later.submit(0, 2, frames(9, 0.0))
    later._pending[0].exception(timeout=30)  # the first write has failed by now
    with pytest.raises(OSError):
        later.submit(1, 2, frames(12, 0.0))
    later.close(cancel=True)


def test_a_failed_job_drops_the_writes_not_started(tmp_path):
    started, release = threading.Event(), threading.Event()
    written: list[int] = []

    def report(index, *args):
        started.set()
        assert release.wait(30)
        written.append(index)

    files = ChunkFiles(tmp_path / "out.mp4", 16, report)
    for index in range(3):
        files.submit(index, 3, frames(9, 0.0))
    assert started.wait(30)  # chunk 0 is being reported; 1 and 2 wait their turn
    threading.Timer(0.2, release.set).start()  # after the cancel below has dropped them
    files.close(cancel=True)  # waits for chunk 0 only
    assert written == [0]
    assert not Path(tmp_path / "out.chunk001.mp4").exists()
