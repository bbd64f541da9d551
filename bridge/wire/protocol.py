"""The wire format between clients and the generation server (documented in docs/protocol.md).

A message is a ZeroMQ multipart message: one small msgpack header frame, then zero or more raw
data frames (numpy arrays as little-endian bytes, or blobs such as a JPEG or an mp4). The header
says what each data frame is (`frames`: name, kind, dtype, shape or size).

Decoding never trusts the network: the header frame is size-checked before msgpack sees it,
msgpack runs with small container limits, every declared shape and size is checked against the
caps in `Limits` and against the real frame length before any array is made, dtypes come from
an allowlist, and arrays are zero-copy views of frames already received (never allocated from a
declared shape). Nothing is ever unpickled. Every failure is a `ProtocolError` with a `code` that
the server sends back in an `error` message.

No zmq import here: frames are anything with the buffer protocol (bytes, zmq.Frame), so the
decoder is fuzzed without sockets.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from contracts import connection, episode
from contracts.episode import EpisodeError

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
CHUNK_VERSION = 1  # the `chunk` message's own version (an opt-in addition within protocol 1)
LIVE_VERSION = 1  # live jobs' own version (`live`, `poses`, `end`, `poses_ok`: an addition within protocol 1)
DEFAULT_PORT = connection.DEFAULT_PORT  # one home: contracts.connection

# Wire dtypes: names, always little-endian. Anything else is refused.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "uint8": np.dtype("u1"),
}
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_STATES = ("done", "failed", "cancelled")

# Error codes in `error` messages (docs/protocol.md explains each).
ERROR_CODES = (
    "bad_request",  # malformed message: header, frames, fields
    "bad_version",  # protocol version not spoken by this server
    "too_large",  # a frame, string, shape or count above the caps
    "bad_settings",  # generation settings the engine cannot use, or above the server's caps
    "bad_input",  # the episode cannot be generated (raised by the engine)
    "busy",  # queue full, or this client's share of the queue or of the spool: try again later
    "storage",  # the server cannot write its spool (disk full, read-only ...): try again later
    "not_found",  # unknown job id
    "cancelled",  # the job was cancelled
    "worker_crashed",  # the worker process died during the job (signal / OOM kill / exit)
    "worker_error",  # the job raised inside the worker
    "out_of_memory",  # the job ran out of GPU/host memory; the worker survived
    "peer_lost",  # the job's other process (its second GPU's) died or stopped answering; the worker survived
    "stalled",  # the job made no progress for too long; the worker was restarted
    "interrupted",  # the server was restarted while the job ran, too many times
    "unavailable",  # the worker cannot start (bad checkpoint, ...)
    "internal",  # a bug in the server
    "out_of_order",  # a live job's pose batch is not the next one (its `seq`); the expected one is named
    "job_over",  # a pose batch or `end` for a live job that has ended (finished, failed, cancelled, or ended)
    "live_deadline",  # a live job ended by its time limit (the time the model waited for its poses); chunks kept
    "live_gap",  # a live job ended by the longest wait for its next pose batch; its chunks so far are kept
)

JPEG_MAGIC, PNG_MAGIC = episode.JPEG_MAGIC, episode.PNG_MAGIC
_ID_RE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,64}\Z")
MIB = 1 << 20


class ProtocolError(ValueError):
    """A message that breaks the protocol; `code` is the wire error code."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps on everything the network can declare. Checked before anything is allocated."""

    max_header_bytes: int = 64 * 1024
    max_data_frames: int = 4
    max_image_bytes: int = 32 * MIB
    max_poses: int = 4096
    max_prompt_bytes: int = 16 * 1024
    max_text_bytes: int = 4096  # error messages, names, phases
    max_video_bytes: int = 1024 * MIB  # a result mp4 (client side)
    max_chunk_bytes: int = 64 * MIB  # one streamed chunk's mp4 (model = fast; 12 frames)
    max_result_frames_bytes: int = 2048 * MIB  # optional decoded frames of a result (client side)
    # Generation settings: a request may not ask for more work than this.
    max_frame_num: int = 161
    max_steps: int = 100
    max_area: int = 720 * 1280

    @property
    def max_request_frame_bytes(self) -> int:
        """The largest single ZeroMQ frame a server accepts (its ZMQ_MAXMSGSIZE)."""
        return max(self.max_header_bytes, self.max_image_bytes, self.max_poses * 16 * 8)

    @property
    def max_reply_frame_bytes(self) -> int:
        """The largest single ZeroMQ frame a client accepts (its ZMQ_MAXMSGSIZE)."""
        return max(self.max_header_bytes, self.max_video_bytes, self.max_result_frames_bytes)


@dataclasses.dataclass
class Message:
    """One decoded message: the header fields, plus named arrays and blobs from the data frames."""

    type: str
    fields: dict[str, Any]
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    blobs: dict[str, bytes] = dataclasses.field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(
    type_: str,
    fields: dict[str, Any] | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    blobs: dict[str, bytes] | None = None,
) -> list[bytes | memoryview]:
    """Header + data frames for one message (arrays are sent little-endian, C order)."""
    descriptors, data = [], []
    for name, array in (arrays or {}).items():
        array = np.asarray(array)
        wire = next((n for n, dt in DTYPES.items() if dt == array.dtype.newbyteorder("<")), None)
        if wire is None:
            raise ProtocolError(f"array {name!r}: dtype {array.dtype} is not one of {sorted(DTYPES)}")
        array = np.ascontiguousarray(array, dtype=DTYPES[wire])
        descriptors.append({"name": name, "kind": "array", "dtype": wire, "shape": list(array.shape)})
        data.append(memoryview(array).cast("B") if array.size else b"")  # (no view casts a shape with a 0)
    for name, blob in (blobs or {}).items():
        descriptors.append({"name": name, "kind": "blob", "size": len(blob)})
        data.append(blob)
    header = {"v": PROTOCOL_VERSION, "type": type_, **(fields or {})}
    if descriptors:
        header["frames"] = descriptors
    return [msgpack.packb(header, use_bin_type=True), *data]


def error_frames(code: str, message: str, rid: str | None = None, job: str | None = None) -> list:
    """An `error` message (messages are cut to a sane length so they always fit the caps)."""
    fields: dict[str, Any] = {"code": code, "message": message[:2000]}
    if rid is not None:
        fields["rid"] = rid
    if job is not None:
        fields["job"] = job
    return encode("error", fields)


# ---------------------------------------------------------------------------------------------
# Field schemas: (type name, required). Unknown header keys are ignored (minor additions within a
# protocol version); missing or wrongly typed known keys are refused.

ID, TEXT, PROMPT, INT, COUNT, NUMBER, BOOL, MAP, NUM_PAIR = (
    "id",
    "text",
    "prompt",
    "int",
    "count",
    "number",
    "bool",
    "map",
    "num_pair",
)

REQUESTS: dict[str, dict[str, tuple[str, bool]]] = {
    "submit": {
        "rid": (ID, True),
        "client": (ID, False),
        "prompt": (PROMPT, True),
        "settings": (MAP, False),
        "want_frames": (BOOL, False),
        "want_chunks": (BOOL, False),  # stream each finished chunk (model = fast) as a `chunk` message
        "want_stills": (BOOL, False),  # with want_chunks: each `chunk` also carries `still` (a small PNG)
        "name": (TEXT, False),
    },
    "cancel": {"rid": (ID, True), "job": (ID, True)},
    "status": {"rid": (ID, True), "job": (ID, True)},
    "watch": {
        "rid": (ID, True),
        "job": (ID, True),
        # this connection also gets the job's `chunk`s (and stills) from now on: a client that asked
        # for them at submit re-asks on every heartbeat, so a reconnect or a server restart keeps them
        "want_chunks": (BOOL, False),
        "want_stills": (BOOL, False),
    },
    "health": {"rid": (ID, True)},
    # live jobs (bridge/server/live_jobs.py): open with the first frame, then append pose batches, then end
    "live": {
        "rid": (ID, True),
        "live_v": (COUNT, True),
        "client": (ID, False),
        "prompt": (PROMPT, True),
        "settings": (MAP, False),
        "want_stills": (BOOL, False),  # each `chunk` also carries `still` (a small PNG)
        "name": (TEXT, False),
    },
    "poses": {"rid": (ID, True), "job": (ID, True), "seq": (COUNT, True), "end": (BOOL, False)},
    "end": {"rid": (ID, True), "job": (ID, True)},
    # start again every worker given up on (a configuration error, or max_start_failures in a row)
    "reload": {"rid": (ID, True)},
}
REPLIES: dict[str, dict[str, tuple[str, bool]]] = {
    "accepted": {"rid": (ID, True), "job": (ID, True), "queue_position": (COUNT, True)},
    "progress": {
        "job": (ID, True),
        "phase": (TEXT, True),
        "step": (COUNT, True),
        "total": (COUNT, True),
        "eta_s": (NUMBER, False),
        "queue_position": (COUNT, False),
    },
    "chunk": {  # one finished part of the video, in order, before the result (asked for by want_chunks)
        "job": (ID, True),
        "chunk_v": (COUNT, True),
        "index": (COUNT, True),
        "total": (COUNT, True),
        "frame_count": (COUNT, True),  # video frames in this chunk ("frames" is the header's frame list)
        "live": (MAP, False),  # a live job's chunk: its poses and timings (docs/protocol.md, "Live jobs")
    },
    "poses_ok": {  # a live job's pose batch is on disk (or was already: a retried seq)
        "rid": (ID, True),
        "job": (ID, True),
        "seq": (COUNT, True),
        "poses": (COUNT, True),  # poses the job holds now
        "chunks_ready": (COUNT, True),  # chunks whose poses are all held
        "chunks_sent": (COUNT, True),  # chunks made and sent
        "behind": (COUNT, True),  # chunks_ready - chunks_sent: how far the model is behind the poses
        "ended": (BOOL, True),  # no more poses are taken
    },
    # `error`: a live job ended by a limit (`live_gap`, `live_deadline`); its video is its chunks so far
    "result": {"job": (ID, True), "seconds": (NUMBER, False), "provenance": (MAP, False), "error": (MAP, False)},
    "error": {"code": (TEXT, True), "message": (TEXT, True), "rid": (ID, False), "job": (ID, False)},
    "status": {
        "rid": (ID, True),
        "job": (ID, True),
        "state": (TEXT, True),
        "queue_position": (COUNT, False),
        "phase": (TEXT, False),
        "step": (COUNT, False),
        "total": (COUNT, False),
        "eta_s": (NUMBER, False),
        "error": (MAP, False),
    },
    "health": {"rid": (ID, True), "ok": (BOOL, True), "reason": (TEXT, False)},  # plus maps (model, queue, ...)
    "reloaded": {"rid": (ID, True), "restarted": (COUNT, True)},  # workers started again by `reload`
}


@dataclasses.dataclass(frozen=True)
class FrameSpec:
    """What one named data frame of a message type may be."""

    kind: str  # "array" | "blob"
    required: bool
    dtypes: tuple[str, ...] = ()
    shape: tuple[int | None, ...] = ()  # None: variable, bounded by `max_rows`
    max_rows: str = ""  # Limits attribute bounding the variable dims
    max_bytes: str = ""  # Limits attribute bounding the frame's bytes


FRAMES: dict[str, dict[str, FrameSpec]] = {
    "submit": {
        "image": FrameSpec("blob", True, max_bytes="max_image_bytes"),
        "poses": FrameSpec("array", True, ("float32", "float64"), (None, 4, 4), "max_poses"),
        "intrinsics": FrameSpec("array", True, ("float32", "float64"), (None, 4), "max_poses"),
    },
    "chunk": {
        "video": FrameSpec("blob", True, max_bytes="max_chunk_bytes"),
        # PNG of the chunk's last frame (contracts.video.still_png), only for a submit with want_stills:
        # a client that never asked never meets this frame name (older decoders refuse unknown frames)
        "still": FrameSpec("blob", False, max_bytes="max_image_bytes"),
    },
    "live": {
        "image": FrameSpec("blob", True, max_bytes="max_image_bytes"),
        "intrinsics": FrameSpec("array", True, ("float32", "float64"), (None, 4), "max_poses"),
    },
    "poses": {"poses": FrameSpec("array", True, ("float32", "float64"), (None, 4, 4), "max_poses")},
    "result": {
        "video": FrameSpec("blob", True, max_bytes="max_video_bytes"),
        "frames": FrameSpec("array", False, ("uint8",), (None, None, None, 3), max_bytes="max_result_frames_bytes"),
    },
}


# ---------------------------------------------------------------------------------------------
# Decoding


def decode_request(frames: Sequence[Any], limits: Limits = Limits()) -> Message:
    """A client -> server message, fully validated; raises ProtocolError."""
    return _decode(frames, limits, REQUESTS)


def decode_reply(frames: Sequence[Any], limits: Limits = Limits()) -> Message:
    """A server -> client message, fully validated; raises ProtocolError."""
    return _decode(frames, limits, REPLIES)


def peek_rid(frame: Any, limits: Limits = Limits()) -> str | None:
    """Best-effort request id of a (maybe broken) header, so even a refusal can be matched up."""
    try:
        header = _unpack_header(frame, limits)
        rid = header.get("rid")
        return rid if isinstance(rid, str) and _ID_RE.match(rid) else None
    except ProtocolError:
        return None


def _decode(frames: Sequence[Any], limits: Limits, schemas: dict[str, dict[str, tuple[str, bool]]]) -> Message:
    if len(frames) == 0:
        raise ProtocolError("empty message: expected a header frame")
    if len(frames) > 1 + limits.max_data_frames:
        raise ProtocolError(f"{len(frames)} frames; at most {1 + limits.max_data_frames}", "too_large")
    header = _unpack_header(frames[0], limits)
    version = header.get("v")
    # an integer: 1.0 == 1 == True in Python, and all three are refused but the integer
    if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise ProtocolError(
            f"protocol version {version!r} not supported (this side speaks {list(SUPPORTED_VERSIONS)})",
            "bad_version",
        )
    type_ = header.get("type")
    if not isinstance(type_, str) or type_ not in schemas:
        raise ProtocolError(f"unknown message type {type_!r:.40}; expected one of {sorted(schemas)}")
    fields = {"v": version, "type": type_}
    for key, (kind, required) in schemas[type_].items():
        if key not in header or header[key] is None:
            if required:
                raise ProtocolError(f"{type_}: missing field {key!r}")
            continue
        fields[key] = _check_field(type_, key, kind, header[key], limits)
    for key, value in header.items():  # free-form extras (health details ...) are kept as read
        if key not in fields and key != "frames":
            fields[key] = value
    arrays, blobs = _decode_frames(type_, header.get("frames"), frames[1:], limits)
    return Message(type_, fields, arrays, blobs)


def _unpack_header(frame: Any, limits: Limits) -> dict[str, Any]:
    try:
        view = memoryview(frame)
    except TypeError:
        raise ProtocolError("header frame is not a byte buffer") from None
    if view.nbytes > limits.max_header_bytes:
        raise ProtocolError(f"header of {view.nbytes} bytes; at most {limits.max_header_bytes}", "too_large")
    if view.nbytes == 0:
        raise ProtocolError("empty header frame")
    try:
        header = msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_header_bytes,
            max_bin_len=0,
            max_array_len=1024,
            max_map_len=256,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises ValueError, TypeError, ExtraData, StackError ...
        raise ProtocolError(f"header is not one msgpack map: {type(exc).__name__}: {exc}"[:300]) from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a {type(header).__name__}, not a map")
    return header


def _check_field(type_: str, key: str, kind: str, value: Any, limits: Limits) -> Any:
    where = f"{type_}.{key}"
    if kind == ID:
        if not isinstance(value, str) or not _ID_RE.match(value):
            raise ProtocolError(f"{where} must be 1-64 characters of [A-Za-z0-9._:@/+=-]")
    elif kind in (TEXT, PROMPT):
        cap = limits.max_prompt_bytes if kind == PROMPT else limits.max_text_bytes
        if not isinstance(value, str):
            raise ProtocolError(f"{where} must be a string")
        if len(value.encode("utf-8", "surrogatepass")) > cap:
            raise ProtocolError(f"{where} is longer than {cap} bytes", "too_large")
    elif kind in (INT, COUNT):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(f"{where} must be an integer")
        if kind == COUNT and not 0 <= value < 2**31:
            raise ProtocolError(f"{where} must be a count in [0, 2**31)")
    elif kind == NUMBER:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ProtocolError(f"{where} must be a finite number")
    elif kind == BOOL:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where} must be true or false")
    elif kind == MAP and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        raise ProtocolError(f"{where} must be a map with string keys")
    return value


def _decode_frames(
    type_: str, descriptors: Any, data: Sequence[Any], limits: Limits
) -> tuple[dict[str, np.ndarray], dict[str, bytes]]:
    specs = FRAMES.get(type_, {})
    descriptors = [] if descriptors is None else descriptors
    if not isinstance(descriptors, list):
        raise ProtocolError(f"{type_}.frames must be a list of frame descriptors")
    if len(descriptors) != len(data):
        raise ProtocolError(f"{type_}: header describes {len(descriptors)} data frames, got {len(data)}")
    arrays: dict[str, np.ndarray] = {}
    blobs: dict[str, bytes] = {}
    for descriptor, frame in zip(descriptors, data, strict=True):
        if not isinstance(descriptor, dict):
            raise ProtocolError(f"{type_}: a frame descriptor must be a map")
        name = descriptor.get("name")
        if not isinstance(name, str) or name not in specs:
            raise ProtocolError(f"{type_}: unexpected data frame {name!r:.40}; expected {sorted(specs)}")
        if name in arrays or name in blobs:
            raise ProtocolError(f"{type_}: data frame {name!r} appears twice")
        spec = specs[name]
        if descriptor.get("kind") != spec.kind:
            raise ProtocolError(f"{type_}.{name} must be kind {spec.kind!r}")
        try:
            view = memoryview(frame).cast("B")
        except TypeError:
            raise ProtocolError(f"{type_}.{name}: frame is not a byte buffer") from None
        if spec.kind == "blob":
            blobs[name] = _check_blob(type_, name, spec, descriptor, view, limits)
        else:
            arrays[name] = _check_array(type_, name, spec, descriptor, view, limits)
    for name, spec in specs.items():
        if spec.required and name not in arrays and name not in blobs:
            raise ProtocolError(f"{type_}: missing data frame {name!r}")
    return arrays, blobs


def _check_blob(type_: str, name: str, spec: FrameSpec, descriptor: dict, view: memoryview, limits: Limits) -> bytes:
    size = descriptor.get("size")
    cap = getattr(limits, spec.max_bytes)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ProtocolError(f"{type_}.{name}: size must be a non-negative integer")
    if size > cap:
        raise ProtocolError(f"{type_}.{name}: {size} bytes; at most {cap}", "too_large")
    if view.nbytes != size:
        raise ProtocolError(f"{type_}.{name}: header says {size} bytes, frame has {view.nbytes}")
    return view.tobytes()


def _check_array(
    type_: str, name: str, spec: FrameSpec, descriptor: dict, view: memoryview, limits: Limits
) -> np.ndarray:
    dtype_name = descriptor.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in spec.dtypes:
        raise ProtocolError(f"{type_}.{name}: dtype {dtype_name!r:.40} not allowed; use one of {list(spec.dtypes)}")
    shape = descriptor.get("shape")
    if not isinstance(shape, list) or len(shape) != len(spec.shape):
        raise ProtocolError(f"{type_}.{name}: shape must have {len(spec.shape)} dimensions like {_pattern(spec)}")
    max_rows = getattr(limits, spec.max_rows) if spec.max_rows else None
    for dim, expected in zip(shape, spec.shape, strict=True):
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise ProtocolError(f"{type_}.{name}: shape {shape!r:.80} has a dimension that is not a count")
        if expected is not None and dim != expected:
            raise ProtocolError(f"{type_}.{name}: shape {shape} does not match {_pattern(spec)}")
        if expected is None and max_rows is not None and dim > max_rows:
            raise ProtocolError(f"{type_}.{name}: {dim} rows; at most {max_rows}", "too_large")
    nbytes = DTYPES[dtype_name].itemsize * math.prod(shape)  # Python ints: no overflow
    cap = getattr(limits, spec.max_bytes) if spec.max_bytes else None
    if cap is not None and nbytes > cap:
        raise ProtocolError(f"{type_}.{name}: {nbytes} bytes declared; at most {cap}", "too_large")
    if view.nbytes != nbytes:
        raise ProtocolError(f"{type_}.{name}: shape {shape} {dtype_name} is {nbytes} bytes, frame has {view.nbytes}")
    if 0 in shape:
        raise ProtocolError(f"{type_}.{name}: empty array (shape {shape})")
    return np.frombuffer(view, dtype=DTYPES[dtype_name]).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Typed requests: what the server's handlers get, built only from a fully validated Message


@dataclasses.dataclass(frozen=True)
class Submit:
    rid: str
    prompt: str
    settings: dict[str, Any]  # overrides of the server's preset; checked by the server against its schema
    image: bytes
    image_format: str  # "jpeg" | "png", from the magic bytes
    poses: np.ndarray  # [N, 4, 4], finite
    intrinsics: np.ndarray  # [N, 4], finite, fx, fy > 0
    want_frames: bool = False
    want_chunks: bool = False
    want_stills: bool = False
    name: str | None = None
    client: str | None = None  # a label the client chose; never its identity (see docs/protocol.md)


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """`cancel`, `status` or `watch` of one job (a `watch` may ask for chunks and stills)."""

    type: str
    rid: str
    job: str
    want_chunks: bool = False
    want_stills: bool = False


@dataclasses.dataclass(frozen=True)
class Health:
    rid: str


@dataclasses.dataclass(frozen=True)
class Reload:
    rid: str


Request = Submit | JobRequest | Health | Reload  # live jobs' `live` and `poses`: bridge.wire.live_protocol


def parse_request(frames: Sequence[Any], limits: Limits = Limits()) -> Request | Message:
    """A client -> server message as a typed request; raises ProtocolError (with its code). A live
    job's `live` and `poses` come back as the validated Message (`bridge.wire.live_protocol` types them)."""
    message = decode_request(frames, limits)
    fields = message.fields
    if message.type == "health":
        return Health(fields["rid"])
    if message.type == "reload":
        return Reload(fields["rid"])
    if message.type in ("live", "poses"):
        return message
    if message.type != "submit":
        wants = (
            {k: bool(fields.get(k, False)) for k in ("want_chunks", "want_stills")} if message.type == "watch" else {}
        )
        return JobRequest(message.type, fields["rid"], fields["job"], **wants)
    image = message.blobs["image"]
    poses, intrinsics = message.arrays["poses"], message.arrays["intrinsics"]
    fmt = image_format(image)
    check_episode_arrays(poses, intrinsics)
    try:  # the episode's own rule (the spool writes it as prompt.txt): at the door, not mid-write
        prompt = episode.check_prompt(fields["prompt"], "submit.prompt")
    except EpisodeError as exc:
        raise ProtocolError(str(exc)) from None
    return Submit(
        rid=fields["rid"],
        prompt=prompt,
        settings=dict(fields.get("settings") or {}),
        image=image,
        image_format=fmt,
        poses=poses,
        intrinsics=intrinsics,
        want_frames=bool(fields.get("want_frames", False)),
        want_chunks=bool(fields.get("want_chunks", False)),
        want_stills=bool(fields.get("want_stills", False)),
        name=fields.get("name"),
        client=fields.get("client"),
    )


def _pattern(spec: FrameSpec) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in spec.shape) + "]"


# ---------------------------------------------------------------------------------------------
# Submit: the episode payload, checked the same way on both sides


def image_format(image: bytes) -> str:
    """'jpeg' or 'png' from the magic bytes (`contracts.episode`); ProtocolError for anything else."""
    try:
        return episode.image_format(image)
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None


def check_episode_arrays(poses: np.ndarray, intrinsics: np.ndarray) -> None:
    """The one episode validator (`contracts.episode`) at the door: rigid poses, [N, 4] or one row
    of positive-focal intrinsics. (How many poses a rollout needs is the engine's to say.)"""
    try:
        episode.check_action(
            poses,
            intrinsics,
            poses_name="poses (poses.npy)",
            intrinsics_name="intrinsics (intrinsics.npy)",
        )
    except EpisodeError as exc:
        raise ProtocolError(str(exc), "bad_input") from None
