"""The CUDA allocator's side of the memory budget: the per-process cap, the GPU's size, freeing cached blocks.

The planner (`worldgen.memory`) only decides; `apply_memory_cap` is the one place that tells the
allocator, called once by whoever starts the engine (`worldgen.pipeline.load_pipeline`).
"""

from __future__ import annotations

import gc

import torch

from worldgen.memory import GiB, MemoryPlan


def gpu_total_gib(device: torch.device | str) -> float | None:
    """The GPU's memory in GiB; None for a non-CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / GiB


def apply_memory_cap(plan: MemoryPlan) -> None:
    """Enforce the plan's VRAM budget through the CUDA allocator's per-process fraction, so a 24 GB
    card is emulated on a larger GPU and a GPU shared with Isaac Sim is respected. No budget: no-op."""
    if plan.vram_budget_gb is None or plan.device.type != "cuda":
        return
    total = gpu_total_gib(plan.device)
    # the allocator wants an index: plain "cuda" means the current device
    index = plan.device.index if plan.device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(min(1.0, plan.vram_budget_gb / total), index)


def free_device_memory(device: torch.device) -> None:
    """Collect dropped tensors and hand the allocator's cached blocks back (CUDA), so the next model fits."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
