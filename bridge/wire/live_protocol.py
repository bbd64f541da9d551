"""The typed requests of live jobs (`live`, `poses`; docs/protocol.md, "Live jobs"), built from a message
`bridge.wire.protocol` has fully validated (its schemas, frames and caps are there, with every other type's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bridge.wire.protocol import LIVE_VERSION, Message, ProtocolError, image_format
from contracts import episode
from contracts.episode import EpisodeError


@dataclasses.dataclass(frozen=True)
class LiveOpen:
    """`live`: a live job's first frame, prompt, intrinsics (row 0 is used) and settings."""

    rid: str
    prompt: str
    settings: dict[str, Any]
    image: bytes
    image_format: str
    intrinsics: np.ndarray  # [1, 4]
    want_stills: bool = False
    name: str | None = None
    client: str | None = None


@dataclasses.dataclass(frozen=True)
class PoseBatch:
    """`poses`: batch `seq` (0, 1, 2 ...) of a live job's camera path, checked rigid and finite."""

    rid: str
    job: str
    seq: int
    poses: np.ndarray  # [N, 4, 4]
    end: bool = False


def parse_live(message: Message) -> LiveOpen | PoseBatch:
    """A validated `live` or `poses` message as its typed request; raises ProtocolError (with its code)."""
    return _live_open(message) if message.type == "live" else _pose_batch(message)


def _live_open(message: Message) -> LiveOpen:
    fields = message.fields
    if fields["live_v"] != LIVE_VERSION:
        raise ProtocolError(f"live_v {fields['live_v']} not supported (this side speaks {LIVE_VERSION})", "bad_version")
    image = message.blobs["image"]
    fmt = image_format(image)
    intrinsics = message.arrays["intrinsics"][:1]
    try:
        episode.check_intrinsics(intrinsics, 1, "live.intrinsics")
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None
    try:  # the episode's own rule, as `submit`'s (bridge.wire.protocol.parse_request): bad_request
        prompt = episode.check_prompt(fields["prompt"], "live.prompt")
    except EpisodeError as exc:
        raise ProtocolError(str(exc)) from None
    return LiveOpen(
        rid=fields["rid"],
        prompt=prompt,
        settings=dict(fields.get("settings") or {}),
        image=image,
        image_format=fmt,
        intrinsics=intrinsics,
        want_stills=bool(fields.get("want_stills", False)),
        name=fields.get("name"),
        client=fields.get("client"),
    )


def _pose_batch(message: Message) -> PoseBatch:
    fields = message.fields
    try:
        episode.check_poses(message.arrays["poses"], f"poses batch {fields['seq']} of job {fields['job']}")
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None
    return PoseBatch(
        fields["rid"], fields["job"], fields["seq"], message.arrays["poses"], bool(fields.get("end", False))
    )
