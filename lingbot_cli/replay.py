"""`lingbot-isaac replay`: `lingbot_isaac.replay`, plus `--report DIR`: the dataset report at the end.

The replay itself lives in lingbot_isaac (it never imports torch or OpenCV); the report is
`comparison.dataset_report` (OpenCV). Only this command line joins the two, so neither package
imports the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lingbot_isaac import replay

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
    replay.add_arguments(parser)
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="when the replay is over, compare every replayed episode and write the dataset report "
        "(DIR/dataset.html, DIR/dataset.json; like `lingbot-isaac compare --dataset`)",
    )


def run(args: argparse.Namespace) -> int:
    episodes, overrides = replay.prepare(args)
    if args.export_only:
        for folder in episodes:
            print(folder)
        return 0
    code = replay.replay_episodes(args, episodes, overrides)
    if args.report is not None:
        from comparison.dataset_report import compare_dataset

        html_path = compare_dataset(None, args.report, episodes=episodes, progress=not args.no_progress)
        print(f"dataset report: {html_path}", file=sys.stderr)
    return code
