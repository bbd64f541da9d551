"""Write a safetensors file one tensor at a time, so the whole state dict never sits in RAM.

`safetensors.torch.save_file` needs every tensor at once (a 9.6 GB dict for one NF4 expert). The
format puts a JSON header before the data, and we only know every tensor's final shape (the size
of a packed NF4 quant state, for instance) after producing it, so this writer reserves room for
the header, appends each tensor's bytes as it comes, and at the end writes the header into the
reserved room padded with spaces, which the format allows (its own writer pads to 8 bytes the
same way). The file is written under a temporary name and renamed only when complete.

Reserve with `header_bound`: an upper bound from the key names and tensor ranks alone. `save_file`
writes a whole dict the same way: unlike `safetensors.torch.save_file` (0600 whatever the umask),
its file gets the mode any other output of the user's gets (`contracts.atomic`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from contracts import atomic

DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_MAX_NUMBER_CHARS = 20  # digits of any 64-bit offset or dimension


def header_bound(entries: Iterable[tuple[str, int]], metadata: dict[str, str] | None = None) -> int:
    """Bytes enough for the header of tensors named and ranked as `entries` [(key, ndim), ...]."""
    template = len(json.dumps({"dtype": "BF16", "shape": [], "data_offsets": [0, 0]}))
    total = len(json.dumps({"__metadata__": metadata or {}})) + 2
    for key, ndim in entries:
        # key, colon and comma, the entry with every number at its widest
        total += len(json.dumps(key)) + 2 + template + (ndim + 2) * (_MAX_NUMBER_CHARS + 1)
    return (total + 7) // 8 * 8


class SafetensorsWriter:
    """`with SafetensorsWriter(path, reserve) as w: w.add(key, tensor) ...`; the file appears on success."""

    def __init__(self, path: Path | str, header_reserve: int, metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.reserve = (header_reserve + 7) // 8 * 8
        self.metadata = metadata
        self.tmp = atomic.temp_path(self.path)
        self.entries: dict[str, dict] = {}
        self.offset = 0
        self.file = open(self.tmp, "wb")  # noqa: SIM115 (closed by close()/abort(), which the context manager calls)
        self.file.write(b"\0" * (8 + self.reserve))

    def add(self, key: str, tensor: torch.Tensor) -> None:
        if key in self.entries:
            raise ValueError(f"{self.path}: tensor {key} written twice")
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"{self.path}: tensor {key} has dtype {tensor.dtype}, which safetensors cannot store")
        host = tensor.detach().to("cpu").contiguous()
        nbytes = host.numel() * host.element_size()
        if nbytes:
            self.file.write(memoryview(host.reshape(-1).view(torch.uint8).numpy()))
        self.entries[key] = {
            "dtype": DTYPE_NAMES[host.dtype],
            "shape": list(host.shape),
            "data_offsets": [self.offset, self.offset + nbytes],
        }
        self.offset += nbytes

    def close(self) -> None:
        header = dict(self.entries)
        if self.metadata:
            header = {"__metadata__": self.metadata, **header}
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) > self.reserve:
            raise RuntimeError(f"{self.path}: header of {len(text)} bytes exceeds the {self.reserve} reserved")
        self.file.seek(0)
        self.file.write(struct.pack("<Q", self.reserve) + text + b" " * (self.reserve - len(text)))
        self.file.close()
        atomic.commit(self.tmp, self.path)  # fsync, rename, fsync the folder

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save_file(tensors: Mapping[str, torch.Tensor], path: Path | str, metadata: dict[str, str] | None = None) -> Path:
    """`safetensors.torch.save_file`'s job, atomically and with the umask's mode (0644 under 022)."""
    reserve = header_bound(((key, tensor.ndim) for key, tensor in tensors.items()), metadata)
    with SafetensorsWriter(path, reserve, metadata) as writer:
        for key, tensor in tensors.items():
            writer.add(key, tensor)
    return Path(path)
