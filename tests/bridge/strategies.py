"""Hypothesis strategies for fuzzing the wire decoder and the server: random frames, random
msgpack headers, and valid submits with parts replaced by junk."""

from __future__ import annotations

import msgpack
import numpy as np
from hypothesis import strategies as st

from bridge.wire.protocol import encode


def _png(height: int = 16, width: int = 32) -> bytes:
    """A real PNG (the server reads its size at the door: the engine's size rule needs it)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()
PROMPTS = ["", " ", "   \t\n", "\u3000", None, 5, 1.5, True, [], {}, ["go"], {"text": "go"}, "go forward"]
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


# ---------------------------------------------------------------------------------------------
# A fast deterministic generator for long campaigns against a live server (10,000 messages in a
# minute: hypothesis' own overhead per example would dominate there).

SETTING_NAMES = ["size", "frame_num", "steps", "shift", "guide_scale", "boundary", "seed", "negative_prompt",
                 "fps", "model", "compute", "bogus"]  # fmt: skip


def _junk(rng, depth: int = 0):
    kind = rng.randrange(14 if depth < 2 else 11)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 10**18])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e30, -1e30, 1e-300, float("nan"), float("inf"), float("-inf"), 0.5])
    if kind == 4:
        return rng.uniform(-1e6, 1e6)
    if kind == 5:
        return rng.choice(["", "480*832", "0*0", "99999999*99999999", "-16*16", "16x16", "a*b", "\x00", "é" * 40])
    if kind == 6:
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(0, 30)))
    if kind == 7:
        return rng.randrange(-1000, 1000)
    if kind == 8:
        return rng.choice(["base", "fast", "bf16", "fp8", "tiny"])
    if kind == 9:
        return [rng.uniform(-10, 10) for _ in range(rng.randrange(0, 4))]
    if kind == 10:
        return rng.randbytes(rng.randrange(0, 8)).hex()
    if kind == 11:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if kind == 12:
        return {str(_junk(rng, depth + 1))[:8]: _junk(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return {"low": 1.0, "high": 2.0}


def _pack(header) -> bytes:
    try:
        return msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return msgpack.packb({"v": 1, "type": "health"})  # no rid: an error without one


def adversarial_messages(count: int, seed: int = 0):
    """`count` adversarial messages (lists of frames), mostly almost-valid so they reach deep."""
    import random

    rng = random.Random(seed)
    valid = submit_frames()
    for i in range(count):
        kind = rng.randrange(11)
        rid = f"f{i}"
        if kind == 10:  # prompts: empty, blank, not a string (checked at the door: bad_request)
            header = {**header_of(valid), "rid": rid, "prompt": rng.choice(PROMPTS)}
            yield [_pack(header), *valid[1:]]
            continue
        if kind <= 3:  # a valid submit whose settings are junk
            settings = {rng.choice(SETTING_NAMES): _junk(rng) for _ in range(rng.randrange(1, 4))}
            if rng.random() < 0.2:
                settings = _junk(rng)
            header = {**header_of(valid), "rid": rid, "settings": settings}
            yield [_pack(header), *valid[1:]]
        elif kind == 4:  # junk in a known field of a known type
            header = {**header_of(valid), "rid": rid}
            header[rng.choice(FIELD_NAMES + ["rid", "client"])] = _junk(rng)
            yield [_pack(header), *valid[1:]]
        elif kind == 5:  # junk frame descriptors
            header = {**header_of(valid), "rid": rid}
            frames = [dict(d) for d in header["frames"]]
            frames[rng.randrange(len(frames))][rng.choice(["name", "kind", "dtype", "shape", "size"])] = _junk(rng)
            header["frames"] = frames
            data = list(valid[1:])
            if rng.random() < 0.3:
                data = [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(0, 5))]
            yield [_pack(header), *data]
        elif kind == 6:  # other request types with junk
            type_ = rng.choice(["status", "watch", "cancel", "health", "submit", "result", "nope", ""])
            header = {"v": 1, "type": type_, "rid": rid, "job": rng.choice([_junk(rng), "0" * 32, "a" * 64])}
            yield [_pack(header)]
        elif kind == 7:  # wrong versions
            yield [_pack({"v": _junk(rng), "type": "health", "rid": rid})]
        elif kind == 8:  # raw bytes
            yield [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 6))]
        else:  # random msgpack values as headers
            yield [_pack(_junk(rng)), *[rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(0, 3))]]
