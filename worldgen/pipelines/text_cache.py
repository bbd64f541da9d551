"""On-disk cache of prompt embeddings, keyed by prompt text, text length and text-encoder file.

Robot episodes reuse a handful of prompts (and always the same negative prompt): a cache hit means
the 10.6 GB text encoder is never loaded for that job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from contracts import atomic


def default_cache_dir() -> Path:
    from worldgen.runtime.tiny import cache_root  # the one cache root (LINGBOT_ISAAC_CACHE)

    return cache_root() / "text-embeddings"


class TextCache:
    def __init__(self, encoder_file: Path, directory: Path | None = None, variant: str = ""):
        stat = Path(encoder_file).stat()
        # the encoder file's identity: path, size and mtime (hashing 10 GB per start would be slow);
        # `variant` (device and dtype) because bf16-on-GPU and float32-on-CPU embeddings differ slightly
        self.identity = f"{Path(encoder_file).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{variant}"
        self.directory = Path(directory) if directory else default_cache_dir()

    def _path(self, prompt: str, text_len: int) -> Path:
        digest = hashlib.sha256(f"{self.identity}\0{text_len}\0{prompt}".encode()).hexdigest()
        return self.directory / f"{digest}.safetensors"

    def get(self, prompt: str, text_len: int) -> torch.Tensor | None:
        path = self._path(prompt, text_len)
        if not path.exists():
            return None
        try:
            return load_file(path)["context"]
        except Exception:  # a corrupt entry is a miss, and is rewritten
            return None

    def put(self, prompt: str, text_len: int, context: torch.Tensor) -> None:
        path = self._path(prompt, text_len)
        # bytes through the atomic writer, not save_file (which creates 0600 files whatever the umask);
        # not durable: a cache entry lost in a crash is recomputed
        atomic.write_bytes(path, save({"context": context.float().contiguous().cpu()}), durable=False)
