"""Stream tensors from checkpoint files to a device, one at a time, without RAM peaks.

safetensors files are read by hand (an 8-byte header length, a JSON header, raw data): runs of
neighbouring tensors are `readinto` one of two reusable staging buffers (pinned when the target is
CUDA) in large sequential reads and copied to the device while the next read fills the other
buffer, so resident memory stays at two staging buffers whatever the model size. Going through
`safetensors.safe_open` instead would map the whole file and leave every touched page resident.
Torch `.pth` state dicts are opened with `torch.load(weights_only=True, mmap=True)` (no arbitrary
unpickling, no full read) and copied tensor by tensor.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import struct
import threading
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
    """Two reusable host buffers, used in turn; pinned for fast, asynchronous host-to-GPU copies.

    While the GPU copies out of one buffer, the next read fills the other: disk reads and
    host-to-GPU copies overlap. `nbytes` is the size of each buffer.
    """

    def __init__(self, nbytes: int, pin: bool):
        self.pin = pin
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.events: list[torch.cuda.Event | None] = [None, None]
        self.current = 1

    @property
    def capacity(self) -> int:
        return self.buffers[0].numel()

    def view(self, nbytes: int) -> torch.Tensor:
        """The next buffer, at least `nbytes` long, once the copies still reading from it are done."""
        self.current ^= 1
        if self.events[self.current] is not None:
            self.events[self.current].synchronize()
            self.events[self.current] = None
        if nbytes > self.buffers[self.current].numel():
            self.buffers[self.current] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        return self.buffers[self.current][:nbytes]

    def copies_issued(self) -> None:
        """Mark the current buffer busy until the GPU copies queued so far have run."""
        if torch.cuda.is_available() and self.pin:
            self.events[self.current] = torch.cuda.Event()
            self.events[self.current].record()


def _to_device(host: torch.Tensor, device: torch.device, dtype: torch.dtype | None):
    # on the CPU, clone: the staging buffer is reused, so the tensor must own its bytes
    out = host.to(device, non_blocking=True) if device.type == "cuda" else host.clone()
    return out if dtype is None or not out.dtype.is_floating_point else out.to(dtype)


def _read_exactly(f, view: memoryview, path: Path, what: str) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise CheckpointError(f"{path}: unexpected end of file in {what}")
        done += n


def stream_safetensors(
    path: Path,
    keys: Iterable[str] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    staging: StagingBuffer | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (key, tensor on `device`) for `keys` (default: all) in file order.

    Neighbouring tensors are read together, up to the staging buffer's size per read, so the file
    is read in large sequential blocks whatever the tensor sizes (NF4 files hold thousands of tiny
    quant-state tensors). Floating tensors are cast to `dtype` on the device when given; integer
    ones never are.
    """
    device = torch.device(device)
    header, data_start = read_safetensors_header(path)
    wanted = header.keys() if keys is None else list(keys)
    missing = [k for k in wanted if k not in header]
    if missing:
        raise CheckpointError(f"{path}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    order = sorted(wanted, key=lambda k: header[k]["data_offsets"][0])
    for key in order:
        if header[key]["dtype"] not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{path}: tensor {key} has unsupported dtype {header[key]['dtype']}")
    staging = staging or StagingBuffer(64 * 2**20, pin=False)
    file_size = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        i = 0
        while i < len(order):
            # one read: this tensor and the following ones while they fit the buffer (no big gaps)
            first_begin, end = header[order[i]]["data_offsets"]
            j = i + 1
            while j < len(order):
                begin_j, end_j = header[order[j]]["data_offsets"]
                if end_j - first_begin > staging.capacity or begin_j - end > 2**20:
                    break
                end, j = max(end, end_j), j + 1
            if data_start + end > file_size:
                raise CheckpointError(
                    f"{path}: file is truncated (tensor {order[j - 1]} ends past the end); re-download it"
                )
            buf = staging.view(end - first_begin)
            f.seek(data_start + first_begin)
            _read_exactly(f, memoryview(buf.numpy()), path, f"tensors {order[i]} ... {order[j - 1]}")
            for key in order[i:j]:
                meta = header[key]
                begin, stop = (o - first_begin for o in meta["data_offsets"])
                torch_dtype = SAFETENSORS_DTYPES[meta["dtype"]]
                raw = buf[begin:stop]
                if begin % torch_dtype.itemsize:
                    raw = raw.clone()  # the format does not align tensors; a view needs aligned bytes
                host = (
                    raw.view(torch_dtype).view(meta["shape"])
                    if stop > begin
                    else torch.empty(meta["shape"], dtype=torch_dtype)
                )
                yield key, _to_device(host, device, dtype)
            if device.type == "cuda":
                staging.copies_issued()
            i = j


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


def prefetch_into_page_cache(paths: Iterable[Path]) -> threading.Thread:
    """Read `paths` in a background thread so that a later load of them comes from the page cache.

    The page cache is memory the kernel can reclaim, not this process's: the next expert is read
    from disk while the current one computes, without ever holding both in RAM.
    """

    def read_all() -> None:
        block = bytearray(16 * 2**20)
        for path in paths:
            try:
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(block):
                        pass
            except OSError:  # a prefetch is only a hint; the real load reports errors
                continue

    thread = threading.Thread(target=read_all, name="prefetch", daemon=True)
    thread.start()
    return thread


_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)


def release_host_pages(tensor: torch.Tensor) -> None:
    """Drop the resident pages of a CPU tensor we are done with (Linux `madvise(MADV_DONTNEED)`).

    For a memory-mapped checkpoint this returns the pages to the page cache, so the process's RSS
    does not grow to the size of the file as its tensors pass through to the GPU. Only whole pages
    inside the tensor are released; call it only on tensors nothing will read again.
    """
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = (start + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first and _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED) != 0:
        release_host_pages.failures += 1


release_host_pages.failures = 0
