"""What a run cost: this process's peak RSS (Linux /proc) and the GPU's peak VRAM, phase by phase.

`PhaseMeter` measures; it decides nothing (the plan is `worldgen.runtime.memory`, the loading and freeing
`worldgen.runtime.residency`). Printed at the end of every run and recorded by the benchmarks. The one
reader of this process's /proc figures (the worker's health answers use `rss_gib`/`peak_rss_gib`);
torch is imported only where a GPU is measured, so the worker's protocol side stays light. `ForwardClock`: a
two-GPU job's rank 1's seconds a forward (`worldgen.pipelines.two_gpu`), for the benchmarks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

GiB = 2**30


def proc_status_kib(*fields: str) -> dict[str, int]:
    """The named kB fields of /proc/self/status (VmRSS, RssAnon, RssFile, RssShmem, ...): those present (none off
    Linux)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    found = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE)}
    return {field: found[field] for field in fields if field in found}


def _proc_status_kib(field: str) -> int | None:
    return proc_status_kib(field).get(field)


def rss_gib() -> float | None:
    """This process's resident set (VmRSS) now, or None off Linux."""
    kib = _proc_status_kib("VmRSS")
    return None if kib is None else kib / 2**20


def peak_rss_gib() -> float | None:
    """This process's peak resident set (VmHWM) so far, or None off Linux."""
    kib = _proc_status_kib("VmHWM")
    return None if kib is None else kib / 2**20


def _reset_peak_rss() -> bool:
    try:  # Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) of this process
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclasses.dataclass
class PhaseRecord:
    name: str
    seconds: float
    peak_rss_gib: float | None
    peak_vram_gib: float | None


class PhaseMeter:
    """Peak RSS and VRAM per phase (`with meter.phase("denoise"): ...`)."""

    def __init__(self, device: torch.device):
        import torch

        self.device = torch.device(device)
        self.records: list[PhaseRecord] = []
        self.rss_split: dict[str, tuple[float, float]] = {}  # phase -> (anonymous, file-backed) GiB at its end

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import torch

        can_reset = _reset_peak_rss()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(name):  # the phase's name on a profile's ops (bench/kernel_profile.py)
                yield
        finally:
            vram = None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                vram = torch.cuda.max_memory_reserved(self.device) / GiB
            hwm = _proc_status_kib("VmHWM" if can_reset else "VmRSS")
            rss = None if hwm is None else hwm / 2**20
            anon, file = _proc_status_kib("RssAnon"), _proc_status_kib("RssFile")
            if anon is not None and file is not None:
                self.rss_split[name] = (anon / 2**20, file / 2**20)
            self.records.append(PhaseRecord(name, time.perf_counter() - start, rss, vram))

    def summary(self) -> str:
        lines = ["measured per phase:  seconds   peak RSS   peak VRAM (reserved)"]
        for r in self.records:
            rss = "-" if r.peak_rss_gib is None else f"{r.peak_rss_gib:6.2f} GiB"
            vram = "-" if r.peak_vram_gib is None else f"{r.peak_vram_gib:6.2f} GiB"
            lines.append(f"  {r.name:<8} {r.seconds:9.1f}   {rss:>10}   {vram:>10}")
        return "\n".join(lines)

    def as_dict(self) -> list[dict]:
        return [dataclasses.asdict(r) for r in self.records]


class LapClock:
    """Seconds per part of one run (`seconds`): `lap(name)` adds the time since the last lap to `name`,
    `mark(name)` records the time since the start (a Fast rollout's text, encode, dit, decode,
    first_chunk, total). On CUDA the current stream is synchronised at each lap, so GPU work is counted
    where it happens (a few syncs per chunk); a second stream's work goes on."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start = self.last = self._now()
        self.seconds: dict[str, float] = {}

    def _now(self) -> float:
        if self.device.type == "cuda":  # the loop's stream only: a decode on the second one goes on
            import torch

            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def mark(self, name: str) -> None:
        self.seconds[name] = self._now() - self.start

    def around(self, fn: Callable, name: str, before: str) -> Callable:
        """`fn` with the time up to each call lapped as `before` and the call's own as `name` (a live job's
        waits for its poses: not the DiT's time)."""

        def call(*args, **kwargs):
            self.lap(before)
            try:
                return fn(*args, **kwargs)
            finally:
                self.lap(name)

        return call


class ForwardClock:
    """Rank 1's seconds over its forwards, for the benchmarks (where a split forward waits, issue 55): `inputs_s` from
    a header's arrival to its inputs' broadcasts queued (waited for only on the CPU's gloo), `launch_s` from then until
    `forward_tokens` returned (the host launching the forward), `gpu_s` between CUDA events around that (None on the
    CPU). Finished events are folded into the sum as forwards go, so a long-lived worker holds only pending ones."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.reset()

    def reset(self) -> None:
        self.forwards, self.inputs_s, self.launch_s = 0, 0.0, 0.0
        self.gpu_s: float | None = 0.0 if self.cuda else None
        self.pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def event(self) -> torch.cuda.Event | None:
        if not self.cuda:
            return None
        import torch  # this module is imported before torch is needed (`peak_rss_gib`)

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, arrived: float, received: float, began: torch.cuda.Event | None) -> None:
        self.forwards += 1
        self.inputs_s += received - arrived
        self.launch_s += time.perf_counter() - received
        if began is not None:
            self.pending.append((began, self.event()))
            self._fold(wait=False)

    def _fold(self, wait: bool) -> None:
        while self.pending and (wait or self.pending[0][1].query()):
            began, ended = self.pending.pop(0)
            ended.synchronize()
            self.gpu_s += began.elapsed_time(ended) / 1000

    def figures(self) -> dict[str, Any]:
        self._fold(wait=True)
        return {"forwards": self.forwards, "inputs_s": self.inputs_s, "launch_s": self.launch_s, "gpu_s": self.gpu_s}
