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

    def __init__(
        self,
        name: str,
        load: Callable[[], nn.Module],
        resident: bool = True,
        prefetch: Callable[[], object] | None = None,
    ):
        self.name = name
        self._load = load
        self._prefetch = prefetch
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

    def prefetch(self) -> None:
        """Start reading the model's files into the page cache (no-op when loaded or not supported)."""
        if self.module is None and self._prefetch is not None:
            self._prefetch()

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
    stream_text_encoder: bool = False  # T5 blocks pass through the device one at a time
    experts_beside_vae: bool = True  # False: experts are freed before the VAE runs (reloaded next job)
    vae_tile_pixels: int | None = None  # VAE encodes/decodes spatial tiles of at most this area; None: whole frames
    text_encoder_device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    usable_gib: float | None = None  # the VRAM budget less the CUDA context; None: no budget
    expert_gib: float = 0.0
    job: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.text_encoder_device.type == "cpu" and self.device.type != "cpu" and not self.stream_text_encoder:
            self.text_encoder_device = self.device

    @classmethod
    def unlimited(cls, device: torch.device | str) -> MemoryPlan:
        device = torch.device(device)
        return cls(device, text_encoder_device=device, notes=("no budget: every model stays resident once loaded",))

    def fit(self, tokens: int, pixels: int) -> bool:
        """Re-decide the job-size dependent choices for a job of `tokens` DiT tokens and `pixels` per
        frame; returns True when anything changed. Without a budget nothing changes.

        Raises `InputError` when even one expert plus this job's activations exceed the budget.
        """
        from worldgen.errors import InputError

        self.job = f"{tokens:,} tokens, {pixels:,} pixels per frame"
        if self.usable_gib is None:
            return False
        before = dataclasses.astuple(self)
        usable, expert = self.usable_gib, self.expert_gib
        act = activation_gib(tokens)
        if expert + act > usable:
            raise InputError(
                f"this job ({tokens:,} DiT tokens, ~{act:.1f} GiB of activations) and one expert ({expert:.1f} GiB) "
                f"do not fit --vram-budget {self.vram_budget_gb:g}: lower --size or --frame-num, or raise the budget"
            )
        self.keep_both_experts = 2 * expert + act <= usable
        resident = (2 if self.keep_both_experts else 1) * expert
        self.batch_guidance = resident + 2 * act <= usable
        self.ffn_chunk_tokens = None if usable - resident > 3 * act else 8192
        self.keep_vae = usable - resident > act + VAE_WEIGHTS_GIB
        self.experts_beside_vae = usable - resident > vae_peak_gib(pixels)
        room = usable - (resident if self.experts_beside_vae else 0.0)
        self.vae_tile_pixels = None if vae_peak_gib(pixels) <= room else vae_tile_pixels(room)
        return dataclasses.astuple(self) != before

    def before_expert(self, which: str, experts: dict[str, ModelSlot]) -> None:
        """Free the other expert first when both do not fit (never two experts in memory at once)."""
        if not self.keep_both_experts:
            for name, slot in experts.items():
                if name != which and slot.loaded:
                    slot.unload()

    def describe(self) -> str:
        budget = "none" if self.vram_budget_gb is None else f"{self.vram_budget_gb:g} GiB"
        ram = "none" if self.ram_budget_gb is None else f"{self.ram_budget_gb:g} GiB"
        if self.stream_text_encoder:
            t5 = "streamed block by block"
        else:
            t5 = "kept resident" if self.keep_text_encoder else "loaded, then freed"
        vae = "kept resident" if self.keep_vae else "loaded, then freed"
        tiles = (
            "whole frames"
            if self.vae_tile_pixels is None
            else f"spatial tiles of <= {self.vae_tile_pixels:,} pixels, blended at the seams"
        )
        beside = "" if self.experts_beside_vae or self.usable_gib is None else " (experts freed first)"
        lines = [
            f"memory plan on {self.device} (VRAM budget {budget}, RAM budget {ram})"
            + (f" for {self.job}" if self.job else "")
            + ":",
            f"  text    umT5 on {self.text_encoder_device}, {t5} (skipped on a prompt-cache hit)",
            f"  encode  VAE {vae}, {tiles}{beside}",
            f"  denoise experts: {'both resident' if self.keep_both_experts else 'one at a time, swapped at the boundary'}; "
            f"guidance passes {'batched' if self.batch_guidance else 'sequential'}; "
            f"feed-forward {f'in chunks of {self.ffn_chunk_tokens} tokens' if self.ffn_chunk_tokens else 'whole'}",
            f"  decode  VAE {vae}, {tiles}{beside}",
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


# Memory estimates, measured on the H100 at 480p (464x832 frames, 81 frames, 32,760 DiT tokens; see
# docs/benchmarks.md) and scaled linearly: SDPA attention and chunked feed-forward are linear in tokens,
# the chunked VAE is linear in the pixels of a frame.
REFERENCE_TOKENS = 32_760
REFERENCE_PIXELS = 464 * 832
ACTIVATION_GIB = 5.0  # one guidance pass at REFERENCE_TOKENS, feed-forward chunked
VAE_WEIGHTS_GIB = 0.5
VAE_PEAK_GIB = 10.5  # peak of the VAE (decode, the larger of encode/decode) at REFERENCE_PIXELS, weights included
VAE_MARGIN = 0.85  # tiles are sized to this share of the room left: the estimate is linear, memory is lumpier
MIN_TILE_PIXELS = 128 * 128
CUDA_CONTEXT_GIB = 0.6


def activation_gib(tokens: int) -> float:
    return ACTIVATION_GIB * tokens / REFERENCE_TOKENS


def vae_peak_gib(pixels: int) -> float:
    return VAE_WEIGHTS_GIB + (VAE_PEAK_GIB - VAE_WEIGHTS_GIB) * pixels / REFERENCE_PIXELS


def vae_tile_pixels(room_gib: float) -> int:
    """The largest tile area whose VAE peak fits `room_gib`, with margin."""
    per_pixel = (VAE_PEAK_GIB - VAE_WEIGHTS_GIB) / REFERENCE_PIXELS
    return max(MIN_TILE_PIXELS, int((room_gib * VAE_MARGIN - VAE_WEIGHTS_GIB) / per_pixel))


def folder_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / GiB


def plan_for(
    layout,
    device: torch.device,
    dtype: torch.dtype,
    vram_budget_gb: float | None,
    ram_budget_gb: float | None,
    text_encoder_on_cpu: bool = False,
) -> MemoryPlan:
    """Decide residency from the budget and the checkpoint's sizes; enforce the VRAM budget.

    `text_encoder_on_cpu` runs umT5 on the CPU, streamed from its memory-mapped file one block at a
    time (slow, but no GPU memory and about one block of RAM). Raises `worldgen.errors.InputError`
    when one expert cannot fit at all, naming the fix.
    """
    plan = _plan_for_budget(layout, device, vram_budget_gb, ram_budget_gb)
    if text_encoder_on_cpu:
        plan.text_encoder_device = torch.device("cpu")
        plan.stream_text_encoder, plan.keep_text_encoder = True, False
    return plan


def _plan_for_budget(
    layout, device: torch.device, vram_budget_gb: float | None, ram_budget_gb: float | None
) -> MemoryPlan:
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
    plan = MemoryPlan(
        device=device,
        vram_budget_gb=vram_budget_gb,
        ram_budget_gb=ram_budget_gb,
        keep_text_encoder=False,
        stream_text_encoder=True,
        text_encoder_device=device,
        usable_gib=usable,
        expert_gib=expert,
        notes=tuple(notes),
    )
    plan.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)  # the default 480p job; each job re-fits the plan to its size
    return plan
