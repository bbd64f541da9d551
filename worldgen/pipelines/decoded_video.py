"""A Fast rollout's video on the host, put together chunk by chunk as the chunks decode.

Its own module: the chunk loop (`worldgen.pipelines.fast`) only hands pieces over.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

# how a caller keeps each decoded chunk [3, f, H, W]: as a tensor with its f frames first (the mp4's uint8 frames
# [f, H, W, 3]: `worldgen.video_out.mp4_frames`, a quarter of the float32 video's memory). It runs where the chunk
# was decoded (`worldgen.pipelines.chunk_decodes`: on the GPU, in place of the copy to the host), in torch operations
# on that device, and may return the kept frames already on the CPU (`mp4_frames` does).
Keep = Callable[[torch.Tensor], torch.Tensor]
# where a caller that only writes the video has each kept chunk go, in order, instead of into a video held whole (an
# `contracts.video.Mp4Stream`'s `append`: `worldgen.rollout`): called with the chunk as `Keep` made it, on the CPU
Sink = Callable[[torch.Tensor], None]


class DecodedVideo:
    """The video [3, F, H, W] on the CPU, written chunk by chunk as the chunks decode: one copy of the
    frames, where a list of pieces joined at the end held two (0.7 GiB more at 161 frames, 464x832).
    `frames_first`: the chunks come as a `Keep` made them, frames first ([f, ...]; a 349-frame video at 464x832
    is 1.67 GB in float32, 0.40 GB as the mp4's uint8 frames).

    `background`: the copies run on a thread of their own, in order (a GPU job's: the chunk loop then queues the next
    chunk's work instead of leaving the GPU idle meanwhile; a 16-frame 464x832 float32 chunk's copy into fresh pages
    took 20 ms on 2 CPU cores); `flush` (and `video`) wait for them, and a write's failure is raised in the caller's
    thread, at the next `put` or there.

    `sink`: each chunk goes there instead, in order, and nothing is held (`video` then has no frames, only their
    size): a long live job's frames are not kept in memory (4.7 GB at 4,097 frames of 464x832 as uint8)."""

    def __init__(self, frames: int, frames_first: bool = False, background: bool = False, sink: Sink | None = None):
        self.frames = frames
        self.frames_first = frames_first
        self.axis = 0 if frames_first else 1  # where the frames are in a chunk
        self.sink = sink
        self.sunk = 0  # chunks gone to the sink
        self.buffer: torch.Tensor | None = None
        self.spans: list[tuple[int, int]] = []  # chunk i's frames: buffer[:, start:end] ([start:end] frames first)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="decoded-video") if background else None
        self._writes: list[Future] = []

    def __len__(self) -> int:
        return len(self.spans)

    def put(self, index: int, piece: torch.Tensor) -> None:
        """Chunk `index`'s frames [3, f, H, W] ([f, ...] with `frames_first`; a tensor nobody changes afterwards): the
        next chunk, or one already put again (same length)."""
        if index == len(self.spans):
            start = self.spans[-1][1] if self.spans else 0
            self.spans.append((start, start + piece.shape[self.axis]))
        if self._writer is None:
            self._write(index, piece)
            return
        self._raise_failures(wait=False)
        self._writes.append(self._writer.submit(self._write, index, piece))

    def _write(self, index: int, piece: torch.Tensor) -> None:
        if self.sink is not None:
            if index == self.sunk:  # a chunk put again (`ChunkDecodes.finish` decodes every chunk after an
                self.sink(piece)  # out-of-memory decode: the same tiles, the same frames) has gone already
                self.sunk += 1
            if self.buffer is None:  # no frames held: the video's size only
                shape = list(piece.shape)
                shape[self.axis] = 0
                self.buffer = torch.empty(shape, dtype=piece.dtype)
            return
        if self.buffer is None:
            shape = list(piece.shape)
            shape[self.axis] = self.frames
            self.buffer = torch.empty(shape, dtype=piece.dtype)
        start, end = self.spans[index]
        self.buffer.narrow(self.axis, start, end - start).copy_(piece)

    def flush(self) -> None:
        """Wait for the writes put so far; raises the first one's failure."""
        self._raise_failures(wait=True)

    def _raise_failures(self, wait: bool) -> None:
        done = [f for f in self._writes if wait or f.done()]
        self._writes = [f for f in self._writes if f not in done]
        for future in done:
            future.result()  # the write's exception, if any, here in the caller's thread

    def video(self) -> torch.Tensor:
        """The frames put so far (all of them unless a live camera ended the video early); with a sink, none of them
        (the frames' axis empty, the rest their size)."""
        self.flush()
        if self.sink is not None and self.buffer is not None:
            return self.buffer
        if self.buffer is None:
            return torch.empty(0, 0, 0, 3, dtype=torch.uint8) if self.frames_first else torch.empty(3, 0, 0, 0)
        end = self.spans[-1][1]
        return self.buffer if end == self.frames else self.buffer.narrow(self.axis, 0, end).clone()
