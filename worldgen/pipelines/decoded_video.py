"""A Fast rollout's video on the host, put together chunk by chunk as the chunks decode.

Its own module: the chunk loop (`worldgen.pipelines.fast`) only hands pieces over.
"""

from __future__ import annotations

import torch


class DecodedVideo:
    """The video [3, F, H, W] on the CPU, written chunk by chunk as the chunks decode: one copy of the
    frames, where a list of pieces joined at the end held two (0.7 GiB more at 161 frames, 464x832)."""

    def __init__(self, frames: int):
        self.frames = frames
        self.buffer: torch.Tensor | None = None
        self.spans: list[tuple[int, int]] = []  # chunk i's frames: buffer[:, start:end]

    def __len__(self) -> int:
        return len(self.spans)

    def put(self, index: int, piece: torch.Tensor) -> None:
        """Chunk `index`'s frames [3, f, H, W]: the next chunk, or one already put again (same length)."""
        if self.buffer is None:
            self.buffer = torch.empty((piece.shape[0], self.frames, *piece.shape[2:]), dtype=piece.dtype)
        if index == len(self.spans):
            start = self.spans[-1][1] if self.spans else 0
            self.spans.append((start, start + piece.shape[1]))
        start, end = self.spans[index]
        self.buffer[:, start:end] = piece

    def video(self) -> torch.Tensor:
        """The frames put so far (all of them unless a live camera ended the video early)."""
        if self.buffer is None:
            return torch.empty(3, 0, 0, 0)
        end = self.spans[-1][1]
        return self.buffer if end == self.frames else self.buffer[:, :end].clone()
