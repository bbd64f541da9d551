"""Send one episode folder to a generation server, show its progress, write the rollout mp4.

    lingbot-isaac submit EPISODE_DIR [--server ENDPOINT] [--out rollout.mp4]
    lingbot-isaac submit EPISODE_DIR --model fast --follow     # OUT grows chunk by chunk

The smallest command-line client of `bridge.client.client` (`bridge.client.submit.submit_episode`; the `replay`
command does more: USD and HDF5 trajectories, many episodes). Ctrl-C cancels the job on the server
before exiting.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.client.client_errors import JobFailed, PayloadError, RequestFailed, ServerUnavailable, Unauthorized
from bridge.client.submit import SubmitOptions, submit_episode
from bridge.wire.security import SecurityError
from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.engine_options import MODELS
from contracts.episode import EpisodeError
from contracts.settings import FIELD_BY_NAME, SettingsError

# Where a setting comes from when its flag is not given (`contracts.settings.job_settings`).
FROM_EPISODE = "(default: episode.json's `generation`, else the server's preset)"
USER_ERRORS = (PayloadError, EpisodeError, SettingsError, RequestFailed, JobFailed, ServerUnavailable, Unauthorized,
               SecurityError, TimeoutError)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("episode", type=Path, help="episode folder: poses.npy, intrinsics.npy, image.jpg, prompt.txt")
    parser.add_argument("--server", default=DEFAULT_ENDPOINT, help="the server's endpoint")
    parser.add_argument("--out", type=Path, help="where to write the mp4 (default: EPISODE/rollout.mp4)")
    parser.add_argument("--steps", type=int, help=FIELD_BY_NAME["steps"].help + " " + FROM_EPISODE)
    parser.add_argument("--frame-num", type=int, help="frames to generate, 4n+1 " + FROM_EPISODE)
    parser.add_argument("--size", help="max area as H*W, e.g. 480*832 " + FROM_EPISODE)
    parser.add_argument("--seed", type=int, help=FIELD_BY_NAME["seed"].help + " " + FROM_EPISODE)
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
    flags = {k: v for k, v in (("steps", args.steps), ("frame_num", args.frame_num), ("size", args.size),
                                ("seed", args.seed), ("model", args.model), ("gpus", args.gpus))
             if v is not None}  # fmt: skip
    options = SubmitOptions(server=args.server, out=args.out, follow=args.follow, timeout=args.timeout,
                            wait=args.wait, server_key=args.server_key, client_key=args.client_key)  # fmt: skip
    print(submit_episode(args.episode, flags, options))
    return 0
