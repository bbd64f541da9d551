"""The pipe between the server's supervisor and the generation worker (`python -m worldgen.worker`).

Plain Python + msgpack, no zmq and no numpy: `worldgen.worker` imports this module and worldgen
must never import zmq. Each message is a 4-byte big-endian length followed by one msgpack map with
a "type" key; the worker reads them on stdin and writes them on stdout, and logs on stderr.

Supervisor -> worker
    load      {options}               first message: `contracts.engine_options.EngineOptions` as a
                                      dict; the worker loads its engine with them, then `ready`
    run       {job, episode_dir, output, settings, want_frames, frames_output, want_chunks, peer?}
                                      peer {address, token, device, name}: a two-GPU job of a pool;
                                      the job's unconditional passes run on that worker (`guide`)
    guide     {job, address, token}   be the second worker of another worker's two-GPU job: listen
                                      on `address` (a Unix socket), serve its unconditional passes
                                      until it closes, then `result` {job, guidance_steps} or `error`
    run       ... live_dir            a live job (model fast): its poses appear in `live_dir` as batch files
                                      (LIVE_BATCH_FILE, in order of seq) and LIVE_END_FILE once no more come
    live_poses {job, batches, ended}  a live job's folder has new batches (a nudge: the folder is the truth)
    cancel    {job}                   stop that job at the next progress call (denoising step)
    health    {id}                    answered by a `health` message with the same id
    shutdown  {}                      finish nothing, exit 0

Worker -> supervisor
    ready     {pid, model, device, load_s, ...}   the model is loaded; jobs may be sent
    fatal     {code, message}                     the worker cannot start (bad checkpoint ...); it then
                                                  exits with one of CONFIGURATION_EXITS when retrying cannot help
    progress  {job, phase, step, total}
    chunk     {job, index, total, path, frames, still?}  model fast, want_chunks: a finished chunk's mp4 in the
              job folder, and `still`, a PNG of its last frame beside it (contracts.video.still_png);
              a live job's adds `poses` (the poses it was made from) and `started_at` (time.time())
    live      {job, poses_needed, frames}   a live job's plan: the poses each chunk waits for
    result    {job, output, frames_output|None, seconds, frames}   frames: the count the mp4 must hold
    error     {job, code, message}                codes: ERROR_CODES below
    health    {id, state, job|None, ...}          `state` is "idle" or "busy"

The worker runs one job at a time; the supervisor sends `run` only after `ready` or after the
previous job's `result`/`error`.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack

# A worker message is a few paths and numbers; anything near this size is a bug or garbage.
MAX_MESSAGE_BYTES = 1 << 20
LENGTH = struct.Struct(">I")

TO_WORKER = ("load", "run", "guide", "live_poses", "cancel", "health", "shutdown")
FROM_WORKER = ("ready", "fatal", "progress", "chunk", "live", "result", "error", "health")

# A live job's pose feed in its spool folder: the server writes each batch atomically, then nudges.
LIVE_BATCH_FILE = "poses-{seq:06d}.npy"
LIVE_END_FILE = "end"

# Error codes a worker reports for a job (the server passes them on to the client).
ERROR_CODES = (
    "bad_input",  # worldgen.errors.InputError: the episode or settings cannot be generated
    "cancelled",  # a `cancel` arrived and the job stopped at its next step
    "out_of_memory",  # CUDA/host out of memory inside the job (the worker keeps running)
    "peer_lost",  # the job's other process (a two-GPU job's rank 1 or second worker) died or went silent
    "storage",  # the job's files cannot be written (disk full, read-only): the server requeues it
    "worker_error",  # any other exception inside the job
)
# Exit statuses of a worker that cannot start as configured: starting it again cannot help, so the
# supervisor does not retry them on a timer (only a `reload` request or a server restart does).
# Any other exit (a crash, a signal, the OOM killer, an unexpected load error) is transient: restarted
# with back-off.
EXIT_CONFIGURATION = 78  # sysexits' EX_CONFIG: a bad checkpoint, or engine options it cannot run
EXIT_MISSING_PACKAGE = 79  # a package the engine needs is not installed
EXIT_LOAD_FAILED = 3  # anything else while loading (transient as far as anyone knows)
CONFIGURATION_EXITS = {
    EXIT_CONFIGURATION: "a configuration error (checkpoint or engine options)",
    EXIT_MISSING_PACKAGE: "a missing package",
}
# guidance: a `guide` job's passes; poses: a live job waits for the poses of its next chunk
PHASES = ("text", "encode", "denoise", "decode", "write", "guidance", "poses")


class WorkerProtocolError(ValueError):
    """A worker pipe carried something that is not a well-formed message."""


def encode(message: dict[str, Any]) -> bytes:
    """One message as bytes: 4-byte big-endian length, then the msgpack map."""
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WorkerProtocolError(f"a worker message is a map with a 'type' (got {message!r:.80})")
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_MESSAGE_BYTES:
        raise WorkerProtocolError(f"worker message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return LENGTH.pack(len(body)) + body


def _unpack(body: bytes) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_MESSAGE_BYTES,
            max_bin_len=MAX_MESSAGE_BYTES,
            max_array_len=65536,
            max_map_len=4096,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WorkerProtocolError(f"undecodable worker message: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WorkerProtocolError(f"a worker message must be a map with a 'type' (got {message!r:.80})")
    return message


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    """Write and flush one message (blocking; the worker side uses this)."""
    stream.write(encode(message))
    stream.flush()


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """Read one message (blocking); None at a clean end of stream."""
    head = _read_exactly(stream, LENGTH.size)
    if head is None:
        return None
    (length,) = LENGTH.unpack(head)
    if length > MAX_MESSAGE_BYTES:
        raise WorkerProtocolError(f"worker message declares {length} bytes (max {MAX_MESSAGE_BYTES})")
    body = _read_exactly(stream, length)
    if body is None:
        raise WorkerProtocolError("worker pipe closed in the middle of a message")
    return _unpack(body)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    chunks, have = [], 0
    while have < n:
        chunk = stream.read(n - have)
        if not chunk:
            if have:
                raise WorkerProtocolError("worker pipe closed in the middle of a message")
            return None
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


class MessageBuffer:
    """Incremental decoder for a non-blocking reader: feed() bytes as they come, get messages.

    The supervisor reads the worker's stdout without blocking (its event loop also serves
    clients), so a message may arrive in pieces.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Append bytes; return the messages completed by them (maybe none)."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buffer)
            if length > MAX_MESSAGE_BYTES:
                raise WorkerProtocolError(f"worker message declares {length} bytes (max {MAX_MESSAGE_BYTES})")
            end = LENGTH.size + length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[LENGTH.size : end])
            del self._buffer[:end]
            messages.append(_unpack(body))
        return messages

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)
