"""Send one episode folder to a generation server, show its progress, write the rollout mp4.

    lingbot-isaac submit EPISODE_DIR [--server ENDPOINT] [--out rollout.mp4]
    lingbot-isaac submit EPISODE_DIR --model fast --follow     # OUT grows chunk by chunk

The smallest command-line client of `bridge.client` (the `replay` command does more: USD and
HDF5 trajectories, many episodes). Ctrl-C cancels the job on the server before exiting.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from bridge.client import (
    DEFAULT_ENDPOINT,
    Chunk,
    Client,
    EpisodePayload,
    JobFailed,
    PayloadError,
    Progress,
    RequestFailed,
    ServerUnavailable,
    Unauthorized,
    submit_and_follow,
)
from bridge.reach import check_listening, explain_no_answer
from bridge.security import SecurityError
from contracts import atomic, video
from contracts.connection import REQUEST_TIMEOUT_S
from contracts.engine_options import MODELS
from contracts.episode import ROLLOUT_VIDEO, EpisodeError, read_meta
from contracts.provenance import with_job, write_record
from contracts.settings import FIELD_BY_NAME, SettingsError, job_settings

# Where a setting comes from when its flag is not given (`contracts.settings.job_settings`).
FROM_EPISODE = "(default: episode.json's `generation`, else the server's preset)"
USER_ERRORS = (PayloadError, EpisodeError, SettingsError, RequestFailed, JobFailed, ServerUnavailable, Unauthorized,
               SecurityError, TimeoutError)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("episode", type=Path, help="episode folder: poses.npy, intrinsics.npy, image.jpg, prompt.txt")
    parser.add_argument("--server", default=DEFAULT_ENDPOINT, help="the server's endpoint")
    parser.add_argument("--out", type=Path, help="where to write the mp4 (default: EPISODE/rollout.mp4)")
    parser.add_argument("--steps", type=int, help="denoising steps " + FROM_EPISODE)
    parser.add_argument("--frame-num", type=int, help="frames to generate, 4n+1 " + FROM_EPISODE)
    parser.add_argument("--size", help="max area as H*W, e.g. 480*832 " + FROM_EPISODE)
    parser.add_argument("--seed", type=int, help="random seed of the initial noise " + FROM_EPISODE)
    parser.add_argument("--model", choices=MODELS, help="base or fast (LingBot-World-Fast) " + FROM_EPISODE)
    parser.add_argument(
        "--gpus", type=int, choices=(1, 2), help="per job: " + FIELD_BY_NAME["gpus"].help + " " + FROM_EPISODE
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="model fast: write OUT as it grows, after each "
        "finished chunk (always a playable mp4 of every frame so far; the result replaces it)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help=f"seconds for each request to the server (default: {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        help="give up waiting for the job (and cancel it) after this many s without an event from it "
        "(default: wait as long as the server answers)",
    )
    parser.add_argument(
        "--server-key",
        type=Path,
        help="CurveZMQ: the server's public key file (server.key) (default: none, a plain loopback server)",
    )
    parser.add_argument(
        "--client-key",
        type=Path,
        help="CurveZMQ: this client's secret key file (NAME.key_secret) (default: none, a plain loopback server)",
    )


def run(args: argparse.Namespace) -> int:
    payload = EpisodePayload.from_dir(args.episode)
    flags = {k: v for k, v in (("steps", args.steps), ("frame_num", args.frame_num), ("size", args.size),
                                ("seed", args.seed), ("model", args.model), ("gpus", args.gpus))
             if v is not None}  # fmt: skip
    # What the episode asks for (episode.json `generation`, e.g. the window's model) under the flags,
    # as `replay`, the demo and the Isaac window send it; the server's preset fills the rest.
    meta = read_meta(args.episode, len(payload.poses))
    settings = job_settings(meta.generation if meta else None, flags)
    out = args.out or args.episode / ROLLOUT_VIDEO
    growing = GrowingVideo(out) if args.follow else None

    def chunk(event: Chunk) -> None:
        growing.add(event)
        print(f"chunk {event.index + 1}/{event.total}: {out} has {growing.frames} frames", file=sys.stderr, flush=True)

    check_listening(args.server)  # a closed port is said at once, with how to start a server
    with Client(args.server, timeout=args.timeout, server_key=args.server_key, client_key=args.client_key) as client:
        try:
            job, result = submit_and_follow(
                client,
                payload,
                settings,
                on_progress=lambda event: print(describe(event), file=sys.stderr, flush=True),
                on_submitted=lambda job: print(
                    f"job {job.id} accepted ({job.queue_position} ahead)", file=sys.stderr, flush=True
                ),
                timeout=args.wait,
                on_chunk=chunk if growing is not None else None,
            )
        except ServerUnavailable as exc:
            raise explain_no_answer(args.server, exc) from None
    job_info = {"client": "submit", "id": job.id, "server": args.server, "server_seconds": result.seconds}
    record = with_job(result.provenance, job_info)
    if record is not None:  # the record first: a video never sits without its record
        write_record(out, record)
    atomic.write_bytes(out, result.video)
    print(out)
    return 0


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
        video.write_mp4(self.path, self.chunks, fps=fps, durable=False)  # a preview: the result replaces it
