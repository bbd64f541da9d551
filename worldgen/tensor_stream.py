"""Stream tensors from checkpoint files to a device, one at a time, without RAM peaks.

safetensors files are read by hand (an 8-byte header length, a JSON header, raw data): each tensor
is `readinto` a reusable staging buffer (pinned when the target is CUDA) and copied to the device,
so resident memory stays at one staging buffer whatever the model size. Going through
`safetensors.safe_open` instead would map the whole file and leave every touched page resident.
Torch `.pth` state dicts are opened with `torch.load(weights_only=True, mmap=True)` (no arbitrary
unpickling, no full read) and copied tensor by tensor.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from worldgen.errors import CheckpointError

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors_header(path: Path) -> tuple[dict[str, dict], int]:
    """-> ({key: {dtype, shape, data_offsets}}, offset of the data section)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 2**20:
                raise ValueError(f"header length {n} is implausible")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc}); re-download it") from None
    header.pop("__metadata__", None)
    return header, 8 + n


class StagingBuffer:
    """A reusable host buffer; pinned for fast, asynchronous host-to-GPU copies."""

    def __init__(self, nbytes: int, pin: bool):
        self.pin = pin
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.pending: torch.cuda.Event | None = None

    def view(self, nbytes: int) -> torch.Tensor:
        if self.pending is not None:  # the previous async copy must finish before we overwrite
            self.pending.synchronize()
            self.pending = None
        if nbytes > self.buffer.numel():
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        return self.buffer[:nbytes]


def _to_device(host: torch.Tensor, device: torch.device, dtype: torch.dtype | None, staging: StagingBuffer | None):
    if device.type == "cuda":
        out = host.to(device, non_blocking=True)
        if staging is not None:
            staging.pending = torch.cuda.Event()
            staging.pending.record()
    else:
        out = host.clone()  # the staging buffer is reused: own the bytes
    return out if dtype is None or not out.dtype.is_floating_point else out.to(dtype)


def stream_safetensors(
    path: Path,
    keys: Iterable[str] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    staging: StagingBuffer | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (key, tensor on `device`) for `keys` (default: all) in file order.

    Floating tensors are cast to `dtype` on the device when given; integer ones never are.
    """
    device = torch.device(device)
    header, data_start = read_safetensors_header(path)
    wanted = header.keys() if keys is None else list(keys)
    missing = [k for k in wanted if k not in header]
    if missing:
        raise CheckpointError(f"{path}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    order = sorted(wanted, key=lambda k: header[k]["data_offsets"][0])
    staging = staging or StagingBuffer(0, pin=False)
    file_size = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        for key in order:
            meta = header[key]
            begin, end = meta["data_offsets"]
            torch_dtype = SAFETENSORS_DTYPES.get(meta["dtype"])
            if torch_dtype is None:
                raise CheckpointError(f"{path}: tensor {key} has unsupported dtype {meta['dtype']}")
            if data_start + end > file_size:
                raise CheckpointError(f"{path}: file is truncated (tensor {key} ends past the end); re-download it")
            buf = staging.view(end - begin)
            f.seek(data_start + begin)
            view = memoryview(buf.numpy())
            done = 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:
                    raise CheckpointError(f"{path}: unexpected end of file in tensor {key}")
                done += n
            host = (
                buf.view(torch_dtype).view(meta["shape"])
                if end > begin
                else torch.empty(meta["shape"], dtype=torch_dtype)
            )
            yield key, _to_device(host, device, dtype, staging)


def stream_torch_file(
    path: Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, copy: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (key, tensor) from a torch state-dict file, memory-mapped, one tensor at a time.

    `copy=False` on the CPU yields the memory-mapped tensors themselves (when no cast is needed):
    pages are read on use and belong to the page cache, not to the process's anonymous memory.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except Exception as exc:  # torch raises many types for corrupt or non-weights files
        raise CheckpointError(f"{path}: cannot load as a weights-only torch state dict ({exc})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a state dict, found {type(state).__name__}")
    device = torch.device(device)
    for key in list(state):
        tensor = state.pop(key)
        out = tensor.to(device, copy=copy)
        if dtype is not None and out.dtype.is_floating_point:
            out = out.to(dtype)
        yield key, out
        del tensor
