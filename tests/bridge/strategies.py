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
    st.deferred(lambda: live_messages),  # `live`, `poses`, `end` ... (below: adversarial_live_messages)
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


# ---------------------------------------------------------------------------------------------
# Live jobs (issue 53): the same kind of campaign through `live`, `poses`, `end`, `cancel` and `watch`,
# mostly almost valid so it reaches past the decoder into the door's rules and a job's feed.

LIVE_SETTINGS = {"model": "fast", "size": "48*80", "frame_num": 33}
LIVE_SETTING_NAMES = ["frame_num", "size", "model", "gpus", "translation_scale", "seed", "fps", "compute", "steps"]
LIVE_FIELDS = ["rid", "live_v", "client", "prompt", "settings", "want_stills", "name", "job", "seq", "end"]
FRAME_NUMS = [-1, 0, 1, 4, 5, 8, 9, 10, 12, 13, 21, 33, 160, 161, 162, 10**9, 2**63 - 1, 9.0, "33", None]
SEQS = [-1, 2**31, 2**63 - 1, 2**64 - 1, 1.0, "0", None, True]


def _png_header(width: int, height: int) -> bytes:
    """A PNG signature and a valid IHDR declaring `width` x `height`, no pixel data (a bomb's header)."""
    import struct
    import zlib

    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))


def _image(rng) -> bytes:
    """A first frame that is wrong in one way (or, now and then, right)."""
    import io

    from PIL import Image

    kind = rng.randrange(11)
    if kind == 0:
        return b"\xff\xd8\xff" + b"\x00" * rng.randrange(0, 64)  # JPEG magic bytes alone
    if kind == 1:
        return b"\x89PNG\r\n\x1a\n" + rng.randbytes(rng.randrange(0, 64))
    if kind == 2:
        return PNG[: rng.randrange(1, len(PNG))]  # truncated
    if kind == 3:
        return _png_header(rng.choice([0, 1, 65535, 100000, 2**31 - 1]), rng.choice([0, 1, 50000, 2**31 - 1]))
    if kind == 4:
        return rng.randbytes(rng.randrange(0, 200))
    if kind == 5:
        return b""
    size = rng.choice([(1, 1), (1, 4000), (4000, 1), (2, 3), (16, 32)])  # (height, width): aspects the size rule meets
    mode = rng.choice(["RGB", "L", "RGBA", "P", "I;16", "1", "CMYK"])
    image = Image.new(mode, size[::-1])
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG" if mode == "CMYK" or (mode == "L" and rng.random() < 0.5) else "PNG")
    return buffer.getvalue()


def _far(rng):
    return rng.choice([1e9, 1.0000001e9, -2e9, 3e38, -3.4e38, 1e300, -1e308, 1e-45, -0.0, 5e-324])


def _poses(rng, count: int | None = None) -> np.ndarray:
    """A pose batch: a rigid path forward, then (mostly) one thing wrong with it: NaN, inf, a
    translation float32 maths cannot survive (float32 and float64), a scale, a reflection, a bad last
    row, a rotation just past the tolerance, a wrong shape or dtype."""
    n = rng.choice([0, 1, 2, 3, 9, 12, 24, 100, 4096, 4097]) if count is None else count
    dtype = rng.choice([np.float32, np.float64])
    poses = np.tile(np.eye(4), (n, 1, 1)).astype(dtype)
    if n:
        poses[:, 2, 3] = np.linspace(0, 1, n)
    kind = rng.randrange(16)
    if n and kind < 9:
        i = rng.randrange(n)
        row, col = rng.randrange(4), rng.randrange(4)
        if kind == 0:
            poses[i, row, col] = float("nan")
        elif kind == 1:
            poses[i, row, col] = rng.choice([float("inf"), float("-inf")])
        elif kind == 2:
            poses[i, rng.randrange(3), 3] = _far(rng) if dtype == np.float64 else np.float32(rng.choice([3e38, 1e10]))
        elif kind == 3:
            poses[i, :3, :3] *= rng.choice([2.0, 0.0, -1.0, 1.0005, 1e-20, 1e200 if dtype == np.float64 else 1e30])
        elif kind == 4:
            poses[i, 0, :3] *= -1  # a reflection: det < 0
        elif kind == 5:
            poses[i, 3] = rng.choice([[0, 0, 0, 2], [0, 0, 1e-5, 1], [1, 0, 0, 1], [0, 0, 0, 0]])
        elif kind == 6:
            poses[i, 0, 1] = rng.choice([1e-4, 9.9e-4, 1.1e-3, 0.5])  # around ROTATION_TOLERANCE
        elif kind == 7:
            poses[i, row, col] = _far(rng) if dtype == np.float64 else np.float32(rng.choice([1e9, 1e-38]))
        else:
            poses[:, :3, 3] = rng.choice([1e8, -1e9, 9.99e8])  # far from the origin, within the bound
    elif kind == 9:
        return poses.reshape(n, 16) if n else np.zeros((0, 4, 3), dtype)
    elif kind == 10:
        return np.zeros((n, 3, 4), dtype)
    elif kind == 11:
        return np.eye(4, dtype=dtype)  # [4, 4]: one pose without its batch axis
    elif kind == 12:
        return poses[..., None]
    elif kind == 13:
        return poses.astype(rng.choice([np.int32, np.uint8, np.float16, np.int64, np.complex64]))
    return poses


def _encode_any(type_: str, fields: dict, arrays: dict, blobs: dict) -> list:
    """`protocol.encode`, also for arrays of dtypes it never sends (their descriptor names them)."""
    sendable, odd = {}, {}
    for name, array in arrays.items():
        (odd if array.dtype.name not in ("float32", "float64", "uint8") else sendable)[name] = array
    frames = encode(type_, fields, sendable, blobs)
    if not odd:
        return frames
    header = header_of(frames)
    header.setdefault("frames", [])
    data = list(frames[1:])
    for name, array in odd.items():
        header["frames"].insert(0, {"name": name, "kind": "array", "dtype": array.dtype.name,
                                    "shape": list(array.shape)})  # fmt: skip
        data.insert(0, np.ascontiguousarray(array).tobytes())
    return [_pack(header), *data]


def _live_open(rng, rid: str) -> list:
    fields = {"rid": rid, "live_v": 1, "prompt": "a corridor, forward", "settings": dict(LIVE_SETTINGS)}
    arrays = {"intrinsics": INTRINSICS[:1]}
    blobs = {"image": PNG}
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):  # a third of the opens are valid: jobs to feed
        what = rng.randrange(9)
        if what == 0:
            fields["prompt"] = rng.choice(PROMPTS + ["x" * 20000, "\x00", "\u200b"])
        elif what == 1:
            fields["live_v"] = rng.choice([0, 2, -1, "1", None, 1.0, True, 2**64 - 1])
        elif what == 2 and isinstance(fields["settings"], dict):
            fields["settings"]["frame_num"] = rng.choice(FRAME_NUMS)
        elif what == 3 and isinstance(fields["settings"], dict):
            fields["settings"][rng.choice(LIVE_SETTING_NAMES)] = rng.choice(
                [_junk(rng), "base", "causal", 2, 0.0, -1.0, float("nan"), float("inf"), 1e-300, 1e300]
            )
        elif what == 4:
            fields["settings"] = _junk(rng) if rng.random() < 0.5 else {}
        elif what == 5:
            intrinsics = rng.choice([
                np.float32([[500, 500, 40, 24]]), np.float64([[1e300, 1e300, 0, 0]]), np.float32([[0, 500, 1, 1]]),
                np.float32([[-1, -1, 1, 1]]), np.float32([[np.nan, 1, 1, 1]]), np.float64([[np.inf, 1, 1, 1]]),
                np.zeros((0, 4), np.float32), np.ones((3, 4), np.float32) * 500, np.ones((1, 3), np.float32),
                np.ones(4, np.float32), np.ones((1, 4, 1), np.float32), np.ones((1, 4), np.int32),
                np.float32([[1e-45, 1e-45, 0, 0]]), np.float64([[1e39, 1e39, 0, 0]]),
            ])  # fmt: skip
            arrays["intrinsics"] = intrinsics
        elif what == 6:
            blobs["image"] = _image(rng)
        elif what == 7:
            fields[rng.choice(LIVE_FIELDS)] = _junk(rng)
        else:
            arrays["poses"] = _poses(rng)  # a frame `live` does not take
    return _encode_any("live", fields, arrays, blobs)


def _foreign_job(rng) -> object:
    return rng.choice([rng.randbytes(16).hex(), "0" * 32, "a" * 64, "a" * 65, "", "../../etc", _junk(rng)])


def adversarial_live_messages(count: int, jobs: dict[str, int], seed: int = 0):
    """`count` adversarial messages of live jobs (lists of frames), with a share of `adversarial_messages`'
    batch-side ones. `jobs`: the caller's live jobs (id -> the next `seq` it expects), kept from the
    answers (an `accepted` to an open, whose rid starts with "open-"; a `poses_ok`), so pose batches,
    ends and cancels reach real jobs as well as foreign ids. Frames of opens that need not be valid
    are junk by turns."""
    import random

    rng = random.Random(seed)
    batch = adversarial_messages(count, seed=seed + 1)
    for i in range(count):
        kind = rng.randrange(20)
        known = list(jobs)
        job = rng.choice(known) if known and rng.random() < (0.85 if 5 <= kind < 13 else 0.5) else _foreign_job(rng)
        if kind < 5:
            yield _live_open(rng, f"open-{i}")
        elif kind < 13:
            expected = jobs.get(job, 0) if isinstance(job, str) else 0
            roll = rng.random()
            seq = (
                expected
                if roll < 0.7
                else rng.choice(SEQS)
                if roll < 0.8
                else max(0, expected + rng.choice([-1, 1, 5]))
            )
            poses = _poses(rng) if rng.random() < 0.5 else _poses(rng, rng.choice([1, 3, 9, 12]))
            if rng.random() < 0.5 and poses.ndim == 3 and poses.shape[1:] == (4, 4) and len(poses):
                poses = poses.copy()  # clean: a batch the feed takes, unless its seq or length says otherwise
                poses[:] = np.eye(4)
                poses[:, 2, 3] = np.linspace(0, 0.5, len(poses))
            fields = {"rid": f"poses-{i}", "job": job, "seq": seq}
            if rng.random() < 0.1:
                fields["end"] = rng.choice([True, False, 1, "yes", None])
            if rng.random() < 0.1:
                fields[rng.choice(LIVE_FIELDS)] = _junk(rng)
            yield _encode_any("poses", fields, {"poses": poses} if rng.random() < 0.95 else {}, {})
        elif kind == 13:
            yield [_pack({"v": 1, "type": "end", "rid": f"end-{i}", "job": job})]
        elif kind == 14:
            yield [_pack({"v": 1, "type": "cancel", "rid": f"cancel-{i}", "job": job})]
        elif kind == 15:
            fields = {"v": 1, "type": rng.choice(["watch", "status"]), "rid": f"watch-{i}", "job": job}
            fields[rng.choice(["want_chunks", "want_stills"])] = rng.choice([True, False, 1, None, "x"])
            yield [_pack(fields)]
        else:
            yield next(batch)


# one message of the live campaign, for hypothesis (a seed: the message is drawn as the campaign draws it)
live_messages = st.integers(0, 2**32 - 1).map(lambda seed: next(adversarial_live_messages(1, {}, seed=seed)))
