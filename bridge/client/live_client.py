"""The client side of a live job (docs/protocol.md, "Live jobs"): open it with the first frame, then
append pose batches as the camera moves, then end it; chunks come back as `Chunk` events of its `Job`.

    from bridge.client.live_client import LiveJob
    live = LiveJob.open(client, image_bytes, prompt, intrinsics, {"model": "fast", "frame_num": 81})
    live.send_poses(poses_of_this_tick)      # -> PosesAck (held, chunks ready / sent, behind)
    ...
    live.end()
    for event in live.job.events(): ...      # Progress, Chunk (with .live timings) ..., Result

`send_poses` numbers the batches itself (`seq`), so a retried request (Lazy Pirate) is one batch on the
server; a `busy` answer (the poses run too far ahead of the model) is waited out when `wait_busy`.
`LiveChunks` keeps the chunks that arrived, in order and without repeats (a restarted server makes
them again), so that the frames made so far are at hand whatever ends the job.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from bridge.client.client_errors import RequestFailed
from bridge.client.client_job import Job, wanted
from bridge.client.episode_payload import settings_dict
from bridge.client.job_events import Chunk, EventCallback
from bridge.wire import protocol
from bridge.wire.protocol import ProtocolError
from contracts.settings import GenerationSettings

BUSY_RETRY_S = 0.2  # a refused batch (busy: too far ahead) is sent again after this


@dataclasses.dataclass(frozen=True)
class PosesAck:
    """The server's answer to a pose batch: what it holds now and how far behind the model is."""

    seq: int
    poses: int
    chunks_ready: int
    chunks_sent: int
    behind: int
    ended: bool


class LiveJob:
    """One live job of a `bridge.client.client.Client`."""

    def __init__(self, client, job: Job) -> None:
        self.client, self.job = client, job
        self.seq = 0
        self.sent_poses = 0
        self.busy_answers = 0
        self.lock = threading.Lock()

    @classmethod
    def open(
        cls,
        client,
        image: bytes,
        prompt: str,
        intrinsics: np.ndarray,
        settings: GenerationSettings | dict[str, Any] | None = None,
        *,
        want_stills: bool = False,
        name: str | None = None,
        on_event: EventCallback | None = None,
        timeout: float | None = None,
    ) -> LiveJob:
        """Open a live job (model fast; `frame_num` is its planned length: the most poses it takes).
        Raises RequestFailed (bad_settings for another model ...) or ServerUnavailable."""
        fields: dict[str, Any] = {"live_v": protocol.LIVE_VERSION, "client": client.client_id, "prompt": prompt,
                                  "settings": settings_dict(settings)}  # fmt: skip
        if want_stills:
            fields["want_stills"] = True
        if name:
            fields["name"] = name[:200]
        intrinsics = np.asarray(intrinsics, dtype=np.float32).reshape(-1, 4)[:1]
        wants = wanted(True, want_stills)
        job = client.call(
            "live", fields, {"intrinsics": intrinsics}, {"image": image},
            on_reply=lambda message: client.accepted_job(message, wants, on_event), timeout=timeout,
        )  # fmt: skip
        return cls(client, job)

    def send_poses(
        self, poses: np.ndarray, *, end: bool = False, wait_busy: bool = True, timeout: float | None = None
    ) -> PosesAck:
        """Append a batch [N, 4, 4] (camera-to-world, OpenCV axes); `end`: it is the last one. Returns
        once the server has it on disk. RequestFailed: out_of_order, job_over, bad_input, too_large,
        busy (with `wait_busy`, waited out until `timeout`)."""
        poses = np.ascontiguousarray(np.asarray(poses, dtype=np.float32).reshape(-1, 4, 4))
        deadline = time.monotonic() + (self.client.timeout if timeout is None else timeout)
        with self.lock:  # one batch at a time, in order
            while True:
                fields = {"job": self.job.id, "seq": self.seq}
                if end:
                    fields["end"] = True
                try:
                    ack = self._request("poses", fields, {"poses": poses}, deadline)
                except RequestFailed as exc:
                    if exc.code == "busy" and wait_busy and time.monotonic() + BUSY_RETRY_S < deadline:
                        self.busy_answers += 1
                        time.sleep(BUSY_RETRY_S)
                        continue
                    raise
                self.seq += 1
                self.sent_poses += len(poses)
                return ack

    def end(self, timeout: float | None = None) -> dict[str, Any]:
        """No more poses: the job makes the chunks whose poses it holds, then its result. Returns its status."""
        return self.client.call("end", {"job": self.job.id}, timeout=timeout)

    def cancel(self, timeout: float | None = None) -> dict[str, Any]:
        return self.client.cancel(self.job.id, timeout=timeout)

    def _request(self, type_: str, fields: dict, arrays: dict, deadline: float) -> PosesAck:
        def on_reply(message: protocol.Message) -> PosesAck:
            if message.type != "poses_ok":
                raise ProtocolError(f"expected 'poses_ok', got {message.type!r}")
            f = message.fields
            return PosesAck(f["seq"], f["poses"], f["chunks_ready"], f["chunks_sent"], f["behind"], f["ended"])

        timeout = max(0.1, deadline - time.monotonic())
        return self.client.call(type_, fields, arrays, on_reply=on_reply, timeout=timeout)


class LiveChunks:
    """The chunks of a job as they arrive (an event callback): in order of index, each once."""

    def __init__(self) -> None:
        self.chunks: dict[int, Chunk] = {}
        self.arrived_at: dict[int, float] = {}  # time.monotonic() of each chunk's arrival
        self.changed = threading.Condition()

    def __call__(self, event: Any) -> None:
        if isinstance(event, Chunk):
            with self.changed:
                if event.index not in self.chunks:
                    self.chunks[event.index] = event
                    self.arrived_at[event.index] = time.monotonic()
                self.changed.notify_all()

    def in_order(self) -> list[Chunk]:
        """The chunks from index 0 on, up to the first missing one."""
        out = []
        while len(out) in self.chunks:
            out.append(self.chunks[len(out)])
        return out
