"""The evaluation report over a whole dataset: every episode's comparison, summed up on one page.

`compare_dataset(dataset_dir, out_dir)` finds every episode folder under `dataset_dir` that has a
rollout (`rollout.mp4`, as `lingbot-isaac replay` writes it), compares each one
(`comparison.report.compare_episode`, into `out_dir/episodes/NAME/`; an episode whose report is
newer than its rollout is not compared again; episodes run in parallel processes, one a core, each
printed when it finishes), and writes:
- `dataset.json`: one row per episode with the numbers taken from its own `report.json`, the
  episodes that could not be compared and why, and the totals;
- `dataset.html`: one self-contained page (Jinja2 template `templates/dataset_report.html.j2`):
  totals, distributions across episodes (histograms), and the table of every episode, worst first,
  each linking to its own report.

"Worst" is the largest RotErr per frame of the whole-clip reconstruction (the camera control the
world model is asked to follow, `comparison.sfm_fidelity`); episodes whose rollout was not
reconstructed come first (their pairwise median rotation error (0,k), the fallback, orders them, no
estimate at all first); ties go to the lower PSNR.
"""

from __future__ import annotations

import html
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from comparison.episode_input import EpisodeError
from comparison.reconstruction import ReconstructionConfig
from comparison.report import (
    FRAME_RATE_NOTE,
    SCHEMA,
    TINY_NOTE,
    _jsonable,
    _stats,
    compare_episode,
    render_provenance_html,
)
from comparison.sfm_fidelity import headline
from comparison.svg_plot import histogram
from comparison.trajectory import EstimatorConfig
from comparison.video_io import VideoError
from contracts import atomic
from contracts.provenance import model_label

DATASET_SCHEMA = "lingbot-isaac/compare-dataset/1"
ROLLOUT = "rollout.mp4"
TEMPLATES = Path(__file__).with_name("templates")
# (key in a row, label, unit, digits) of the numbers shown per episode and summed up
METRICS = (
    ("rot_err_deg_per_frame", "RotErr per frame, whole clip", "degrees", 3),
    ("trans_err_per_frame", "TransErr per frame, whole clip", "m", 4),
    ("cam_mc_per_frame", "CamMC per frame, whole clip", "", 4),
    ("scale_vs_command", "scale vs command, whole clip", "", 3),
    ("registered_ratio", "registered frames, whole clip", "fraction", 2),
    ("psnr_db", "PSNR mean", "dB", 2),
    ("ssim", "SSIM mean", "", 4),
    ("rotation_error_deg", "pairwise rotation error (0,k) median", "degrees", 2),
    ("translation_error_deg", "pairwise translation-direction error (0,k) median", "degrees", 2),
    ("rotation_error_consecutive_deg", "pairwise rotation error (k-1,k) median", "degrees", 2),
)


def find_episodes(dataset_dir: str | Path) -> list[tuple[Path, Path]]:
    """(episode folder, rollout.mp4) of every episode under `dataset_dir` with a rollout, by path."""
    root = Path(dataset_dir)
    if not root.is_dir():
        raise EpisodeError(f"--dataset {root}: not a folder")
    found = [(video.parent, video) for video in root.rglob(ROLLOUT) if (video.parent / "poses.npy").is_file()]
    return sorted(found, key=lambda pair: str(pair[0].relative_to(root)))


def episode_row(report_json: Path, out_dir: Path) -> dict[str, Any]:
    """One table row from an episode's report.json (the numbers as that report has them)."""
    try:
        report = json.loads(report_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EpisodeError(f"{report_json}: not a readable report.json ({exc})") from exc
    if report.get("schema") != SCHEMA:
        raise EpisodeError(f"{report_json}: schema {report.get('schema')!r}, expected {SCHEMA!r}")
    rollout = report["camera_fidelity"]["rollout"]["summary"]
    control = (report["camera_fidelity"].get("sim_control") or {}).get("summary")
    record = report.get("provenance")
    image = report["image_metrics"]["summary"]
    first, consecutive = rollout["first_to_k"], rollout["consecutive"]
    whole = report["camera_fidelity"]["whole_clip"]
    numbers, control_numbers = headline(whole["rollout"]), headline(whole.get("control"))
    trials = whole["rollout"].get("trials") or []
    frames = whole["rollout"].get("frames") or report["compared_frames"]
    return {
        "whole_clip_status": whole["rollout"]["status"],
        "whole_clip_reason": whole["rollout"]["reason"],
        "rot_err_deg_per_frame": numbers.get("rot_err_deg_per_frame"),
        "trans_err_per_frame": numbers.get("trans_err_per_frame"),
        "cam_mc_per_frame": numbers.get("cam_mc_per_frame"),
        "scale_vs_command": numbers.get("scale_vs_command"),
        "registered_ratio": sum(t["registered"] for t in trials) / (len(trials) * frames) if trials else None,
        "control_rot_err_deg_per_frame": control_numbers.get("rot_err_deg_per_frame"),
        "control_trans_err_per_frame": control_numbers.get("trans_err_per_frame"),
        "seconds": report["timings"]["comparison"].get("total_s"),
        "episode": report["episode"]["name"],
        "path": report["episode"]["path"],
        "report_html": os.path.relpath(report_json.with_name("report.html"), out_dir),
        "report_json": os.path.relpath(report_json, out_dir),
        "model": report["model"],
        "made_by": model_label(record),
        "tiny_model": report["tiny_model"],
        "compared_frames": report["compared_frames"],
        "psnr_db": image["psnr_db"]["mean"],
        "ssim": image["ssim"]["mean"],
        "rotation_error_deg": first["rotation_error_deg"]["median"],
        "translation_error_deg": first["translation_error_deg"]["median"],
        "rotation_error_consecutive_deg": consecutive["rotation_error_deg"]["median"],
        "control_rotation_error_deg": control["first_to_k"]["rotation_error_deg"]["median"] if control else None,
        "estimation_pairs": first["pairs"] + consecutive["pairs"],
        "estimation_failures": first["failed"] + consecutive["failed"],
    }


def _worst_first(row: dict[str, Any]) -> tuple:
    whole, rotation, psnr = row["rot_err_deg_per_frame"], row["rotation_error_deg"], row["psnr_db"]
    return (
        whole is not None,
        -(whole or 0.0),
        rotation is not None,
        -(rotation or 0.0),
        psnr if psnr is not None else math.inf,
        row["episode"],
    )


def write_dataset_report(
    report_jsons: list[Path], out_dir: str | Path, not_compared: dict[str, str] | None = None,
    title: str | None = None, provenance: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """dataset.json + dataset.html over the episodes' report.json files; returns the HTML path."""
    out_dir = Path(out_dir)
    rows = sorted((episode_row(Path(p), out_dir) for p in report_jsons), key=_worst_first)
    not_compared = dict(not_compared or {})
    if not rows and not not_compared:
        raise EpisodeError("no episodes to report on")
    pairs = sum(r["estimation_pairs"] for r in rows)
    failures = sum(r["estimation_failures"] for r in rows)
    totals = {
        "episodes": len(rows) + len(not_compared),
        "compared": len(rows),
        "not_compared": len(not_compared),
        "compared_frames": sum(r["compared_frames"] for r in rows),
        "estimation_pairs": pairs,
        "estimation_failures": failures,
        "estimation_failure_rate": failures / pairs if pairs else None,
        "whole_clip_reconstructed": sum(r["whole_clip_status"] == "reconstructed" for r in rows),
        "seconds": sum(r["seconds"] or 0.0 for r in rows),
        "across_episodes": {key: _stats([r[key] for r in rows]) for key, *_ in METRICS},
    }
    tiny = any(r["tiny_model"] for r in rows)
    dataset = _jsonable(
        {
            "schema": DATASET_SCHEMA,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "title": title,
            "tiny_model": tiny,
            "order": "worst first: not reconstructed first (by the pairwise median rotation error (0,k), none "
            "first), then the largest whole-clip RotErr per frame; ties by lower PSNR",
            "totals": totals,
            "episodes": rows,
            "not_compared": not_compared,
            "provenance": provenance,
        }
    )
    atomic.write_json(out_dir / "dataset.json", dataset, indent=1)
    provenance_blocks = _provenance_blocks([Path(p) for p in report_jsons])
    plots = [
        histogram([r[key] for r in rows], label, f"{unit or label}, one value per episode", f"hist-{key}")
        for key, label, unit, _ in METRICS
    ]
    html_text = _environment().get_template("dataset_report.html.j2").render(
        dataset=dataset, metrics=METRICS, plots=plots, tiny_note=TINY_NOTE if tiny else None,
        provenance_blocks=provenance_blocks,
        frame_rate_note=FRAME_RATE_NOTE,
    )  # fmt: skip
    html_path = out_dir / "dataset.html"
    atomic.write_text(html_path, html_text)
    return html_path


def _provenance_blocks(report_jsons: list[Path]) -> list[str]:
    """What made the rollouts: one provenance block (the single report's own rendering) per model,
    from the first episode made by it, saying how many episodes it made."""
    groups: dict[str, list[dict | None]] = {}
    for path in report_jsons:
        record = json.loads(path.read_text()).get("provenance")
        groups.setdefault(model_label(record), []).append(record)
    total = len(report_jsons)
    return [render_provenance_html(records[0]) + f"<p class='sub'>{len(records)} of {total} episode(s): "
            f"{html.escape(label)}</p>" for label, records in groups.items()]  # fmt: skip


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )  # fmt: skip
    env.filters["num"] = _number
    return env


def _number(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _unique_name(folder: Path, root: Path, taken: set[str]) -> str:
    try:
        relative = folder.relative_to(root) if folder != root else Path(folder.name)
    except ValueError:
        relative = Path(folder.name)
    base = "__".join(relative.parts) or folder.name
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def compare_dataset(
    dataset_dir: str | Path | None,
    out_dir: str | Path,
    *,
    episodes: list[Path] | None = None,
    model: str | None = None,
    tiny_model: bool | None = None,
    estimator: EstimatorConfig | None = None,
    reconstruction: ReconstructionConfig | None = None,
    whole_clip: bool = True,
    progress: bool = True,
    provenance: dict[str, Any] | None = None,
    cores: int | None = None,
) -> Path:
    """Compare every episode of a dataset (resuming: up-to-date reports are kept) and write the
    dataset report; returns dataset.html. An episode that cannot be compared is listed with why.

    The episodes are those under `dataset_dir` with a rollout, or the given `episodes` folders
    (a replay's; one without a rollout is listed as not compared). Episodes run in parallel processes
    on up to `cores` cores (default: all this process may use; `parallel_plan`), each finished one
    printed with its time."""
    out_dir = Path(out_dir)
    not_compared: dict[str, str] = {}
    if episodes is not None:
        folders = [Path(f) for f in episodes]
        root = Path(os.path.commonpath([f.resolve() for f in folders])) if folders else Path(".")
        if len(folders) == 1:
            root = folders[0].resolve().parent
        found = []
        for folder in folders:
            if (folder / ROLLOUT).is_file():
                found.append((folder.resolve(), folder.resolve() / ROLLOUT))
            else:
                not_compared[str(folder)] = f"no {ROLLOUT} (the replay of this episode did not finish)"
        title = f"replay of {len(folders)} episode(s) under {root}"
    else:
        root = Path(dataset_dir)
        found = find_episodes(root)
        title = str(root)
        if not found:
            raise EpisodeError(f"--dataset {root}: no episode folder with a {ROLLOUT} under it "
                               "(run `lingbot-isaac replay` first)")  # fmt: skip
    todo, reports = [], []
    taken: set[str] = set()
    for episode, rollout in found:
        target = out_dir / "episodes" / _unique_name(episode, root, taken)
        report_json = target / "report.json"
        reports.append(report_json)
        if not (report_json.is_file() and report_json.stat().st_mtime >= rollout.stat().st_mtime):
            todo.append((episode, rollout, target))
    jobs, threads = parallel_plan(len(todo), cores)
    reconstruction = replace(reconstruction or ReconstructionConfig(), threads=threads)
    options = {"model": model, "tiny_model": tiny_model, "estimator": estimator, "reconstruction": reconstruction,
               "whole_clip": whole_clip}  # fmt: skip
    bar = _bar(len(found), progress)
    bar.update(len(found) - len(todo))  # up to date already
    if todo and progress:
        bar.write(f"compare: {len(todo)} episode(s), {jobs} at a time, COLMAP with {threads} thread(s) each",
                  file=sys.stderr)  # fmt: skip
    try:
        with _pool(jobs) as pool:
            running = {pool.submit(_compare_one, episode, rollout, target, options): (episode, target)
                       for episode, rollout, target in todo}  # fmt: skip
            for future in as_completed(running):
                episode, target = running[future]
                error, seconds, status = future.result()
                if error is not None:
                    not_compared[str(episode)] = error
                    reports.remove(target / "report.json")
                if progress:
                    bar.write(f"  {episode.name}: {error or f'whole clip {status}'} ({seconds:.0f} s)", file=sys.stderr)
                bar.update(1)
    finally:
        bar.close()
    return write_dataset_report(reports, out_dir, not_compared, title=title, provenance=provenance)


def available_cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parallel_plan(episodes: int, cores: int | None) -> tuple[int, int]:
    """(episodes at a time, COLMAP threads each) for `cores`: one episode a core, since COLMAP's mappers
    mostly run on one core (docs/benchmarks.md); with fewer episodes than cores, the spare cores go to
    their COLMAP threads (features and matching use them)."""
    cores = available_cores() if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores {cores}: at least 1")
    jobs = max(1, min(cores, episodes))
    return jobs, max(1, cores // jobs)


def _pool(jobs: int):
    # spawn, not fork: the parent may hold threads (the progress bar, OpenCV's); one episode per process
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))


def _compare_one(episode: Path, rollout: Path, target: Path, options: dict) -> tuple[str | None, float, str | None]:
    """One episode in a worker process: (why it could not be compared or None, seconds, whole-clip status)."""
    started = time.perf_counter()
    try:
        compare_episode(episode, rollout, target, **options)
    except (EpisodeError, VideoError, ValueError) as exc:
        return str(exc), time.perf_counter() - started, None
    report = json.loads((target / "report.json").read_text())
    status = ((report.get("camera_fidelity") or {}).get("whole_clip") or {}).get("status")
    return None, time.perf_counter() - started, status


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="episode", desc="compare", file=sys.stderr, disable=not enabled)
