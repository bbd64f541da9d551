"""The comparison report: sim frames vs world-model rollout of one episode, and a summary of many.

`compare_episode(episode_dir, rollout_mp4, out_dir)` writes into `out_dir`:
- `side_by_side.mp4`: sim | world model | difference, H.264, 16 fps;
- `report.json`: every number (per-frame PSNR/SSIM, every camera pair of the rollout and of the
  sim control), the rollout's provenance record, settings, timings;
- `report.html`: the page, rendered from the Jinja2 templates in `comparison/templates/`: inline
  CSS, SVG plots and small JPEG thumbnails; the videos are referenced by relative paths (the
  side-by-side beside the page), so the page stays small and works when its folder is moved;
- `thumbnail.jpg`: the first side-by-side frame, small, for the summary page;
and returns the HTML path. `write_summary(report_jsons, out_dir)` writes `summary.html` and
`summary.json` across episodes. `render_provenance_html(record)` is the block that opens every
report (what made the rollout, `contracts.provenance`), for other reports to reuse.

Frame mapping: rollout frame i is compared with sim frame i and pose i; both run at 16 fps
(LingBot's output rate, and the rate episodes are resampled to). Only the common frames are
compared. Common frame: both videos are compared at one size, the smaller of the two, each scaled
over its whole field of view (as the pipeline scales the first image: it never crops), with the
intrinsics scaled to that size for both; the report says what was done (`common_frame`).
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined

from comparison.episode_input import EpisodeError, read_episode_input
from comparison.metrics import SSIM_SIGMA, SSIM_WINDOW, psnr, resize_to, ssim
from comparison.reconstruction import ReconstructionConfig
from comparison.sfm_fidelity import evaluate_reconstruction, skipped
from comparison.side_by_side import DIFF_GAIN, compose_video
from comparison.svg_plot import Series, line_plot
from comparison.trajectory import EstimatorConfig, PairResult, TrajectoryResult, evaluate_trajectory
from comparison.video_io import DEFAULT_FPS, read_video, write_video
from contracts import atomic
from contracts.provenance import TINY_NOTE, is_random_weights, model_label, read_record, summary_rows

SCHEMA = "lingbot-isaac/compare-report/3"
SUMMARY_SCHEMA = "lingbot-isaac/compare-summary/1"
THUMBNAIL_COUNT = 8
THUMBNAIL_WIDTH = 208
POSTER_WIDTH = 624
FRAME_RATE_NOTE = (
    "Rollout frame i is compared with sim frame i and commanded pose i; both run at 16 fps. "
    "Only the frames common to the rollout, the sim frames and the poses are compared."
)
__all__ = [
    "SCHEMA",
    "SUMMARY_SCHEMA",
    "TINY_NOTE",
    "common_frame",
    "compare_episode",
    "render_provenance_html",
    "template_environment",
]


# ---------------------------------------------------------------- small helpers


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars to Python, tuples to lists, and NaN/inf to null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _jpeg_bytes(frame_rgb: np.ndarray, width: int | None = None, quality: int = 85) -> bytes:
    if width is not None and frame_rgb.shape[1] != width:
        height = max(1, round(frame_rgb.shape[0] * width / frame_rgb.shape[1]))
        frame_rgb = cv2.resize(frame_rgb, (width, height), interpolation=cv2.INTER_AREA)
    ok, buffer = cv2.imencode(".jpg", cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("OpenCV could not encode a JPEG thumbnail")
    return buffer.tobytes()


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _stats(values: list[float | None]) -> dict:
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if finite.size == 0:
        return {"count": 0, "mean": None, "median": None, "min": None, "max": None}
    return {
        "count": int(finite.size),
        "mean": float(finite.mean()),
        "median": float(np.median(finite)),
        "min": float(finite.min()),
        "max": float(finite.max()),
    }


def _fmt(value: Any, digits: int = 2) -> str:
    """A number for the page (the template escapes it): None as a dash, inf as the symbol."""
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.{digits}f}"
    return str(value)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False)


@functools.cache
def template_environment() -> Environment:
    """The Jinja2 environment of the reports (autoescaping, strict: a missing value is an error)."""
    env = Environment(
        loader=PackageLoader("comparison", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_fmt, pretty=_pretty, spread=_spread_text)
    env.globals.update(tiny_note=TINY_NOTE, provenance_rows=summary_rows)
    return env


def render_provenance_html(record: dict | None, note: str | None = None) -> str:
    """The "what made this rollout" block that opens every report, as HTML (for the dataset report too).
    Put `tiny_banner()` of `provenance.html.j2` above it when `is_random_weights(record)`."""
    module = template_environment().get_template("provenance.html.j2").module
    return str(module.provenance(record, note))


def common_frame(sim_hw: tuple[int, int] | None, rollout_hw: tuple[int, int]) -> dict[str, Any]:
    """The one frame both videos are compared in, and a sentence saying how each got there.

    The smaller of the two sizes, so each video is at most shrunk. Both are scaled over their whole
    field of view, never cropped: the pipeline scaled the sim's first frame that way to the model's
    size (the aspect follows the image, rounded to multiples of 16, so 832x480 becomes 832x464), and
    the intrinsics (480x832 convention) are scaled to the common size for both videos, so K matches
    the pixels of each."""
    rh, rw = rollout_hw
    if sim_hw is None:
        return {
            "size_hw": [rh, rw],
            "sim_hw": None,
            "rollout_hw": [rh, rw],
            "method": "as generated",
            "description": f"No sim frames: the rollout is analysed at its own {rw}x{rh}.",
        }
    sh, sw = sim_hw
    h, w = (rh, rw) if rh * rw <= sh * sw else (sh, sw)

    def how(name: str, hw: tuple[int, int]) -> str:
        if tuple(hw) == (h, w):
            return f"the {name} ({hw[1]}x{hw[0]}) as it is"
        sy, sx = h / hw[0], w / hw[1]
        return f"the {name} ({hw[1]}x{hw[0]}) scaled by {sx:.4g} horizontally and {sy:.4g} vertically"

    text = f"Compared in a common {w}x{h} frame: {how('sim', (sh, sw))}, {how('rollout', (rh, rw))}"
    text += (
        "; whole frames are scaled (the field of view is kept, nothing is cropped, as the pipeline scaled the "
        "first frame), and the intrinsics are scaled to this frame for both videos."
    )
    aspect = (rh / rw) / (sh / sw) - 1.0
    if abs(aspect) > 1e-6:
        text += (
            f" The two aspects differ by {abs(aspect):.1%}: the model's size follows the image's aspect "
            "rounded to multiples of 16 (the reference's rounding), so pixels of the rollout are not square "
            "in the sim's terms; PSNR/SSIM and the camera estimator see both videos in the same geometry."
        )
    return {
        "size_hw": [h, w],
        "sim_hw": [sh, sw],
        "rollout_hw": [rh, rw],
        "method": "scale both, keep K consistent",
        "sim_scale_yx": [h / sh, w / sw],
        "rollout_scale_yx": [h / rh, w / rw],
        "description": text,
    }


def _to_frame(frames: np.ndarray, hw: list[int]) -> np.ndarray:
    if tuple(frames.shape[1:3]) == tuple(hw):
        return frames
    return np.stack([resize_to(frame, hw[0], hw[1]) for frame in frames])


# ---------------------------------------------------------------- one episode


def compare_episode(
    episode_dir: str | Path,
    rollout_mp4: str | Path,
    out_dir: str | Path,
    *,
    model: str | None = None,
    tiny_model: bool | None = None,
    settings: dict | None = None,
    timings: dict | None = None,
    estimator: EstimatorConfig | None = None,
    reconstruction: ReconstructionConfig | None = None,
    whole_clip: bool = True,
) -> Path:
    """Compare an episode's sim frames and poses with a rollout video; returns the HTML report path.

    Camera fidelity is measured twice: by whole-clip reconstruction (`comparison.sfm_fidelity`, with
    `reconstruction`'s settings; `whole_clip=False` skips it) and by the pairwise estimator
    (`comparison.trajectory`, `estimator`), the fallback where the reconstruction fails.

    What made the rollout comes from its provenance record (`rollout.json` beside `rollout.mp4`,
    `contracts.provenance`): the model, every setting, versions, and the "tiny-model output is noise"
    banner for random weights. `model`, `tiny_model` (default: model == "tiny"), `settings` and
    `timings` describe a rollout without a record and win over the record where given; the banner is
    shown whenever the record or `tiny_model` says random weights.
    """
    started = time.perf_counter()
    clock: dict[str, float] = {}
    out_dir = Path(out_dir)
    episode = read_episode_input(episode_dir)
    rollout, rollout_fps = read_video(rollout_mp4)
    record, record_note = read_record(rollout_mp4)
    clock["read_inputs_s"] = time.perf_counter() - started
    if record:
        model = model if model is not None else model_label(record)
        settings = settings if settings is not None else record["settings"]
        if timings is None:
            timings = {
                **record["timings"],
                **{f"job_{k}": v for k, v in (record.get("job") or {}).items() if k in ("seconds", "server_seconds")},
            }
    tiny_model = is_random_weights(record) or (model == "tiny" if tiny_model is None else tiny_model)
    estimator = estimator or EstimatorConfig()

    sim = episode.sim_frames
    count = min(len(rollout), len(episode.poses), len(sim) if sim is not None else len(rollout))
    if count < 2:
        raise EpisodeError(
            f"only {count} common frame(s) between the rollout ({len(rollout)}), the poses "
            f"({len(episode.poses)}) and the sim frames; at least 2 are needed"
        )
    notes = [FRAME_RATE_NOTE] + ([record_note] if record_note else [])
    if record is None and record_note is None:
        notes.append("No provenance record (rollout.json) beside the rollout: what made it is unknown.")
    if abs(rollout_fps - DEFAULT_FPS) > 0.01:
        notes.append(f"The rollout video says {rollout_fps:g} fps, not 16: frames are still matched by index.")
    if len(rollout) != len(episode.poses):
        notes.append(f"The rollout has {len(rollout)} frames and the episode {len(episode.poses)} poses.")
    frame = common_frame(None if sim is None else sim.shape[1:3], rollout.shape[1:3])
    notes.append(frame["description"])
    model_frames = _to_frame(rollout[:count], frame["size_hw"])
    sim = None if sim is None else _to_frame(sim[:count], frame["size_hw"])

    # Image metrics on the common frames, in the common frame.
    tick = time.perf_counter()
    per_frame: list[dict] = []
    if sim is not None:
        for k in range(count):
            value = psnr(sim[k], model_frames[k])
            # identical frames: PSNR is +inf, which JSON cannot hold: null plus "identical": true
            per_frame.append(
                {
                    "frame": k,
                    "psnr_db": value if math.isfinite(value) else None,
                    "identical": not math.isfinite(value),
                    "ssim": ssim(sim[k], model_frames[k]),
                }
            )
    else:
        notes.append("The episode has no sim frames (sim.mp4 or frames/): only camera fidelity is reported.")
    clock["image_metrics_s"] = time.perf_counter() - tick

    tick = time.perf_counter()
    trajectory_model = evaluate_trajectory(model_frames, episode.poses, episode.intrinsics, estimator)
    clock["trajectory_rollout_s"] = time.perf_counter() - tick
    trajectory_control = None
    if sim is not None:
        tick = time.perf_counter()
        trajectory_control = evaluate_trajectory(sim, episode.poses, episode.intrinsics, estimator)
        clock["trajectory_sim_control_s"] = time.perf_counter() - tick
    tick = time.perf_counter()
    if whole_clip:
        reconstructed = evaluate_reconstruction(sim, model_frames, episode.poses, episode.intrinsics, reconstruction)
    else:
        reconstructed = skipped("whole-clip reconstruction switched off (--no-sfm)", sim is not None)
    clock["whole_clip_reconstruction_s"] = time.perf_counter() - tick
    notes += reconstructed.get("notes", [])

    tick = time.perf_counter()
    composed = compose_video(sim, model_frames)
    video_path = write_video(out_dir / "side_by_side.mp4", composed, fps=DEFAULT_FPS)
    atomic.write_bytes(out_dir / "thumbnail.jpg", _jpeg_bytes(composed[0], width=min(POSTER_WIDTH, composed.shape[2])))
    clock["side_by_side_video_s"] = time.perf_counter() - tick

    image_summary = {
        "psnr_db": {
            **_stats([row["psnr_db"] for row in per_frame]),
            "identical_frames": sum(row["identical"] for row in per_frame),
        },
        "ssim": _stats([row["ssim"] for row in per_frame]),
    }
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "episode": {
            "path": str(episode.path.resolve()),
            "name": episode.path.resolve().name,
            "prompt": episode.prompt,
            "meta": episode.meta,
            "poses": len(episode.poses),
            "sim_source": episode.sim_source,
            "sim_frames": None if episode.sim_frames is None else len(episode.sim_frames),
            "sim_size_hw": None if episode.sim_frames is None else list(episode.sim_frames.shape[1:3]),
        },
        "rollout": {
            "path": str(Path(rollout_mp4).resolve()),
            "frames": len(rollout),
            "size_hw": list(rollout.shape[1:3]),
            "fps": rollout_fps,
        },
        "provenance": record,
        "model": model,
        "tiny_model": tiny_model,
        "notes": ([TINY_NOTE] if tiny_model else []) + notes,
        "compared_frames": count,
        "frame_mapping": "rollout frame i <-> sim frame i <-> pose i, both at 16 fps",
        "common_frame": frame,
        "image_metrics": {
            "available": sim is not None,
            "method": {
                "psnr": "RGB, peak 255",
                "ssim": f"Gaussian window {SSIM_WINDOW}x{SSIM_WINDOW}, sigma {SSIM_SIGMA}, mean over RGB",
                "frame": frame["method"],
            },
            "summary": image_summary,
            "per_frame": per_frame,
        },
        "camera_fidelity": {
            "whole_clip": reconstructed,
            "pairwise_role": "the camera numbers"
            if reconstructed["status"] != "reconstructed"
            else "a second view (the fallback where the reconstruction fails)",
            "rollout": trajectory_model.to_dict(),
            "sim_control": None if trajectory_control is None else trajectory_control.to_dict(),
        },
        "settings": {"generation": settings, "difference_gain": DIFF_GAIN},
        "timings": {"generation": timings, "comparison": clock},
        "outputs": {
            "html": "report.html",
            "json": "report.json",
            "side_by_side_mp4": video_path.name,
            "thumbnail": "thumbnail.jpg",
        },
    }

    tick = time.perf_counter()
    thumbnails = []
    for k in sorted({round(x) for x in np.linspace(0, count - 1, min(count, THUMBNAIL_COUNT))}):
        thumbnails.append(
            (
                k,
                None if sim is None else _data_uri(_jpeg_bytes(sim[k], THUMBNAIL_WIDTH), "image/jpeg"),
                _data_uri(_jpeg_bytes(model_frames[k], THUMBNAIL_WIDTH), "image/jpeg"),
            )
        )
    poster = _data_uri((out_dir / "thumbnail.jpg").read_bytes(), "image/jpeg")
    clock["report_assets_s"] = time.perf_counter() - tick
    clock["total_s"] = time.perf_counter() - started

    report = _jsonable(report)
    atomic.write_bytes(out_dir / "report.json", json.dumps(report, indent=1).encode())
    html_path = out_dir / "report.html"
    rollout_href = Path(os.path.relpath(Path(rollout_mp4).resolve(), out_dir.resolve())).as_posix()
    page = render_episode_html(
        report, trajectory_model, trajectory_control, poster, thumbnails, rollout_href, record_note
    )
    atomic.write_bytes(html_path, page.encode())
    return html_path


# ---------------------------------------------------------------- HTML


def _pair_series(pairs: list[PairResult], key: str, label: str, color: str, dashed: bool = False) -> Series:
    return Series(
        label=label,
        xs=[p.j for p in pairs],
        ys=[getattr(p, key) for p in pairs],
        color=color,
        dashed=dashed,
        markers_at=[p.j for p in pairs if p.status != "ok"],
    )


def _camera_plots(model: TrajectoryResult, control: TrajectoryResult | None) -> list[str]:
    plots = []
    kinds = (("consecutive", "consecutive frames (k-1, k)"), ("first_to_k", "first frame to k (0, k)"))
    for kind, title_kind in kinds:
        for key, what, unit in (
            ("rotation_error_deg", "rotation", "degrees"),
            ("translation_error_deg", "translation-direction", "degrees"),
        ):
            series = [_pair_series(getattr(model, kind), key, "world model", "#d62728")]
            if control is not None:
                series.append(_pair_series(getattr(control, kind), key, "sim (control)", "#1f77b4", dashed=True))
            element_id = f"plot-{what.split('-')[0]}-{kind.replace('_', '-')}"
            plots.append(line_plot(series, f"{what} error, {title_kind}", "frame k", unit, element_id, y_min=0.0))
    return plots


def _whole_clip_plots(whole: dict, frames: int) -> list[str]:
    """Per-frame curves of the whole-clip reconstruction: rotation error, position error (fitted and
    anchored), world model against the control. None where the reconstruction failed."""
    xs = list(range(frames))
    sources = [("rollout", "world model", "#d62728", False), ("control", "sim (control)", "#1f77b4", True)]
    curves = {key: (whole.get(key) or {}).get("per_frame") or {} for key, *_ in sources}
    rotation = [Series(label, xs, curves[key].get("rotation_error_deg") or [None] * frames, color, dashed)
                for key, label, color, dashed in sources if whole.get(key)]  # fmt: skip
    position = [Series(label + ", after its Sim(3) fit", xs, curves[key].get("translation_error") or [None] * frames,
                       color, dashed) for key, label, color, dashed in sources if whole.get(key)]  # fmt: skip
    if curves["rollout"].get("anchored_translation_error"):
        position.append(
            Series(
                "world model, in the sim's metric frame", xs, curves["rollout"]["anchored_translation_error"], "#ff7f0e"
            )
        )
    return [
        line_plot(rotation, "rotation error vs command, relative to frame 0 (whole clip)", "frame", "degrees",
                  "plot-sfm-rotation", y_min=0.0),
        line_plot(position, "camera position error vs command (whole clip)", "frame", "metres",
                  "plot-sfm-position", y_min=0.0),
    ]  # fmt: skip


def _whole_clip_rows(whole: dict) -> list[dict]:
    rows = []
    for key, label in (("rollout", "world model"), ("control", "sim (control)")):
        section = whole.get(key)
        if section is None:
            continue
        trials = section.get("trials") or []
        rows.append(
            {
                "label": label,
                "status": section["status"],
                "reason": section.get("reason"),
                "s": section.get("summary") or {},
                "trials": f"{section.get('trials_reconstructed', 0)} of {len(trials)}",
                "registered": [t["registered"] for t in trials],
                "frames": section.get("frames"),
                "anchor_reasons": sorted({(t.get("anchored") or {}).get("reason") for t in trials} - {None}),
            }
        )
    return rows


def _spread_text(spread: dict | None, digits: int = 3) -> str:
    """mean ± std over the trials (the std only where there were several)."""
    if not spread:
        return "—"
    text = f"{spread['mean']:.{digits}f}"
    return text + (f" ± {spread['std']:.{digits}f}" if spread["trials"] > 1 else "")


def _cell(pair: PairResult | None, key: str) -> dict | None:
    if pair is None:
        return None
    return {"failed": pair.status != "ok", "reason": pair.reason or "", "value": getattr(pair, key)}


def render_episode_html(
    report: dict,
    model: TrajectoryResult,
    control: TrajectoryResult | None,
    poster: str,
    thumbnails: list[tuple[int, str | None, str]],
    rollout_href: str,
    provenance_note: str | None = None,
) -> str:
    """The HTML page of one episode's report (templates/episode.html.j2)."""
    from markupsafe import Markup

    episode, image = report["episode"], report["image_metrics"]
    sim_desc = "none"
    if episode["sim_source"] is not None:
        sim_h, sim_w = episode["sim_size_hw"]
        sim_desc = f"{episode['sim_frames']} frames {sim_w}x{sim_h} ({episode['sim_source']})"
    plots = []
    if image["available"]:
        frames = [row["frame"] for row in image["per_frame"]]
        plots.append(
            line_plot(
                [Series("PSNR", frames, [row["psnr_db"] for row in image["per_frame"]])],
                "PSNR, sim vs world model",
                "frame",
                "dB",
                "plot-psnr",
            )
        )
        plots.append(
            line_plot(
                [Series("SSIM", frames, [row["ssim"] for row in image["per_frame"]], "#2ca02c")],
                "SSIM, sim vs world model",
                "frame",
                "SSIM",
                "plot-ssim",
            )
        )
    whole = report["camera_fidelity"]["whole_clip"]
    plots += _whole_clip_plots(whole, report["compared_frames"])
    plots += _camera_plots(model, control)
    camera_rows = []
    for source, label in (("rollout", "world model"), ("sim_control", "sim (control)")):
        result = report["camera_fidelity"].get(source)
        for kind in ("consecutive", "first_to_k") if result else ():
            camera_rows.append({"label": label, "kind": kind.replace("_", "-"), "s": result["summary"][kind]})
    by_frame = {row["frame"]: row for row in image["per_frame"]}
    pairs = [{p.j: p for p in model.consecutive}, {p.j: p for p in model.first_to_k}]
    controls = [{p.j: p for p in control.consecutive}, {p.j: p for p in control.first_to_k}] if control else [{}, {}]
    frame_rows = []
    curves = [((whole.get(key) or {}).get("per_frame") or {}).get(curve) or []
              for curve in ("rotation_error_deg", "translation_error") for key in ("rollout", "control")]  # fmt: skip
    curves.append(((whole.get("rollout") or {}).get("per_frame") or {}).get("anchored_translation_error") or [])
    for k in range(report["compared_frames"]):
        row = by_frame.get(k, {})
        whole_cells = [curve[k] if k < len(curve) else None for curve in curves]
        cells = []
        for ours, theirs in zip(pairs, controls, strict=True):
            for key in ("rotation_error_deg", "translation_error_deg"):
                cells += [_cell(ours.get(k), key), _cell(theirs.get(k), key)]
        frame_rows.append(
            {
                "k": k,
                "identical": row.get("identical"),
                "psnr": row.get("psnr_db"),
                "ssim": row.get("ssim"),
                "whole": whole_cells,
                "cells": cells,
            }
        )
    return (
        template_environment()
        .get_template("episode.html.j2")
        .render(
            report=report,
            episode=episode,
            rollout=report["rollout"],
            image=image,
            frame=report["common_frame"],
            sim_desc=sim_desc,
            poster=poster,
            rollout_href=rollout_href,
            provenance_note=provenance_note,
            camera_rows=camera_rows,
            whole=whole,
            whole_rows=_whole_clip_rows(whole),
            plots=[Markup(plot) for plot in plots],
            thumbnails=thumbnails,
            frame_rows=frame_rows,
            feature=model.feature,
            estimator={"feature": model.feature, **report["camera_fidelity"]["rollout"]["config"]},
        )
    )


# ---------------------------------------------------------------- across episodes
