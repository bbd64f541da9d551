"""A Fast rollout's chunk decodes: each chunk decoded as soon as its forwards are done (on the loop's stream,
or on a second CUDA stream beside the next chunk's forwards: `worldgen.pipelines.decode_overlap`), or after
the loop (a batch job's plan, or a decode beside the KV cache that ran out of memory), and each chunk's
seconds (`FastPipeline.chunk_timings`).

Its own module: the chunk loop (`FastPipeline.generate`) hands each finished latent over and asks for the
video at the end; what runs where and when is this concern.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from worldgen.models.vae_tiling import StreamingDecoder
from worldgen.pipelines import decode_overlap
from worldgen.pipelines.base import Progress
from worldgen.pipelines.decode_overlap import PendingDecode
from worldgen.pipelines.decoded_video import DecodedVideo, Keep, Sink
from worldgen.runtime.cuda_memory import free_device_memory, to_host
from worldgen.runtime.metering import LapClock


class ChunkDecodes:
    """Takes each chunk's final latent as the loop makes it (`take`), decodes it when the plan says, hands
    its frames to `on_chunk`, and puts the video together (`finish`, then `video`)."""

    def __init__(
        self,
        pipe,
        clock: LapClock,
        frames: int,
        num_chunks: int,
        on_chunk: Callable[[int, int, torch.Tensor], None] | None,
        progress: Progress,
        live: bool,
        keep: Keep | None = None,
        sink: Sink | None = None,
    ):
        self.pipe, self.clock, self.num_chunks = pipe, clock, num_chunks
        self.on_chunk, self.progress, self.live = on_chunk, progress, live
        # `keep` runs where the chunk was decoded, as it is copied to the host (the mp4's uint8 frames: a quarter of
        # the bytes, and none of the host's time: 82 ms a 16-frame 464x832 chunk on 2 CPU cores, on a live chunk's way
        # out); on a GPU the copy into the video runs beside the loop, which meanwhile queues the next chunk's forwards
        self.keep = keep
        background = pipe.device.type == "cuda"
        self.pieces = DecodedVideo(frames, frames_first=keep is not None, background=background, sink=sink)
        self.latents: list[torch.Tensor] = []
        self.decoder: StreamingDecoder | None = None
        self.streaming = not pipe.decode_after_loop
        self.before: dict[str, float] = {}
        self.side: torch.cuda.Stream | None = None
        self.pending: PendingDecode | None = None

    def start(self) -> None:
        """The loop starts: each chunk's seconds are counted from here."""
        pipe = self.pipe
        pipe.chunk_timings = []
        self.before = dict(self.clock.seconds)
        # chunks 1.. decode on a second CUDA stream beside the next chunk's forwards where the plan
        # leaves room for both at once (`graph_room`); chunk 0 decodes at once (its preview first)
        self.side = pipe._decode_stream(live=self.live)
        pipe.decode_overlapped = self.side is not None and self.streaming

    def loop_first(self) -> contextlib.AbstractContextManager[None]:
        """Where the chunk loop runs: on a stream served before the decodes' where they run beside it
        (`decode_overlap`), else where it is."""
        return decode_overlap.loop_first(self.pipe.device, self.side)

    def _decoder(self) -> StreamingDecoder:
        return job_decoder(self.pipe, self.pipe.plan.vae_tile_pixels)

    def host(self, piece: torch.Tensor) -> torch.Tensor:
        """A decoded chunk (where it was decoded) -> what is kept of it, on the CPU."""
        return to_host(piece if self.keep is None else self.keep(piece))

    def emit(self, piece: torch.Tensor) -> None:
        """Chunk `len(pieces)`'s frames, on the CPU as kept, into the video and to `on_chunk`."""
        pieces = self.pieces
        pieces.put(len(pieces), piece)
        if len(pieces) == 1:
            self.clock.mark("first_chunk")
        if self.on_chunk is not None:
            self.on_chunk(len(pieces) - 1, self.num_chunks, piece)

    def take(self, latent: torch.Tensor) -> None:
        """Chunk `len(latents)`'s final latent (on the device), as the loop yields it."""
        pipe, clock = self.pipe, self.clock
        clock.lap("dit")
        self.latents.append(latent.cpu())
        timing: dict[str, float] = {"overlap": 0.0}
        if self.pending is not None:  # the previous chunk's decode ran beside this chunk's forwards
            pipe.chunk_timings[-1]["overlap"] = self.pending.hidden_seconds()
            self.emit(self.pending.frames(self.keep))
            self.pending = None
        if self.streaming:
            try:
                self.decoder = self.decoder or self._decoder()
                vae_device = next(self.decoder.vae.parameters()).device
                if self.side is None:
                    self.emit(self.host(self.decoder.push(latent[None].to(vae_device))[0]))
                else:
                    self.pending = PendingDecode(self.decoder, latent.to(vae_device), self.side)
                    if len(self.latents) == 1:  # the first preview as soon as it exists
                        self.emit(self.pending.frames(self.keep))
                        self.pending = None
            except torch.OutOfMemoryError as exc:
                # the plan's estimate was short: finish the loop, then decode every chunk again
                # with the same tiles once the KV cache is gone (so the same video)
                self.streaming, self.decoder, self.pending = False, None, None
                pipe.decode_overlapped = False
                free_device_memory(pipe.device, collect_cycles=True)
                pipe.plan.notes += (
                    f"decoding chunk {len(self.latents) - 1} beside the KV cache ran out of memory "
                    f"({str(exc).splitlines()[0][:240]}): chunks decoded after the loop",
                )
        clock.lap("decode")
        # this chunk's share (its forwards and the refresh before it, its encode, its decode:
        # with a second stream, launching it and waiting for the previous chunk's to finish)
        parts = ("dit", "encode", "decode") + (("poses",) if self.live else ())
        spent = {k: clock.seconds.get(k, 0.0) - self.before.get(k, 0.0) for k in parts}
        pipe.chunk_timings.append({**spent, **timing, "wall": sum(spent.values())})
        self.before = dict(clock.seconds)

    def finish(self) -> None:
        """After the loop: the last chunk's pending decode, or every chunk's decode where the plan (or an
        out-of-memory decode) left them for now."""
        pipe, clock, before = self.pipe, self.clock, self.before
        if self.pending is not None:  # the last chunk's decode: nothing left to overlap it with
            self.emit(self.pending.frames(self.keep))
            self.pending = None
            clock.lap("decode")
            pipe.chunk_timings[-1]["decode"] += clock.seconds["decode"] - before["decode"]
            pipe.chunk_timings[-1]["wall"] += clock.seconds["decode"] - before["decode"]
        if not self.streaming:  # a batch job's plan, or a decode beside the KV cache that ran out of memory
            decoder = self._decoder()
            done = len(self.pieces)
            device = next(decoder.vae.parameters()).device
            clock.lap("dit")
            for i, latent in enumerate(self.latents):
                piece = self.host(decoder.push(latent[None].to(device))[0])
                if i < done:
                    self.pieces.put(i, piece)
                else:
                    self.emit(piece)
                self.progress("decode", i + 1, len(self.latents))
                seconds = clock.seconds.get("decode", 0.0)
                clock.lap("decode")
                spent = clock.seconds["decode"] - seconds
                pipe.chunk_timings[i]["decode"] += spent
                pipe.chunk_timings[i]["wall"] += spent
            del decoder
        self.decoder = None
        seconds = clock.seconds.get("decode", 0.0)
        self.pieces.flush()  # the last chunks' writes on the host: the last chunk's time
        clock.lap("decode")
        if pipe.chunk_timings:
            pipe.chunk_timings[-1]["decode"] += clock.seconds["decode"] - seconds
            pipe.chunk_timings[-1]["wall"] += clock.seconds["decode"] - seconds

    def video(self) -> torch.Tensor:
        return self.pieces.video()


def job_decoder(pipe, tile_pixels: int | None) -> StreamingDecoder:
    """A job's streamed decoder: the plan's tiles (`tile_pixels`), each tile's caches parked in host memory between
    its turns where the plan's cut says so (`vae_tiling._Streaming.park`: one tile's on the device at a time). One
    home for the job's decodes and the run ahead of them (`fast_warm_up.first_use_ahead`), which so pins the parked
    caches' host memory the job then reuses."""
    park = getattr(getattr(pipe, "vae_cut", None), "parked", False)
    return StreamingDecoder(pipe.residency.use("vae"), tile_pixels, park=park)
