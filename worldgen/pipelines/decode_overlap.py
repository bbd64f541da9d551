"""One causal chunk's decode on a second CUDA stream, beside the next chunk's forwards (`FastPipeline.overlap_decode`).

On by default on CUDA wherever the memory plan has room for a decode beside a forward's activations
(`FastPipeline.graph_room`: always without a VRAM budget; under one beside a bf16 VAE only, as measured in
docs/benchmarks.md, "Session 8: Fast"); `LINGBOT_ISAAC_DECODE_OVERLAP=0` turns it off (every chunk then
decodes after its forwards on the loop's stream). The same decoder, the same pushes in the same order, only
on another stream: the same frames. Whether it ran is the rollout record's `decode_overlap`.

Its own module: the stream and event bookkeeping is a concern apart from the chunk loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch

from worldgen.models.vae_tiling import StreamingDecoder
from worldgen.pipelines.decoded_video import Keep
from worldgen.runtime.cuda_memory import to_host

ENV_SWITCH = "LINGBOT_ISAAC_DECODE_OVERLAP"  # "0" (or false/no/off): no second stream; unset: on where it fits
# Which of the two streams the GPU's scheduler serves first (PyTorch maps this to the device's highest priority; the
# other stream keeps the default, the lowest; it fills what the first leaves). A batch job's chunk loop goes first
# (`loop_first`): measured on the H200 with the 1.3B at 161 frames, one machine, fp8 steady chunk 0.633 -> 0.566 s,
# exact 0.757 -> 0.745 s (decoding after the forwards: 0.584 / 0.779 s; docs/benchmarks.md, "Session 33"). A live
# job has no second stream (`FastPipeline._decode_stream`): its pixels are what the user waits for, and a decode
# beside the cache refresh, even served first, sent them later (the 1.3B exact at 161 frames, one machine:
# pose-to-pixels 0.90-0.92 s at the median, against 0.82 s decoding each chunk at once, alone; "Session 34").
FIRST_PRIORITY = -5


def enabled_by_environment() -> bool:
    """The process's switch for the decode overlap (`FastPipeline.overlap_decode`'s default): on unless turned off."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


# One stream per device and role for the process: the caching allocator keeps a freed block for the stream that used
# it, so a new stream each job would leave the last job's blocks (a decoder's caches: 3.4 GiB in float32 at 464x832)
# to none but that stream, at a budget's cap
_STREAMS: dict[tuple[str, int, int], torch.cuda.Stream] = {}


def _stream(role: str, device: torch.device, priority: int) -> torch.cuda.Stream:
    device = torch.device(device)
    key = (role, torch.cuda.current_device() if device.index is None else device.index, priority)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device, priority=priority)
    return _STREAMS[key]


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The decodes' second stream, served after the loop's (`loop_first`)."""
    return _stream("decode", device, 0)


@contextlib.contextmanager
def loop_first(device: torch.device, side: torch.cuda.Stream | None) -> Iterator[None]:
    """The chunk loop on a stream of higher priority than the decodes' `side` stream (`FIRST_PRIORITY`), where a
    decode runs beside it; else as it is. The loop's stream waits for the work
    queued before it, and the stream the caller goes on with waits for the loop's (so what the loop made, and what
    it freed, is ordered for it)."""
    if side is None:
        yield
        return
    outer = torch.cuda.current_stream(device)
    loop = _stream("loop", device, FIRST_PRIORITY)
    loop.wait_stream(outer)
    try:
        with torch.cuda.stream(loop):
            yield
    finally:
        outer.wait_stream(loop)


class PendingDecode:
    """One chunk's decode launched on a second CUDA stream (`FastPipeline._decode_stream`): it waits for
    the chunk's latent on the loop's stream, then runs beside whatever the loop launches next. Every
    push of the decoder runs on that stream, so its caches never cross streams."""

    def __init__(self, decoder: StreamingDecoder, latent: torch.Tensor, stream: torch.cuda.Stream):
        ready = torch.cuda.Event()
        ready.record()  # on the loop's stream: the latent is final
        self.start, self.done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            latent.record_stream(stream)  # read there: not reused by the loop before the decode ran
            self.start.record()
            self.piece = decoder.push(latent[None])[0]
            self.done.record()
        self.stream = stream
        self.launched = time.perf_counter()
        self.waited = 0.0

    def frames(self, keep: Keep | None = None) -> torch.Tensor:
        """Wait for the decode; its frames on the CPU (as `keep` makes them, on the GPU), made and copied on the
        decode's stream (on the loop's, they would wait for whatever the loop queued since)."""
        begin = time.perf_counter()
        self.done.synchronize()
        self.waited = time.perf_counter() - begin
        with torch.cuda.stream(self.stream):
            return to_host(self.piece if keep is None else keep(self.piece))

    def hidden_seconds(self) -> float:
        """The decode's GPU seconds that ran while the loop went on (not waited for)."""
        self.done.synchronize()
        gpu = self.start.elapsed_time(self.done) / 1000
        return max(0.0, gpu - self.waited)
