"""Is a server there? A TCP probe before the first request, so "no server" is said at once, with the fix.

ZeroMQ connects lazily and retries forever, so a client of a closed port only learns of it when its
request times out (`--timeout`, after the Lazy Pirate retries). A plain TCP connect answers at once
on loopback: refused means nothing listens (say how to start a server); accepted but no ZeroMQ
answer later means something else may hold the address (say so, in `explain_no_answer`).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from bridge.client.client import ServerUnavailable

PROBE_TIMEOUT_S = 1.0


def _host_port(endpoint: str) -> tuple[str, int] | None:
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        return None  # ipc://, inproc://, wildcards: nothing to probe
    return parts.hostname, parts.port


def serve_hint(endpoint: str) -> str:
    return (
        f"start one with `lingbot-isaac serve --bind {endpoint}` (add --ckpt DIR for real weights; "
        "`lingbot-isaac demo` runs the whole loop with its own server), or pass --server with the address "
        "of a running one"
    )


def check_listening(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise ServerUnavailable naming the fix when nothing accepts TCP connections at `endpoint`.

    Only a refusal (or an unknown host) is decisive; a probe that times out (a firewall that drops
    packets) leaves the verdict to the ZeroMQ request itself."""
    address = _host_port(endpoint)
    if address is None:
        return
    try:
        with socket.create_connection(address, timeout=timeout):
            return
    except ConnectionRefusedError:
        raise ServerUnavailable(
            f"no server at {endpoint}: nothing listens on port {address[1]}; {serve_hint(endpoint)}"
        ) from None
    except socket.gaierror as exc:
        raise ServerUnavailable(f"no server at {endpoint}: cannot resolve {address[0]!r} ({exc.strerror})") from None
    except OSError:  # timed out, unreachable network ...: let the request's own timeout decide
        return


def explain_no_answer(endpoint: str, error: ServerUnavailable) -> ServerUnavailable:
    """The error for a request that got no answer although the port accepted a TCP connection."""
    return ServerUnavailable(
        f"{error} Something accepts connections at {endpoint} but does not answer as a lingbot-isaac server: "
        "the server is still starting or overloaded, or another program holds the address (then start the "
        "server on a free port, `lingbot-isaac serve --bind tcp://127.0.0.1:PORT`, and pass that as --server)"
    )
