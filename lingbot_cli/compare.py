"""Compare sim frames with a world-model rollout: side-by-side video, PSNR/SSIM, camera fidelity, report.

`lingbot-isaac compare EPISODE_DIR [ROLLOUT_MP4] --out DIR` (default: the episode's own rollout.mp4)
writes DIR/report.html (self-contained),
DIR/report.json (every number) and DIR/side_by_side.mp4. Several episodes at once:
`--pair EPISODE_DIR ROLLOUT_MP4` (repeatable) writes one sub-folder per episode plus
DIR/summary.html and DIR/summary.json. A whole dataset: `--dataset DATASET_DIR` compares every
episode folder under it that has a rollout.mp4 (as `lingbot-isaac replay` leaves them) and writes
DIR/dataset.html and DIR/dataset.json (every episode worst first, distributions, totals). Rollout
frame i is compared with sim frame i and pose i (both 16 fps); see docs/comparison.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from comparison.episode_input import EpisodeError
from comparison.reconstruction import MAPPERS, ReconstructionConfig
from comparison.report import TINY_NOTE, compare_episode
from comparison.summary import write_summary
from comparison.trajectory import EstimatorConfig
from comparison.video_io import VideoError
from contracts.episode import ROLLOUT_VIDEO


class CompareUsageError(ValueError):
    """Command-line input that does not make sense (missing pair, unreadable settings file)."""


USER_ERRORS = (EpisodeError, VideoError, CompareUsageError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EstimatorConfig()
    parser.add_argument(
        "episode", nargs="?", type=Path, help="episode folder (poses.npy, intrinsics.npy, sim.mp4 or frames/)"
    )
    parser.add_argument(
        "rollout",
        nargs="?",
        type=Path,
        help=f"the world model's rollout mp4 for that episode (default: EPISODE_DIR/{ROLLOUT_VIDEO}, where "
        "replay, submit and demo leave it)",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        metavar=("EPISODE_DIR", "ROLLOUT_MP4"),
        default=[],
        help="one more episode and its rollout (repeatable); with several, a summary is written",
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        default=None,
        metavar="DATASET_DIR",
        help="compare every episode folder with a rollout.mp4 under DATASET_DIR and write "
        "one dataset report (dataset.html, dataset.json)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/compare"), help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--model",
        default=None,
        help="what generated the rollout, for a rollout without its provenance record "
        "(rollout.json beside it); default: the record's model",
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the rollout comes from the tiny random-weights model (implied by --model tiny and by "
        "a provenance record of random weights)",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="JSON file with the generation settings, for a rollout without its provenance record; "
        "default: the record's settings",
    )
    parser.add_argument(
        "--ransac-threshold-px",
        type=float,
        default=defaults.ransac_threshold_px,
        help="essential-matrix RANSAC threshold (pixels)",
    )
    parser.add_argument("--ratio", type=float, default=defaults.ratio, help="Lowe's ratio-test threshold")
    parser.add_argument("--max-features", type=int, default=defaults.max_features, help="features detected per frame")
    sfm = ReconstructionConfig()
    parser.add_argument("--no-sfm", action="store_true", help="skip the whole-clip reconstruction (pairwise only)")
    parser.add_argument(
        "--sfm-trials",
        type=int,
        default=sfm.trials,
        help="seeded reconstruction trials per episode (each maps the sim frames, then sim and rollout together)",
    )
    parser.add_argument(
        "--sfm-mapper",
        choices=MAPPERS,
        default=sfm.mapper,
        help=f"COLMAP's mapper (default {sfm.mapper}: GLOMAP's global mapper; incremental: COLMAP's, the old default)",
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=None,
        help="with --dataset: the cores to use (default: all this process may run on); episodes run in parallel, "
        "one a core",
    )
    parser.add_argument(
        "--sfm-timeout-s",
        type=float,
        default=sfm.timeout_s,
        help="time limit of the reconstruction per episode, features and matching included; trials not finished "
        "by then are dropped and the report says how many of --sfm-trials finished",
    )


def _reconstruction(args: argparse.Namespace) -> ReconstructionConfig:
    try:
        return ReconstructionConfig(trials=args.sfm_trials, mapper=args.sfm_mapper, timeout_s=args.sfm_timeout_s)
    except ValueError as exc:
        raise CompareUsageError(f"--sfm-*: {exc}") from exc


def _pairs(args: argparse.Namespace) -> list[tuple[Path, Path]]:
    pairs = [(Path(episode), Path(rollout)) for episode, rollout in args.pair]
    if args.episode is not None:
        rollout = args.rollout
        if rollout is None:  # the episode's own rollout, under the name replay gave it
            rollout = args.episode / ROLLOUT_VIDEO
            if not rollout.is_file():
                raise CompareUsageError(
                    f"{args.episode}: no {ROLLOUT_VIDEO} in it (replay, submit and demo write it there); "
                    "give the rollout as ROLLOUT_MP4 after EPISODE_DIR"
                )
        pairs.insert(0, (args.episode, rollout))
    if not pairs:
        raise CompareUsageError("nothing to compare: give EPISODE_DIR ROLLOUT_MP4 or --pair EPISODE_DIR ROLLOUT_MP4")
    return pairs


def _settings(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        settings = json.loads(path.read_text())
    except OSError as exc:
        raise CompareUsageError(f"{path}: cannot read the settings file ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise CompareUsageError(f"{path}: not valid JSON ({exc}); --settings takes a JSON object") from exc
    if not isinstance(settings, dict):
        raise CompareUsageError(f"{path}: expected a JSON object of generation settings")
    return settings


def _unique_names(pairs: list[tuple[Path, Path]]) -> list[str]:
    names, seen = [], set()
    for episode, _ in pairs:
        base = episode.resolve().name or "episode"
        name, n = base, 2
        while name in seen:
            name, n = f"{base}-{n}", n + 1
        seen.add(name)
        names.append(name)
    return names


def run(args: argparse.Namespace) -> int:
    if args.dataset is not None:
        return run_dataset(args)
    pairs = _pairs(args)
    settings = _settings(args.settings)
    tiny = args.tiny or args.model == "tiny"
    estimator = EstimatorConfig(
        max_features=args.max_features, ratio=args.ratio, ransac_threshold_px=args.ransac_threshold_px
    )
    reports, noise = [], tiny
    for (episode, rollout), name in zip(pairs, _unique_names(pairs), strict=True):
        out_dir = args.out if len(pairs) == 1 else args.out / name
        print(f"comparing {episode} with {rollout} ...", file=sys.stderr, flush=True)
        html_path = compare_episode(
            episode, rollout, out_dir, model=args.model, tiny_model=tiny, settings=settings, estimator=estimator,
            reconstruction=_reconstruction(args), whole_clip=not args.no_sfm,
        )  # fmt: skip
        reports.append(html_path)
        report = json.loads(html_path.with_name("report.json").read_text())
        noise |= bool(report["tiny_model"])
        clock = report["timings"]["comparison"]
        print(
            f"time:   {clock['total_s']:.1f} s (whole-clip reconstruction {clock['whole_clip_reconstruction_s']:.1f} s)"
        )
        print(f"report: {html_path}")
        print(f"json:   {html_path.with_name('report.json')}")
        print(f"video:  {html_path.with_name('side_by_side.mp4')}")
    if len(reports) > 1:
        summary = write_summary([path.with_name("report.json") for path in reports], args.out)
        print(f"summary: {summary}")
    if noise:  # the rollout's provenance record says random weights, or --tiny / --model tiny
        print(f"note: {TINY_NOTE}")
    return 0


def run_dataset(args: argparse.Namespace) -> int:
    from comparison.dataset_report import compare_dataset

    if args.cores is not None and args.cores < 1:
        raise CompareUsageError(f"--cores {args.cores}: give at least 1")
    if args.episode is not None or args.rollout is not None or args.pair:
        raise CompareUsageError(
            "--dataset compares every episode under its folder: give no EPISODE_DIR, ROLLOUT_MP4 or --pair with it"
        )
    estimator = EstimatorConfig(
        max_features=args.max_features, ratio=args.ratio, ransac_threshold_px=args.ransac_threshold_px
    )
    tiny = True if (args.tiny or args.model == "tiny") else None  # None: each rollout's rollout.json says
    html_path = compare_dataset(
        args.dataset, args.out, model=args.model, tiny_model=tiny, estimator=estimator, progress=not args.no_progress,
        reconstruction=_reconstruction(args), whole_clip=not args.no_sfm, cores=args.cores,
    )  # fmt: skip
    print(f"dataset report: {html_path}")
    print(f"json:           {html_path.with_name('dataset.json')}")
    return 0
