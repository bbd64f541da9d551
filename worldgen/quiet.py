"""Third-party messages known to be harmless on our path, hidden unless asked for.

Each entry names the library's logger and the start of one message, so nothing else is hidden:
- bitsandbytes (CPU backend) logs "Failed to load CPU gemm_4bit_forward from kernels-community"
  on every import on a CPU with AVX512-BF16 when the optional `kernels` package is absent. It then
  falls back to its own kernel; our NF4 path never calls that kernel (worldgen.kernels.nf4 dequantizes
  with its own lines on the CPU, with bitsandbytes' functional API on CUDA).
`--verbose` (or LINGBOT_ISAAC_VERBOSE=1, which the server passes on to its worker) shows them.
"""

from __future__ import annotations

import logging
import os

HARMLESS: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
)
VERBOSE_ENV = "LINGBOT_ISAAC_VERBOSE"


class _DropKnown(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def hide_known_harmless() -> None:
    """Install the filters (idempotent); call before importing the library. No-op when verbose."""
    if verbose():
        return
    for logger_name, prefix in HARMLESS:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _DropKnown) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropKnown(prefix))
