"""Where each model lives during each phase, under the user's VRAM and RAM budgets, and what it cost.

- `ModelSlot`: a model that is loaded on first use and either kept (resident) or freed after its
  phase.
- `MemoryPlan`: the per-phase decisions (which slots stay resident, whether both experts fit,
  whether the two guidance passes are batched, feed-forward chunking), derived from the budgets
  and the model sizes, printable for the user. `--vram-budget` is enforced through the CUDA
  allocator's per-process fraction, so a 24 GB card is emulated on a larger GPU and a GPU shared
  with Isaac Sim is respected.
- `PhaseMeter`: measured peak RSS and VRAM per phase, printed at the end of every run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

GiB = 2**30


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class ModelSlot:
    """A model loaded on first `get()`; `release()` frees it unless it is resident."""

    def __init__(self, name: str, load: Callable[[], nn.Module], resident: bool = True):
        self.name = name
        self._load = load
        self.resident = resident
        self.module: nn.Module | None = None
        self.loads = 0
        self.load_seconds = 0.0

    def get(self) -> nn.Module:
        if self.module is None:
            start = time.perf_counter()
            self.module = self._load()
            self.load_seconds += time.perf_counter() - start
            self.loads += 1
        return self.module

    def release(self) -> None:
        if not self.resident:
            self.unload()

    def unload(self) -> None:
        if self.module is not None:
            device = next(self.module.parameters()).device
            self.module = None
            free_device_memory(device)

    @property
    def loaded(self) -> bool:
        return self.module is not None


@dataclasses.dataclass
class MemoryPlan:
    device: torch.device
    vram_budget_gb: float | None = None
    ram_budget_gb: float | None = None
    keep_text_encoder: bool = True
    keep_vae: bool = True
    keep_both_experts: bool = True
    batch_guidance: bool = False
    ffn_chunk_tokens: int | None = None
    stream_text_encoder: bool = False  # T5 blocks pass through the GPU one at a time
    experts_beside_vae: bool = True  # False: experts are freed before the VAE decodes (reloaded next job)
    text_encoder_device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.text_encoder_device.type == "cpu" and self.device.type != "cpu" and not self.stream_text_encoder:
            self.text_encoder_device = self.device

    @classmethod
    def unlimited(cls, device: torch.device | str) -> MemoryPlan:
        device = torch.device(device)
        return cls(device, text_encoder_device=device, notes=("no budget: every model stays resident once loaded",))

    def before_expert(self, which: str, experts: dict[str, ModelSlot]) -> None:
        """Free the other expert first when both do not fit (never two experts in memory at once)."""
        if not self.keep_both_experts:
            for name, slot in experts.items():
                if name != which and slot.loaded:
                    slot.unload()

    def describe(self) -> str:
        budget = "none" if self.vram_budget_gb is None else f"{self.vram_budget_gb:g} GiB"
        ram = "none" if self.ram_budget_gb is None else f"{self.ram_budget_gb:g} GiB"
        lines = [
            f"memory plan on {self.device} (VRAM budget {budget}, RAM budget {ram}):",
            f"  text    umT5 on {self.text_encoder_device}, "
            f"{'streamed block by block' if self.stream_text_encoder else 'kept resident' if self.keep_text_encoder else 'loaded, then freed'}"
            " (skipped on a prompt-cache hit)",
            f"  encode  VAE {'kept resident' if self.keep_vae else 'loaded, then freed'}",
            f"  denoise experts: {'both resident' if self.keep_both_experts else 'one at a time, swapped at the boundary'}; "
            f"guidance passes {'batched' if self.batch_guidance else 'sequential'}; "
            f"feed-forward {f'in chunks of {self.ffn_chunk_tokens} tokens' if self.ffn_chunk_tokens else 'whole'}",
            f"  decode  VAE {'kept resident' if self.keep_vae else 'loaded, then freed'}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _proc_status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


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
        self.device = torch.device(device)
        self.records: list[PhaseRecord] = []
        self.rss_split: dict[str, tuple[float, float]] = {}  # phase -> (anonymous, file-backed) GiB at its end

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        can_reset = _reset_peak_rss()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
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


# Activation estimates at 480x832, 81 frames (32,760 tokens), measured with bench/bench_runtime.py
ACTIVATION_GIB = 5.0  # one guidance pass, feed-forward chunked
VAE_GIB = 3.0  # VAE weights (0.5) plus its chunked encode activations at 480p
VAE_DECODE_GIB = 10.5  # measured peak of the VAE decode at 480x832x81 (bench_rollout, H100)
CUDA_CONTEXT_GIB = 0.6


def folder_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / GiB


def plan_for(
    layout, device: torch.device, dtype: torch.dtype, vram_budget_gb: float | None, ram_budget_gb: float | None
) -> MemoryPlan:
    """Decide residency from the budget and the checkpoint's sizes; enforce the VRAM budget.

    Raises `worldgen.errors.InputError` when one expert cannot fit at all, naming the fix.
    """
    from worldgen.errors import InputError

    device = torch.device(device)
    if device.type != "cuda" or vram_budget_gb is None:
        plan = MemoryPlan.unlimited(device)
        plan.ram_budget_gb = ram_budget_gb
        return plan
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    total_gib = torch.cuda.get_device_properties(device).total_memory / GiB
    if vram_budget_gb > total_gib:
        raise InputError(f"--vram-budget {vram_budget_gb:g} GiB is more than this GPU has ({total_gib:.1f} GiB)")
    torch.cuda.set_per_process_memory_fraction(vram_budget_gb / total_gib, device)
    expert = folder_gib(next(iter(layout.experts.values())))
    usable = vram_budget_gb - CUDA_CONTEXT_GIB
    notes = [f"one expert is {expert:.1f} GiB ({layout.kind}); activations ~{ACTIVATION_GIB:g} GiB per pass at 480p"]
    if expert + ACTIVATION_GIB > usable:
        raise InputError(
            f"one {layout.kind} expert ({expert:.1f} GiB) plus activations does not fit --vram-budget "
            f"{vram_budget_gb:g}; convert the checkpoint with `lingbot-isaac quantize` (NF4: ~9 GiB per expert) "
            "or raise the budget"
        )
    keep_both = 2 * expert + ACTIVATION_GIB <= usable
    batch = (2 if keep_both else 1) * expert + 2 * ACTIVATION_GIB <= usable
    chunk = None if usable - (2 if keep_both else 1) * expert > 3 * ACTIVATION_GIB else 8192
    if not keep_both:
        notes.append("both experts do not fit: the low-noise expert replaces the high-noise one at the boundary")
    return MemoryPlan(
        device=device,
        vram_budget_gb=vram_budget_gb,
        ram_budget_gb=ram_budget_gb,
        keep_text_encoder=False,
        keep_vae=usable - (2 if keep_both else 1) * expert > ACTIVATION_GIB + VAE_GIB,
        keep_both_experts=keep_both,
        experts_beside_vae=usable - (2 if keep_both else 1) * expert > VAE_DECODE_GIB,
        batch_guidance=batch,
        ffn_chunk_tokens=chunk,
        stream_text_encoder=True,
        text_encoder_device=device,
        notes=tuple(notes),
    )
