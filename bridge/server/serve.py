"""Run the generation server in this process, from a `ServerConfig` (`bridge.server.server_config`).

    from bridge.server.server_config import load_server_config
    from bridge.server.serve import serve
    serve(load_server_config("config/server.toml"))  # until SIGTERM or SIGINT

Prints `listening on ENDPOINT` on stdout once clients can connect (`lingbot-isaac serve` is its
command line: lingbot_cli/serve.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util

from bridge.server.server import Server
from bridge.server.server_config import ServerConfig

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter (malloc.h)
LARGE_BUFFER_BYTES = 1 << 20


def return_large_buffers_to_the_os() -> None:
    """Make glibc mmap every buffer of 1 MiB or more (result videos sent to watchers, images).

    By default glibc raises its mmap threshold to the size of the last large block freed, so after
    the first result a multi-MiB read lands on the heap and its pages stay in the server's RSS
    after the send completes; a fixed threshold keeps them mmapped, and they go back to the OS as
    soon as the last peer's send lets go of them. Elsewhere (no glibc) this does nothing."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES)
    except OSError:
        pass


def serve(config: ServerConfig) -> int:
    """Start the server of `config` and serve until asked to stop (SIGTERM, SIGINT); 0 then."""
    return_large_buffers_to_the_os()
    server = Server(config)
    print(f"listening on {server.endpoint}", flush=True)
    server.serve_forever()
    return 0
