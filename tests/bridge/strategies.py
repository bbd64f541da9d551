"""Hypothesis strategies for fuzzing the wire decoder and the server: random frames, random
msgpack headers, and valid submits with parts replaced by junk."""

from __future__ import annotations

import msgpack
import numpy as np
from hypothesis import strategies as st

from bridge import protocol
from bridge.protocol import encode

PNG = protocol.PNG_MAGIC + b"rest-of-a-png"
POSES = np.tile(np.eye(4, dtype=np.float32), (9, 1, 1))
INTRINSICS = np.tile(np.float32([[500, 500, 416, 240]]), (9, 1))


def submit_frames(**fields) -> list:
    header = {"rid": "r-1", "client": "c-1", "prompt": "go forward", "settings": {"steps": 4}, **fields}
    return encode("submit", header, {"poses": POSES, "intrinsics": INTRINSICS}, {"image": PNG})


def header_of(frames: list) -> dict:
    return msgpack.unpackb(frames[0])


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = ["v", "type", "rid", "job", "client", "prompt", "settings", "frames", "want_frames", "name"]


@st.composite
def mutated_submits(draw):
    """A valid submit with some header fields, frame descriptors or frames replaced by junk."""
    frames = submit_frames()
    header = header_of(frames)
    for key in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=3)):
        header[key] = draw(values)
    if isinstance(header.get("frames"), list) and header["frames"] and draw(st.booleans()):
        index = draw(st.integers(0, len(header["frames"]) - 1))
        descriptor = dict(header["frames"][index]) if isinstance(header["frames"][index], dict) else {}
        key = draw(st.sampled_from(["name", "kind", "dtype", "shape", "size"]))
        descriptor[key] = draw(values | st.lists(st.integers(-5, 2**40), max_size=5))
        header["frames"][index] = descriptor
    try:
        packed = msgpack.packb(header)
    except (TypeError, ValueError, OverflowError):
        packed = msgpack.packb({"v": 1})
    data = list(frames[1:])
    if draw(st.booleans()):
        data = draw(st.lists(st.binary(max_size=300), max_size=5))
    return [packed, *data]


frame_lists = st.one_of(
    st.lists(st.binary(max_size=200), max_size=6),
    st.builds(lambda v, rest: [msgpack.packb(v), *rest], values, st.lists(st.binary(max_size=64), max_size=3)),
    mutated_submits(),
)


@st.composite
def wrong_versions(draw):
    version = draw(st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40).filter(lambda v: v != 1),
                             st.text(max_size=5), st.floats()))  # fmt: skip
    return [msgpack.packb({"v": version, "type": "health", "rid": "r"})]


@st.composite
def oversized_shapes(draw):
    """Submits declaring shapes (or sizes) far above the caps, with small real frames."""
    frames = submit_frames()
    header = header_of(frames)
    index = draw(st.integers(0, 2))
    if header["frames"][index]["kind"] == "blob":
        header["frames"][index]["size"] = draw(st.integers(2**25, 2**63))
    else:
        shape = list(header["frames"][index]["shape"])
        shape[0] = draw(st.integers(5000, 2**62))
        header["frames"][index]["shape"] = shape
    return [msgpack.packb(header), *frames[1:]]


@st.composite
def big_junk(draw):
    """A header (valid or not) followed by a few MiB of data."""
    header = draw(st.sampled_from([submit_frames()[0], b"\x00", msgpack.packb({"v": 1, "type": "submit"})]))
    return [header, b"\x00" * draw(st.integers(1 << 20, 6 << 20))]


server_frames = st.one_of(frame_lists.filter(len), wrong_versions(), oversized_shapes(), big_junk())
