"""A two-device causal job's chunk decodes split by spatial tiles: rank 1 decodes the second half of each push's tiles.

Why: rank 0 carries the VAE beside its half of every forward. Its decode (on a second stream: `decode_overlap`)
shares rank 0's GPU with the forwards, and rank 1 waits for rank 0 at each all-to-all: on two H200s a v1 Fast fp8
forward (480x832, 24 GiB a GPU) took rank 0's GPU 127 ms alone but 157-170 ms in the rollout, whose decodes take
0.15-0.2 s of GPU time a chunk (docs/benchmarks.md, "Session 38"). With the tiles split, each rank carries half.

How: where the plan already cuts the decoder's frames into spatial tiles (not parked: `StreamVAE`), rank 0's
`StreamingDecoder` hands the second half of them to `PeerTiles`: their latents go to rank 1, which decodes them with
its own causal caches for those tiles (`RankTiles`: its own VAE, loaded on first use in the dtype rank 0's decode
runs in) and sends the pieces back; rank 0 blends them in as its own. The same tiles and per-frame arithmetic: the
same video. Whole frames (one tile) stay on rank 0.

The pieces travel on a process group of their own (`tiles_group`): on NCCL its own communicator and stream, so a
decode's sends never queue behind a forward's all-to-alls, nor those behind it. Rank 1 runs its tiles on a second
stream beside its forwards (`decode_overlap.side_stream`), as rank 0 does. Both ranks' groups are made right after
the default one, in the same order, and aborted with it when rank 1 is lost.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from worldgen.models.vae_tiling import StreamingDecoder
from worldgen.pipelines import decode_overlap

VaeFactory = Callable[[torch.dtype], torch.nn.Module]  # picklable: rank 1's VAE in a dtype, made in its process


def tiles_group(timeout: datetime.timedelta):
    """The pieces' process group (both ranks call it, right after the default group's start)."""
    return dist.new_group([0, 1], timeout=timeout)


class PeerTiles:
    """Rank 0's side (`StreamingDecoder.peer`): each push's remote tiles sent, their pieces received."""

    def __init__(self, leader, group, dtype: torch.dtype, device: torch.device, serials: Iterator[int]) -> None:
        self.leader, self.group, self.dtype, self.device = leader, group, dtype, device
        self.serials = (
            serials  # one per decoder handing tiles over, for the pair's life: rank 1 keeps the latest's caches
        )

    def start(self, decoder: StreamingDecoder, tiles: list[tuple[tuple[int, int], torch.Tensor]]) -> None:
        if getattr(decoder, "peer_serial", None) is None:
            decoder.peer_serial = next(self.serials)
        shapes = [(key, tuple(latent.shape), latent.dtype) for key, latent in tiles]
        self.leader.send({"op": "decode", "decoder": decoder.peer_serial, "dtype": self.dtype, "tiles": shapes})
        for _, latent in tiles:
            self.leader._collective(dist.send, latent.contiguous(), 1, self.group)
            self.leader.count(latent.nbytes, 0)

    def finish(self, key: tuple[int, int], shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """Tile `key`'s piece from rank 1 (sent in the order `start` named them)."""
        piece = torch.empty(shape, dtype=dtype, device=self.device)
        self.leader._collective(dist.recv, piece, 1, self.group)
        self.leader.count(0, piece.nbytes)
        return piece


class RankTiles:
    """Rank 1's side: the tiles rank 0 hands over (`PeerTiles.start`), decoded and sent back."""

    def __init__(self, vae_factory: VaeFactory | None, group, device: torch.device) -> None:
        self.vae_factory, self.group, self.device = vae_factory, group, device
        self.vae: torch.nn.Module | None = None
        self.dtype: torch.dtype | None = None
        self.decoder: StreamingDecoder | None = None
        self.serial: int | None = None

    def run(self, message: dict[str, Any], split) -> None:
        if self.vae_factory is None:
            raise RuntimeError("rank 1 was started without a VAE: it cannot decode tiles")
        if self.vae is None or self.dtype != message["dtype"]:
            self.vae, self.dtype, self.decoder = None, message["dtype"], None
            self.vae = self.vae_factory(message["dtype"])
        if self.decoder is None or self.serial != message["decoder"]:  # a new job's decoder: fresh caches
            self.decoder, self.serial = StreamingDecoder(self.vae, None), message["decoder"]
        stream = decode_overlap.side_stream(self.device) if self.device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            latents = []
            for _, shape, dtype in message["tiles"]:
                latent = torch.empty(shape, dtype=dtype, device=self.device)
                split._collective(dist.recv, latent, 0, self.group)
                split.count(0, latent.nbytes)
                latents.append(latent)
            for (key, _, _), latent in zip(message["tiles"], latents, strict=True):
                piece = self.decoder.push_tile(tuple(key), latent).contiguous()
                split._collective(dist.send, piece, 0, self.group)
                split.count(piece.nbytes, 0)

    def close(self) -> None:
        """A job ended: its tiles' caches go (the VAE stays for the next)."""
        self.decoder = self.serial = None
