"""A Fast job's chunk files (each decoded chunk's mp4 and its preview still), written on a background thread.

A client that asks for chunks (`want_chunks`: live views, Isaac Sim's window) gets each one as an mp4 and a
PNG of its last frame. Encoding them is host work: 0.1-0.3 s a 12-frame 464x832 chunk on a 16-core host,
1.1-1.3 s on a 2-core one, with x264's default preset (its quick settings, `contracts.video.QUICK_X264`, which
chunks now use: 0.13 s for 16 frames on 2 cores, against 0.41 s). Done in the chunk loop, the GPU waited for it before the next chunk's forwards
(docs/benchmarks.md, "Session 17: Fast"). Here the loop hands the chunk over and goes on; one thread writes
and reports the chunks in order. A write that failed is raised in the loop at the next chunk, or when the
job ends (`close`), so a job never reports a result whose chunk files are missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from contracts import atomic
from contracts.settings import GenerationSettings

if TYPE_CHECKING:  # the worker imports this module before it imports torch (its `ChunkReport`)
    import torch

# (index, total, the chunk's mp4, its frames, its still): what the worker tells the client of each chunk
ChunkReport = Callable[[int, int, Path, int, Path | None], None]
ChunkFn = Callable[[int, int, "torch.Tensor"], None]  # the chunk loop's `on_chunk`: (index, total, frames)


@contextlib.contextmanager
def chunk_reporter(
    settings: GenerationSettings,
    output: Path,
    progress: Callable[[str, int, int], None],
    report: ChunkReport | None,
) -> Iterator[ChunkFn | None]:
    """The chunk loop's `on_chunk` for a Fast job (None for the base model). Every Fast job reports its
    chunks as progress, in the loop's thread (replay's bar, the window; a cancel is raised there); a client
    that asked for chunks (`report`) also gets each one's files (`ChunkFiles`), waited for when the block
    ends, and dropped if they have not started when it fails."""
    if settings.model != "fast":
        yield None
        return
    files = None if report is None else ChunkFiles(output, settings.fps, report)

    def on_chunk(index: int, total: int, frames: torch.Tensor) -> None:
        if files is not None:
            files.submit(index, total, frames)
        progress("chunk", index + 1, total)

    try:
        yield on_chunk
    except BaseException:
        if files is not None:
            files.close(cancel=True)
        raise
    if files is not None:
        files.close()


class ChunkFiles:
    """`submit(index, total, frames)` writes `<output stem>.chunkNNN.mp4` and `.png` beside `output`, then
    calls `report`; `close()` waits for every chunk submitted and raises the first failure."""

    def __init__(self, output: Path, fps: int, report: ChunkReport):
        self.output, self.fps, self.report = output, fps, report
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-files")
        self._stills = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-stills")
        self._pending: list[Future] = []

    def submit(self, index: int, total: int, frames: torch.Tensor) -> None:
        """Queue chunk `index`'s frames ([f, H, W, 3] uint8, or [3, f, H, W] in [-1, 1]; a tensor nobody changes
        afterwards); raises a failure of an earlier chunk's write."""
        self._raise_failures(wait=False)
        self._pending.append(self._pool.submit(self._write, index, total, frames))

    def close(self, cancel: bool = False) -> None:
        """Wait for the chunks submitted (`cancel`: drop those not started: the job failed) and stop the
        thread; raises the first failure unless cancelling."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        self._stills.shutdown(wait=True)
        if not cancel:
            self._raise_failures(wait=True)

    def _write(self, index: int, total: int, frames: torch.Tensor) -> None:
        from contracts.video import still_png
        from worldgen.video_out import to_uint8_frames, write_mp4

        pixels = to_uint8_frames(frames)  # the mp4's uint8 frames as they come (`worldgen.rollout.mp4_only`)
        path = self.output.with_name(f"{self.output.stem}.chunk{index:03d}.mp4")
        png = self._stills.submit(still_png, pixels[-1])  # beside x264 (both leave the GIL): a live view waits
        write_mp4(pixels, path, fps=self.fps, quick=True)
        still = atomic.write_bytes(path.with_suffix(".png"), png.result(), durable=False)
        self.report(index, total, path, len(pixels), still)

    def _raise_failures(self, wait: bool) -> None:
        done = [f for f in self._pending if wait or f.done()]
        self._pending = [f for f in self._pending if f not in done]
        for future in done:
            future.result()  # the write's exception, if any, here in the loop's thread
