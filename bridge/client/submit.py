"""Send one episode folder to a generation server, show its progress, write the rollout mp4.

    from bridge.client.submit import SubmitOptions, submit_episode
    mp4 = submit_episode(Path("episode_0001"), {"steps": 4}, SubmitOptions(timeout=30.0))

The smallest client of `bridge.client.client` (`lingbot-isaac submit` is its command line:
lingbot_cli/submit.py; the `replay` command does more: USD and HDF5 trajectories, many episodes).
Progress goes to stderr; an interrupt cancels the job on the server before it propagates.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bridge.client.client import Client
from bridge.client.client_errors import ServerUnavailable
from bridge.client.episode_payload import EpisodePayload
from bridge.client.follow import submit_and_follow
from bridge.client.job_events import Chunk, Progress
from bridge.client.reach import check_listening, explain_no_answer
from contracts import atomic, video
from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.episode import ROLLOUT_VIDEO, read_meta
from contracts.provenance import with_job, write_record
from contracts.settings import job_settings


@dataclasses.dataclass(frozen=True)
class SubmitOptions:
    """How one episode is sent and followed (the `submit` command's options but the settings)."""

    server: str = DEFAULT_ENDPOINT  # the server's endpoint
    out: Path | None = None  # where the mp4 goes (None: EPISODE/rollout.mp4)
    follow: bool = False  # model fast: rewrite `out` after each finished chunk
    timeout: float = REQUEST_TIMEOUT_S  # seconds for each request to the server
    wait: float | None = None  # give up on the job (and cancel it) after this many s without an event
    server_key: Path | None = None  # CurveZMQ: the server's public key file
    client_key: Path | None = None  # CurveZMQ: this client's secret key file


def submit_episode(episode: Path, flags: dict[str, Any], options: SubmitOptions) -> Path:
    """Submit `episode` with the settings `flags` over what episode.json asks for (the server's
    preset fills the rest), follow it to its end and write the mp4 and its provenance record;
    returns the mp4's path."""
    payload = EpisodePayload.from_dir(episode)
    # What the episode asks for (episode.json `generation`, e.g. the window's model) under the flags,
    # as `replay`, the demo and the Isaac window send it; the server's preset fills the rest.
    meta = read_meta(episode, len(payload.poses))
    settings = job_settings(meta.generation if meta else None, flags)
    out = options.out or episode / ROLLOUT_VIDEO
    growing = GrowingVideo(out) if options.follow else None

    def chunk(event: Chunk) -> None:
        growing.add(event)
        print(f"chunk {event.index + 1}/{event.total}: {out} has {growing.frames} frames", file=sys.stderr, flush=True)

    server = options.server
    check_listening(server)  # a closed port is said at once, with how to start a server
    with Client(
        server, timeout=options.timeout, server_key=options.server_key, client_key=options.client_key
    ) as client:
        try:
            job, result = submit_and_follow(
                client,
                payload,
                settings,
                on_progress=lambda event: print(describe(event), file=sys.stderr, flush=True),
                on_submitted=lambda job: print(
                    f"job {job.id} accepted ({job.queue_position} ahead)", file=sys.stderr, flush=True
                ),
                timeout=options.wait,
                on_chunk=chunk if growing is not None else None,
            )
        except ServerUnavailable as exc:
            raise explain_no_answer(server, exc) from None
    job_info = {"client": "submit", "id": job.id, "server": server, "server_seconds": result.seconds}
    record = with_job(result.provenance, job_info)
    if record is not None:  # the record first: a video never sits without its record
        write_record(out, record)
    atomic.write_bytes(out, result.video)
    return out


def describe(event: Progress) -> str:
    if event.phase == "queued":
        return f"queued: {event.queue_position} job(s) ahead"
    line = f"{event.phase} {event.step}/{event.total}" if event.total else event.phase
    return line + (f"  (about {event.eta_s:.0f} s left)" if event.eta_s else "")


class GrowingVideo:
    """`submit --follow`: after each chunk, `path` is rewritten (atomically) as one mp4 of every frame
    received so far, so a player can open it at any time; the final result replaces it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.chunks: list[np.ndarray] = []  # every frame received so far, uint8 [H, W, 3]
        self.frames = 0

    def add(self, chunk: Chunk) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "chunk.mp4"
            source.write_bytes(chunk.video)
            frames, fps = video.read_mp4(source)
        self.chunks.extend(frames)
        self.frames = len(self.chunks)
        video.write_mp4(self.path, self.chunks, fps=fps, durable=False, quick=True)  # a preview: the result replaces it
