"""`lingbot-isaac replay`: `lingbot_isaac.replay`, plus `--report DIR`: the dataset report at the end.

The replay itself lives in lingbot_isaac (it never imports torch or OpenCV); the report is
`comparison.dataset_report` (OpenCV). Only this command line joins the two, so neither package
imports the other. Its flags become a `lingbot_isaac.replay.ReplayOptions`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.engine_options import COMPUTE_CHOICES, FP8_HELP, MODELS
from contracts.settings import FIELD_BY_NAME
from lingbot_isaac import replay
from lingbot_isaac.sources.isaaclab_hdf5 import QUAT_ORDERS

__doc__ = replay.__doc__  # `lingbot-isaac replay --help` describes the replay


def _user_errors() -> tuple[type[BaseException], ...]:
    try:
        from comparison.episode_input import EpisodeError
        from comparison.video_io import VideoError
    except ImportError:  # the comparison extra is not installed: --report says so when used
        return ()
    return (EpisodeError, VideoError)


USER_ERRORS = (*replay.USER_ERRORS, *_user_errors())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _replay_arguments(parser)
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="when the replay is over, compare every replayed episode and write the dataset report "
        "(DIR/dataset.html, DIR/dataset.json; like `lingbot-isaac compare --dataset`)",
    )


def options_of(args: argparse.Namespace) -> replay.ReplayOptions:
    """The parsed flags as the replay's typed options (`--report` is this command's own)."""
    return replay.ReplayOptions(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(replay.ReplayOptions)}
    )


def run(args: argparse.Namespace) -> int:
    options = options_of(args)
    episodes, overrides = replay.prepare(options)
    if options.export_only:
        for folder in episodes:
            print(folder)
        return 0
    code = replay.replay_episodes(options, episodes, overrides)
    if args.report is not None:
        from comparison.dataset_report import compare_dataset

        html_path = compare_dataset(None, args.report, episodes=episodes, progress=not args.no_progress)
        print(f"dataset report: {html_path}", file=sys.stderr)
    return code


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lingbot_isaac.replay.ReplayOptions`, one flag each."""
    parser.add_argument(
        "sources",
        nargs="+",
        type=Path,
        metavar="SOURCE",
        help="episode folder (or its episode.json: `DIR/**/episode.json` replays a whole tree), USD or HDF5 file",
    )
    parser.add_argument(
        "--server", default=DEFAULT_ENDPOINT, help=f"the generation server's endpoint (default: {DEFAULT_ENDPOINT})"
    )
    parser.add_argument("--out", type=Path, help="write result folders here instead of beside the sources")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing results and exports (without it a rerun resumes: finished episodes are skipped)",
    )
    parser.add_argument("--export-only", action="store_true", help="write the episode folders, send nothing")
    photo = parser.add_argument_group("a real photo as the first frame (sim-to-real)")
    photo.add_argument(
        "--first-frame",
        type=Path,
        metavar="PHOTO",
        help="start every rollout from this photo (the real camera at the start pose) instead of the sim's "
        "first frame; centre-cropped and resized to the episode's frame. An episode folder given as SOURCE "
        "is left as it is: the result goes to <folder>-photo (or under --out)",
    )
    photo.add_argument(
        "--photo-intrinsics",
        metavar="FX,FY,CX,CY",
        help="the photo's pinhole intrinsics in its own pixels (default: it shows the sim camera's view)",
    )
    parser.add_argument(
        "--demos",
        default="all",
        help="Isaac Lab HDF5: which demos: all, successful (attribute success), or indices like 0-99 or 3,7,10-19",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="most jobs in flight at once, at most what the server takes from one client (its per-client "
        "queue plus its workers) (default: that most)",
    )
    source = parser.add_argument_group("files without a first frame or prompt (USD, HDF5)")
    source.add_argument("--image", type=Path, help="first frame (png/jpg); its size is the render resolution")
    source.add_argument("--prompt", help="text prompt (or --prompt-file)")
    source.add_argument("--prompt-file", type=Path, help="text prompt from a file")
    source.add_argument("--camera", help="camera prim path, recorder group or Isaac Lab camera name")
    source.add_argument("--resolution", help="WxH the intrinsics are for, if no --image gives it")
    source.add_argument(
        "--rate",
        type=float,
        help="Isaac Lab env step rate in Hz (1 / (sim.dt * decimation)) (default: none; "
        "a demo without time stamps needs it)",
    )
    source.add_argument(
        "--meters-per-unit",
        type=float,
        help="Isaac Sim recorder positions' stage unit in metres (1 metre stage, 0.01 centimetre stage) "
        "(default: from --stage, else the recorder's stage_snapshot.usd beside the file)",
    )
    source.add_argument(
        "--stage", type=Path, help="the USD stage an Isaac Sim recorder session was recorded on (for its units)"
    )
    source.add_argument(
        "--quat-order",
        choices=QUAT_ORDERS,
        help="quaternion order of an Isaac Lab dataset without a format_version mark: wxyz (Isaac Lab 2.x) "
        "or xyzw (3.x); default: [isaaclab] quat_order of config/isaac.toml",
    )
    gen = parser.add_argument_group("generation (default: the episode's settings, then the server's preset)")
    gen.add_argument(
        "--preset",
        help="send all settings of this [preset] of config/generation.toml: default = the reference's own 70 "
        "steps, shift 10 (exact); fast40 = 40 steps, shift 5 (approximate: 0.57x the time); tiny",
    )
    gen.add_argument(
        "--compute",
        choices=COMPUTE_CHOICES,
        help=FIELD_BY_NAME["compute"].help + ". " + FP8_HELP,
    )
    gen.add_argument(
        "--model",
        choices=MODELS,
        help="per job: base = the two experts with guidance; fast = LingBot-World-Fast (chunk by chunk, 4 steps; "
        "progress shows each finished chunk)",
    )
    gen.add_argument("--gpus", type=int, choices=(1, 2), help="per job: " + FIELD_BY_NAME["gpus"].help)
    gen.add_argument("--frame-num", type=int, help="frames to generate (4n+1)")
    gen.add_argument("--steps", type=int, help=FIELD_BY_NAME["steps"].help)
    gen.add_argument("--seed", type=int, help=FIELD_BY_NAME["seed"].help)
    gen.add_argument("--size", help="max area as H*W, e.g. 480*832")
    gen.add_argument("--guide-scale", help="one value or low,high")
    gen.add_argument("--shift", type=float, help="noise schedule shift")
    parser.add_argument(
        "--timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help=f"seconds for each request to the server (default: {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        help="cancel a job (and count it failed) after this many seconds without any progress from it "
        "(default: no limit while the server answers)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    live = parser.add_argument_group("live mode (model fast): poses streamed while the video is made")
    live.add_argument(
        "--live",
        action="store_true",
        help="replay each episode as a live stream: its poses are sent in batches as they were recorded, "
        "each chunk comes back as soon as its poses are there and its lag is printed (needs --model fast)",
    )
    live.add_argument(
        "--pace",
        type=float,
        default=1.0,
        help="--live: the recorded pace times this (default 1.0; 0: as fast as the server takes the poses)",
    )
