"""How a client reaches the generation server: the one default port, endpoint and request timeout.

Every client (`bridge.client.client.Client`, `submit`, `replay`, the Isaac session and window, the
record-then-generate script) and the server's default bind take them from here, so the loopback
address a user sees in one help text is the one every other part uses. Here rather than in
`bridge.wire.protocol` because the Isaac side reads them without loading the bridge (its ZeroMQ client
is imported only when a job is sent).
"""

from __future__ import annotations

DEFAULT_PORT = 5570
DEFAULT_ENDPOINT = f"tcp://127.0.0.1:{DEFAULT_PORT}"  # loopback: no keys needed (docs/protocol.md)
# Seconds a client waits for each reply before it tries again (Lazy Pirate), then gives up after
# its retries: long enough for a busy server's answer, short enough that Isaac Sim never waits long.
REQUEST_TIMEOUT_S = 10.0
