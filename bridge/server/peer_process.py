"""Who shares one client's queue cap when there are no CurveZMQ keys.

Without keys a client's identity is its connection (docs/protocol.md, "Identity"), so one process
that opens several connections would get several clients' share of the queue. The per-client cap
(`max_queue_per_client`) therefore also applies to a wider group, the one ZeroMQ can vouch for:
- over `ipc://`, the peer process (the kernel's credentials of the socket: ZeroMQ's `Peer-Address`
  property reads "HOST:UID:GID:PID");
- over `tcp://` without keys, nothing tells two local processes apart: all unauthenticated
  connections together share one client's cap (a server shared by several users needs keys;
  `serve` says so when it starts without them).
With CurveZMQ the group is the authenticated key itself, as the identity is.
"""

from __future__ import annotations

import re

import zmq

UNAUTHENTICATED = "unauthenticated"
_IPC_CREDENTIALS = re.compile(r":(\d+):(\d+):(\d+)\Z")  # ...:uid:gid:pid (SO_PEERCRED, as ZeroMQ formats it)


def cap_group(identity: str, header: zmq.Frame, curve: bool) -> str:
    """The group whose waiting jobs together are held to `max_queue_per_client`."""
    if curve:
        return identity
    try:
        address = header.get("Peer-Address")
    except (zmq.ZMQError, TypeError):  # no such property on this transport
        address = ""
    match = _IPC_CREDENTIALS.search(address or "")
    if match:
        uid, _, pid = match.groups()
        return f"process:{uid}:{pid}"
    return UNAUTHENTICATED
