"""Where compiled kernels are kept between processes: the user's cache folder, not /tmp.

The fused elementwise kernels (`worldgen.kernels.fused`), the FP8 quantizers (`worldgen.kernels.fp8`)
and FlashAttention 4 are compiled on first use: on a fresh machine that was most of a Fast rollout's
first chunk (19.95 s against 3.9 s warm, issue 21). PyTorch Inductor keeps its compiled graphs and
Triton its binaries on disk, by default under /tmp, which a reboot or a container start empties.
FlashAttention 4 keeps its kernels' object files on disk only when asked
(`FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`; each process compiled its attention again, ~4 s of an exact
Fast load on the H100). `use_persistent_cache` turns that on and points all three at `<cache
root>/compile/` (the project's cache root, `worldgen.runtime.tiny.cache_root`: `$LINGBOT_ISAAC_CACHE`,
default `~/.cache/lingbot-isaac`) unless the user chose otherwise (`TORCHINDUCTOR_CACHE_DIR`,
`TRITON_CACHE_DIR`, `FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED` / `_DIR`), so a second process, or the same
machine after a restart, loads them instead of compiling. `cache_state` says whether the folders hold any
(`lingbot-isaac doctor`).
"""

from __future__ import annotations

import os
from pathlib import Path

from worldgen.runtime.tiny import cache_root

INDUCTOR_ENV, TRITON_ENV = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"
# read once, when FlashAttention 4 is first imported (a job's first attention call)
FLASH_ENV, FLASH_SWITCH = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"


def compile_cache_dir() -> Path:
    return cache_root() / "compile"


def use_persistent_cache() -> tuple[Path, Path, Path]:
    """Set Inductor's, Triton's and FlashAttention 4's cache folders for this process (and its children)
    before anything compiles, unless already set; -> the folders in use."""
    root = compile_cache_dir()
    if os.environ.get(INDUCTOR_ENV) in (None, "", _torch_default()):
        os.environ[INDUCTOR_ENV] = str(root / "inductor")
    os.environ.setdefault(TRITON_ENV, str(root / "triton"))
    os.environ.setdefault(FLASH_SWITCH, "1")
    os.environ.setdefault(FLASH_ENV, str(root / "flash-attn"))
    return Path(os.environ[INDUCTOR_ENV]), Path(os.environ[TRITON_ENV]), Path(os.environ[FLASH_ENV])


def _torch_default() -> str | None:
    """Inductor's /tmp default, which it writes into the environment the first time it looks (importing
    bitsandbytes does): that value was not the user's choice."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # pragma: no cover - a torch without it
        return None
    return default_cache_dir()


def cache_state() -> str:
    """'warm (N compiled kernels, X MiB) in DIR' or 'cold (nothing compiled yet) in DIR'."""
    chosen = os.environ.get(INDUCTOR_ENV)
    inductor = Path(chosen if chosen not in (None, "", _torch_default()) else compile_cache_dir() / "inductor")
    triton = Path(os.environ.get(TRITON_ENV) or compile_cache_dir() / "triton")
    flash = Path(os.environ.get(FLASH_ENV) or compile_cache_dir() / "flash-attn")
    kernels, size = 0, 0
    for folder, suffixes in ((inductor, (".cubin", ".hsaco")), (triton, (".cubin", ".hsaco")), (flash, (".o",))):
        if folder.is_dir():
            for path in folder.rglob("*"):
                if path.is_file():
                    size += path.stat().st_size
                    kernels += path.suffix in suffixes
    where = inductor.parent if inductor.parent == triton.parent else f"{inductor} and {triton}"
    if not kernels:
        return f"cold (nothing compiled yet: the first job compiles its kernels) in {where}"
    return f"warm ({kernels} compiled kernels, {size / 2**20:.0f} MiB) in {where}"
