"""The memory plan: where each model lives during each phase, under the user's VRAM and RAM budgets.

Pure: `plan_memory` turns the budgets and the model sizes into a `MemoryPlan` and `MemoryPlan.fit`
re-decides the job-size dependent choices; neither touches CUDA, the disk or a model. Applying the
plan is elsewhere and explicit: `worldgen.runtime.cuda_memory.apply_memory_cap` sets the allocator's cap,
`worldgen.runtime.residency.ResidencyPolicy` loads, keeps, prefetches and frees models as the plan says,
`worldgen.runtime.metering` measures what it cost.
"""

from __future__ import annotations

import dataclasses

import torch

from worldgen.errors import InputError
from worldgen.models.camera_cache import cache_gib

GiB = 2**30


REFERENCE_WIDTH = 5120  # the 14B DiT's dim, at which ACTIVATION_GIB (below) was measured


@dataclasses.dataclass
class MemoryPlan:
    """Per-phase decisions: which models stay resident, whether both experts fit, whether the two
    guidance passes are batched, feed-forward chunking, VAE tiling; printable for the user."""

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
    camera_cache: bool = False  # each block's camera modulation kept across steps (worldgen.models.camera_cache)
    card_gib: float | None = None  # no budget: the GPU's own memory, for the one choice that needs room
    text_encoder_gib: float = 0.0  # umT5's size, resident beside the experts when there is no budget
    text_encoder_device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    usable_gib: float | None = None  # the VRAM budget less the CUDA context; None: no budget
    expert_gib: float = 0.0
    checkpoint_kind: str = ""  # the experts' format on disk: "bf16" (dense) or "nf4"
    width: int = REFERENCE_WIDTH  # the DiT's dim: its activations scale with it (`activation_gib`)
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
        self.job = f"{tokens:,} tokens, {pixels:,} pixels per frame"
        if self.usable_gib is None:
            if self.card_gib is None:
                return False
            # no budget: every model stays resident (umT5 too); the camera cache takes what is left
            before = self.camera_cache
            resident = 2 * self.expert_gib + self.text_encoder_gib + VAE_WEIGHTS_GIB
            room = self.card_gib - CUDA_CONTEXT_GIB - resident - activation_gib(tokens, self.width)
            self.camera_cache = camera_cache_gib(tokens) <= room
            return self.camera_cache != before
        before = dataclasses.astuple(self)
        usable, expert = self.usable_gib, self.expert_gib
        act = activation_gib(tokens, self.width)
        if expert + act > usable:
            raise InputError(
                f"this job ({tokens:,} DiT tokens, ~{act:.1f} GiB of activations) and one expert ({expert:.1f} GiB) "
                f"do not fit --vram-budget {self.vram_budget_gb:g}: lower --size or --frame-num, or raise the budget"
            )
        self.keep_both_experts = 2 * expert + act <= usable
        resident = (2 if self.keep_both_experts else 1) * expert
        # the camera cache saves ~14% of every forward after the first: it comes before batched guidance
        self.camera_cache = resident + act + camera_cache_gib(tokens) <= usable
        # the denoising choices are made in the room the cache leaves; the VAE's after it is freed
        denoise_room = usable - (camera_cache_gib(tokens) if self.camera_cache else 0.0)
        self.batch_guidance = resident + 2 * act <= denoise_room
        self.ffn_chunk_tokens = None if denoise_room - resident > 3 * act else 8192
        self.keep_vae = denoise_room - resident > act + VAE_WEIGHTS_GIB
        self.experts_beside_vae = usable - resident > vae_peak_gib(pixels)
        room = usable - (resident if self.experts_beside_vae else 0.0)
        self.vae_tile_pixels = None if vae_peak_gib(pixels) <= room else vae_tile_pixels(room)
        return dataclasses.astuple(self) != before

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
            f"feed-forward {f'in chunks of {self.ffn_chunk_tokens} tokens' if self.ffn_chunk_tokens else 'whole'}"
            + ("; camera modulation computed once per expert and kept across steps" if self.camera_cache else ""),
            f"  decode  VAE {vae}, {tiles}{beside}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


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


def camera_cache_gib(tokens: int) -> float:
    """The camera cache of one A14B expert for a job of `tokens`, with 10% for the allocator's rounding."""
    return 1.1 * cache_gib(tokens)


def activation_gib(tokens: int, width: int = REFERENCE_WIDTH) -> float:
    """A forward's activations: measured for the 14B DiT, scaled by tokens and by the DiT's width (a
    narrower one, LingBot-World 2.0's 1.3B at dim 1536, holds proportionally less; an estimate)."""
    return ACTIVATION_GIB * tokens / REFERENCE_TOKENS * width / REFERENCE_WIDTH


def vae_peak_gib(pixels: int, element_size: int = 4) -> float:
    """The VAE's peak for frames of `pixels`, weights included: the float32 figures, scaled for a VAE whose elements
    take `element_size` bytes (a bf16 VAE's weights and activations are half a float32 one's)."""
    scale = element_size / 4
    return scale * (VAE_WEIGHTS_GIB + (VAE_PEAK_GIB - VAE_WEIGHTS_GIB) * pixels / REFERENCE_PIXELS)


def vae_tile_pixels(room_gib: float, element_size: int = 4) -> int:
    """The largest tile area whose VAE peak (`vae_peak_gib`) fits `room_gib`, with margin."""
    scale = element_size / 4
    per_pixel = scale * (VAE_PEAK_GIB - VAE_WEIGHTS_GIB) / REFERENCE_PIXELS
    return max(MIN_TILE_PIXELS, int((room_gib * VAE_MARGIN - scale * VAE_WEIGHTS_GIB) / per_pixel))


def plan_memory(
    device: torch.device | str,
    vram_budget_gb: float | None,
    ram_budget_gb: float | None = None,
    *,
    expert_gib: float = 0.0,
    checkpoint_kind: str = "",
    gpu_total_gib: float | None = None,
    text_encoder_on_cpu: bool = False,
    text_encoder_gib: float = 0.0,
    width: int = REFERENCE_WIDTH,
) -> MemoryPlan:
    """Decide residency from the budgets and the model sizes, for the default 480p job.

    `expert_gib` is one expert's size on disk (`checkpoint_kind` names its format in messages);
    `gpu_total_gib` the GPU's memory, to refuse a budget larger than the card. Without a VRAM budget
    or off CUDA every model stays resident. `text_encoder_on_cpu` runs umT5 on the CPU, streamed
    from its memory-mapped file one block at a time (slow, but no GPU memory and about one block of
    RAM). Raises `worldgen.errors.InputError` when one expert cannot fit at all, naming the fix.
    Without a budget, `gpu_total_gib` and `text_encoder_gib` (umT5's size) decide only the camera
    cache (`worldgen.models.camera_cache`): on when it fits beside every resident model.
    """
    device = torch.device(device)
    if device.type != "cuda" or vram_budget_gb is None:
        plan = MemoryPlan.unlimited(device)
        plan.ram_budget_gb, plan.checkpoint_kind = ram_budget_gb, checkpoint_kind
        if device.type == "cuda" and gpu_total_gib is not None:
            plan.card_gib, plan.expert_gib, plan.width = gpu_total_gib, expert_gib, width
            plan.text_encoder_gib = 0.0 if text_encoder_on_cpu else text_encoder_gib
            plan.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)
    else:
        if gpu_total_gib is not None and vram_budget_gb > gpu_total_gib:
            raise InputError(
                f"--vram-budget {vram_budget_gb:g} GiB is more than this GPU has ({gpu_total_gib:.1f} GiB)"
            )
        usable = vram_budget_gb - CUDA_CONTEXT_GIB
        if expert_gib + activation_gib(REFERENCE_TOKENS, width) > usable:
            raise InputError(
                f"one {checkpoint_kind} expert ({expert_gib:.1f} GiB) plus activations does not fit --vram-budget "
                f"{vram_budget_gb:g}; convert the checkpoint with `lingbot-isaac quantize` (NF4: ~9 GiB per expert) "
                "or raise the budget"
            )
        notes = (
            f"one expert is {expert_gib:.1f} GiB ({checkpoint_kind}); "
            f"activations ~{activation_gib(REFERENCE_TOKENS, width):.1f} GiB per pass at 480p",
        )
        plan = MemoryPlan(
            device=device,
            vram_budget_gb=vram_budget_gb,
            ram_budget_gb=ram_budget_gb,
            keep_text_encoder=False,
            stream_text_encoder=True,
            text_encoder_device=device,
            usable_gib=usable,
            expert_gib=expert_gib,
            checkpoint_kind=checkpoint_kind,
            width=width,
            notes=notes,
        )
        plan.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)  # the default 480p job; each job re-fits the plan to its size
    if text_encoder_on_cpu:
        plan.text_encoder_device = torch.device("cpu")
        plan.stream_text_encoder, plan.keep_text_encoder = True, False
    return plan
