"""A two-GPU rollout's figures for the benchmarks (issue 55): what its link moved per chunk and rank 1's peak CUDA
memory (`worldgen.pipelines.two_gpu.TwoDevices.peer_stats`); bench_v2.py and bench_fast.py take them the same way."""

from __future__ import annotations

import statistics

from worldgen.runtime.memory import GiB


class LinkMeter:
    """Over one rollout of `pipe`: `mark()` at each chunk, then `figures()`; nothing on a one-device pipeline."""

    def __init__(self, pipe) -> None:
        self.split = pipe.scale_out  # a two-GPU pipeline's rank 1 and link, else None
        self.retries = 0 if self.split is None else self.split.peer_stats(reset=True)["alloc_retries"]
        self.moved = [self._bytes()]

    def _bytes(self) -> int:
        leader = None if self.split is None else self.split.leader
        return 0 if leader is None else leader.sent_bytes + leader.received_bytes

    def mark(self) -> None:
        self.moved.append(self._bytes())

    def figures(self) -> dict:
        """Its devices, rank 1's peak allocated GiB, the link's MB each chunk and at the steady chunk's median, and
        rank 1's milliseconds a forward (`worldgen.runtime.metering.ForwardClock`: its inputs, the host launching
        it, its GPU span) and allocation retries at the cap over the rollout."""
        if self.split is None:
            return {}
        peer = self.split.peer_stats()
        per_chunk = [round((b - a) / 2**20, 1) for a, b in zip(self.moved, self.moved[1:], strict=False)]
        peak, clock = peer["peak_allocated_bytes"], peer["clock"]
        n = clock["forwards"]
        spans = {k[:-2]: clock[k] for k in ("inputs_s", "launch_s", "gpu_s") if clock[k] is not None}
        retries = peer["alloc_retries"]
        return {
            "devices": [str(d) for d in self.split.devices],
            "peer_max_allocated_gib": None if peak is None else round(peak / GiB, 2),
            "peer_forward_ms": {k: round(1000 * v / n, 2) for k, v in spans.items()} if n else None,
            "peer_alloc_retries": None if retries is None else retries - self.retries,
            "link_mb_per_chunk": per_chunk,
            "steady_link_mb": statistics.median(per_chunk[1:]) if len(per_chunk) > 1 else None,
        }


def describe(figures: dict) -> str:
    """`LinkMeter.figures` in one line for a bench's report; "" for a one-device rollout."""
    if "devices" not in figures:
        return ""
    forward = figures.get("peer_forward_ms") or {}
    return (
        f"two GPUs {figures['devices']}: rank 1 allocated {figures['peer_max_allocated_gib']} GiB, "
        f"{figures.get('peer_alloc_retries')} retries at the cap; link MB a chunk {figures['link_mb_per_chunk']} "
        f"(steady {figures['steady_link_mb']}); rank 1 a forward, ms: "
        + ", ".join(f"{k} {v}" for k, v in forward.items())
    )
