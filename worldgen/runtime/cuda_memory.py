"""The CUDA allocator's side of the memory budget: the per-process cap, the GPU's size, freeing cached blocks.

The planner (`worldgen.runtime.memory`) only decides; `apply_memory_cap` is the one place that tells the
allocator, called once by whoever starts the engine (`worldgen.pipelines.loader.load_pipeline`).
"""

from __future__ import annotations

import gc
import os

import torch

from worldgen.runtime.memory import GiB, MemoryPlan


def gpu_total_gib(device: torch.device | str) -> float | None:
    """The GPU's memory in GiB; None for a non-CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / GiB


def apply_memory_cap(plan: MemoryPlan) -> None:
    """Enforce the plan's VRAM budget through the CUDA allocator's per-process fraction, so a 24 GB
    card is emulated on a larger GPU and a GPU shared with Isaac Sim is respected. No budget: no-op.

    The cap is the budget less the CUDA context (`MemoryPlan.usable_gib`): the context lives outside
    the allocator, so capping the allocator at the whole budget let this process hold ~0.5 GiB more
    than a card of that size has (reserved 23.3-23.99 GiB under --vram-budget 24 on an H100)."""
    if plan.vram_budget_gb is None or plan.device.type != "cuda":
        return
    if use_expandable_segments():  # set by the loader already; said in the plan here
        plan.notes += ("CUDA allocator: expandable segments (less fragmentation under the budget)",)
    total = gpu_total_gib(plan.device)
    # the allocator wants an index: plain "cuda" means the current device
    index = plan.device.index if plan.device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(min(1.0, plan.usable_gib / total), index)


ALLOCATOR_SETTINGS = "expandable_segments:True"


def use_expandable_segments() -> bool:
    """Let the CUDA caching allocator grow one mapping instead of adding fixed segments, so memory the
    DiT frees between forwards is reusable by the VAE and back. Without it a Fast rollout under
    --vram-budget 24 lost ~1.1 GiB to fragmentation (23.8 GiB reserved for 22.7 GiB allocated) and
    the chunk decode beside the KV cache ran out of memory.

    Through PyTorch's runtime setter, not the environment: the variable is read once, when the allocator's
    settings are first parsed, so setting it from Python after anything touched CUDA (a bench asking the
    GPU's name before it loads) did nothing. A 24 GiB Fast fp8 job then ran out of memory with 2.67 GiB reserved
    but unallocated (docs/benchmarks.md, "Session 36"). A user's own PYTORCH_CUDA_ALLOC_CONF (or
    PYTORCH_ALLOC_CONF) wins; returns whether the setting was applied."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        return False
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    setter = setter or getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is None:
        return False
    setter(ALLOCATOR_SETTINGS)
    return True


def free_device_memory(device: torch.device, collect_cycles: bool = False) -> None:
    """Hand the allocator's cached blocks back (CUDA), so the next model fits; with `collect_cycles`, first
    run Python's cycle collector for tensors only a reference cycle still holds.

    Dropped models, caches and activations are freed by reference counting; the collector is for the
    retries after running out of memory, where a stray cycle could be the difference. At every phase
    boundary it cost a Fast rollout 0.3 s: ~190 ms a call in a loaded process (~345k objects), three
    calls a rollout on its critical path, with the same peak memory without it (docs/benchmarks.md,
    "Session 18: Fast")."""
    if collect_cycles:
        gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def release_pinned_cache() -> float | None:
    """Hand PyTorch's cached pinned host blocks that nothing uses back to the system; -> the GiB released (None
    without CUDA). Its caching host allocator keeps every pinned block it ever freed, for reuse at the same size,
    and frees none on its own: a 1.3B job under `--vram-budget 8` held the load's 128 MiB staging buffers and umT5's
    through every chunk (2.24 GiB pinned, 1.88 of it the decoder's parked tiles; docs/benchmarks.md, "Session 40"),
    against an RSS target of 4 GiB beside Isaac Sim. Blocks in use stay; so do none of the freed ones, so call it
    where what is cached will not be asked for again at its size (`worldgen.pipelines.loader`, `first_use_ahead`)."""
    if not torch.cuda.is_available():
        return None
    held = torch.cuda.memory.host_memory_stats().get("allocated_bytes.current")  # in use and cached
    empty = getattr(getattr(torch, "accelerator", None), "memory", None)
    if empty is not None and hasattr(empty, "empty_host_cache"):
        empty.empty_host_cache()
    else:  # PyTorch before torch.accelerator.memory.empty_host_cache
        torch._C._host_emptyCache()
    after = torch.cuda.memory.host_memory_stats().get("allocated_bytes.current")
    return None if held is None or after is None else round((held - after) / 2**30, 3)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor.cpu()`, through pinned memory on CUDA: a pageable copy runs at a few GB/s while the GPU
    waits (a decoded 12-frame 464x832 chunk, 55 MB: 36 ms of an H100's time, 0.26 s an 81-frame Fast
    rollout; docs/benchmarks.md, "Session 17: Fast"); a copy to page-locked memory runs at the link's speed.
    The pinned block comes from PyTorch's caching host allocator (reused once the tensor is freed), and the
    copy is waited for, so the result is ready like `.cpu()`'s."""
    if tensor.device.type != "cuda":
        return tensor.cpu()
    host = tensor.to("cpu", non_blocking=True)  # into a pinned block
    torch.cuda.current_stream(tensor.device).synchronize()
    return host


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor.to(device)` from the host through pinned memory, not waited for: a pageable copy first waits for the
    device's queue to drain, so the GPU stood idle while the host then launched the next work (the Fast loop's
    chunk of noise and its 37 MB Plücker camera, made on the host, each chunk: docs/benchmarks.md, "Session 37").
    PyTorch's caching host allocator keeps the pinned block until the copy is done."""
    if tensor.device.type != "cpu" or torch.device(device).type != "cuda":
        return tensor.to(device)
    # contiguous first: a strided view (a chunk of the noise) would pin the whole span its strides reach
    return tensor.contiguous().pin_memory().to(device, non_blocking=True)
