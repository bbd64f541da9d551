"""What the process's resident set holds at its peak: anonymous, file-backed and shared (pinned) memory, and when.

`VmHWM` (worldgen.runtime.metering.peak_rss_gib) gives the peak only. Where an RSS target is missed, the question is
what made the peak: a thread reads the process's status (`worldgen.runtime.metering.proc_status_kib`) every few
milliseconds (~20 us a read) and keeps the sample
where VmRSS was highest, split as the kernel splits it: RssAnon (the heaps, the libraries' data), RssFile (mapped
files: the libraries' code, a memory-mapped checkpoint's pages), RssShmem (CUDA's pinned host memory: cudaHostAlloc
maps it shared). `label` names the phase the caller is in (the load, a rollout), read at each sample. Linux only; it
reads no tensor and holds no reference to one.
"""

from __future__ import annotations

import threading
import time

from worldgen.runtime.metering import proc_status_kib

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def _status() -> dict[str, float]:
    """The FIELDS of the process status, in GiB."""
    return {field: kib / 2**20 for field, kib in proc_status_kib(*FIELDS).items()}


class RssSampler:
    """`with RssSampler() as s: ...; s.label = "rollout 1"`; afterwards `s.describe()` says the peak and its split."""

    def __init__(self, every_s: float = 0.005):
        self.every_s = every_s
        self.label = "start"
        self.peak: dict[str, float] = {}
        self.by_label: dict[str, dict[str, float]] = {}  # each label's own peak sample
        self.peak_label = ""
        self.peak_at_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            sample = _status()
            label = self.label
            if sample.get("VmRSS", 0.0) > self.peak.get("VmRSS", -1.0):
                self.peak, self.peak_label, self.peak_at_s = sample, label, time.perf_counter() - start
            if sample.get("VmRSS", 0.0) > self.by_label.get(label, {}).get("VmRSS", -1.0):
                self.by_label[label] = sample
            self._stop.wait(self.every_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def figures(self) -> dict[str, float | str]:
        return {
            **{k: round(v, 3) for k, v in self.peak.items()},
            "during": self.peak_label,
            "at_s": round(self.peak_at_s, 2),
            "by_label": {label: {k: round(v, 3) for k, v in sample.items()} for label, sample in self.by_label.items()},
        }

    def describe(self) -> str:
        lines = [f"sampled peak RSS {_split(self.peak)} during {self.peak_label} ({self.peak_at_s:.1f} s in)"]
        lines += [f"  {label}'s peak: {_split(sample)}" for label, sample in self.by_label.items()]
        return "\n".join(lines)


def _split(sample: dict[str, float]) -> str:
    return (
        f"{sample.get('VmRSS', 0.0):.2f} GiB (anonymous {sample.get('RssAnon', 0.0):.2f}, file-backed "
        f"{sample.get('RssFile', 0.0):.2f}, shared/pinned {sample.get('RssShmem', 0.0):.2f})"
    )
