"""`--compute auto`: the card decides which compute path a pipeline runs, and says why.

fp8 where the GPU has FP8 tensor cores (compute capability 8.9+: RTX 40xx, L40, H100/H200), int8 where it
has INT8 but not FP8 tensor cores (8.0-8.8: RTX 30xx, A100, A-series), exact elsewhere (the CPU, older
GPUs). It asks the device, not the installed packages, so nothing Hopper-only (cuDNN's FP8 attention,
FlashAttention 4) is reached on an sm_8x card: those kernels are chosen later, by the same capability.
"""

from __future__ import annotations

import torch

from worldgen.errors import InputError
from worldgen.kernels import fp8, int8


def auto_choice(capability: tuple[int, int], scaled_mm: bool = True) -> str:
    """The path `--compute auto` takes on a card of this compute capability (the decision alone, no GPU asked):
    fp8 from 8.9 (where this PyTorch has `torch._scaled_mm`), int8 from 8.0, else exact; what
    `fp8.unsupported_reason` and `int8.unsupported_reason` allow."""
    if tuple(capability) >= fp8.MIN_CAPABILITY and scaled_mm:
        return "fp8"
    if tuple(capability) >= int8.MIN_CAPABILITY:
        return "int8"
    return "exact"


def auto_compute(device: torch.device | str) -> tuple[str, str]:
    """(the compute path for `device`, one sentence saying why)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "exact", f"compute auto: {device.type} has no 8-bit tensor cores, the exact path runs"
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    choice = auto_choice((major, minor), hasattr(torch, "_scaled_mm"))
    if choice == "fp8":
        return "fp8", f"compute auto: {name} (compute capability {major}.{minor}) has FP8 tensor cores"
    if choice == "int8":
        return "int8", f"compute auto: {name} (compute capability {major}.{minor}) has INT8 but no FP8 tensor cores"
    return "exact", f"compute auto: {name} (compute capability {major}.{minor}) has no 8-bit tensor cores we use"


def check_supported(compute: str, device: torch.device | str) -> None:
    """Refuse a compute path `device` cannot run, in one sentence with what to use instead."""
    reason = (
        fp8.unsupported_reason(device)
        if compute == "fp8"
        else int8.unsupported_reason(device)
        if compute == "int8"
        else None
    )
    if reason:
        raise InputError(reason)
