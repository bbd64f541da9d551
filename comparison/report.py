"""The comparison report: sim frames vs world-model rollout of one episode, and a summary of many.

`compare_episode(episode_dir, rollout_mp4, out_dir)` writes into `out_dir`:
- `side_by_side.mp4`: sim | world model | difference, H.264, 16 fps;
- `report.json`: every number (per-frame PSNR/SSIM, every camera pair of the rollout and of the
  sim control, settings, timings);
- `report.html`: one self-contained page (inline CSS and SVG plots, base64 thumbnails and, below
  `EMBED_VIDEO_LIMIT`, the video itself as a data URI; no external URL);
- `thumbnail.jpg`: the first side-by-side frame, small, for the summary page;
and returns the HTML path. `write_summary(report_jsons, out_dir)` writes `summary.html` and
`summary.json` across episodes.

Frame mapping: rollout frame i is compared with sim frame i and pose i; both run at 16 fps
(LingBot's output rate, and the rate episodes are resampled to). Only the common frames are
compared. For PSNR/SSIM the rollout is resized to the sim resolution; the camera estimator sees each
video at its own resolution with the intrinsics rescaled to it.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from comparison.episode_input import EpisodeError, read_episode_input
from comparison.metrics import SSIM_SIGMA, SSIM_WINDOW, psnr, resize_to, ssim
from comparison.side_by_side import DIFF_GAIN, compose_video
from comparison.svg_plot import Series, line_plot
from comparison.trajectory import EstimatorConfig, PairResult, TrajectoryResult, evaluate_trajectory
from comparison.video_io import DEFAULT_FPS, read_video, write_video
from contracts import atomic

SCHEMA = "lingbot-isaac/compare-report/1"
SUMMARY_SCHEMA = "lingbot-isaac/compare-summary/1"
EMBED_VIDEO_LIMIT = 40 * 2**20  # bytes; a larger side-by-side video is linked, not embedded
THUMBNAIL_COUNT = 8
THUMBNAIL_WIDTH = 208
TINY_NOTE = (
    "tiny-model output is noise: the 'tiny' preset has random weights, so its video shows nothing "
    "of the scene and its numbers only prove that the pipeline runs end to end."
)
FRAME_RATE_NOTE = (
    "Rollout frame i is compared with sim frame i and commanded pose i; both run at 16 fps. "
    "Only the frames common to the rollout, the sim frames and the poses are compared."
)


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
    ok, buffer = cv2.imencode(".jpg", cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR),
                              [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("OpenCV could not encode a JPEG thumbnail")
    return buffer.tobytes()


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _stats(values: list[float | None]) -> dict:
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if finite.size == 0:
        return {"count": 0, "mean": None, "median": None, "min": None, "max": None}
    return {"count": int(finite.size), "mean": float(finite.mean()), "median": float(np.median(finite)),
            "min": float(finite.min()), "max": float(finite.max())}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.{digits}f}"
    return html.escape(str(value))


# ---------------------------------------------------------------- one episode


def _read_rollout_info(rollout_mp4: Path) -> tuple[dict | None, str | None]:
    """The rollout's sidecar JSON (same name, .json) and a note when it cannot be used."""
    path = rollout_mp4.with_suffix(".json")
    if not path.is_file():
        return None, None
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path.name} beside the rollout is not readable JSON ({exc}); ignored."
    if not isinstance(info, dict):
        return None, f"{path.name} beside the rollout is not a JSON object; ignored."
    return info, None



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
) -> Path:
    """Compare an episode's sim frames and poses with a rollout video; returns the HTML report path.

    `model` names the generator (e.g. "tiny" or a checkpoint folder) for the header; `tiny_model`
    (default: model == "tiny") adds the "tiny-model output is noise" note; `settings` (generation
    settings) and `timings` (generation timings, seconds) are shown and saved as given. Where they
    are not given, they come from the rollout's sidecar (`rollout.json` beside `rollout.mp4`, as
    `lingbot-isaac replay` writes it) when there is one.
    """
    started = time.perf_counter()
    clock: dict[str, float] = {}
    out_dir = Path(out_dir)
    episode = read_episode_input(episode_dir)
    rollout, rollout_fps = read_video(rollout_mp4)
    rollout_info, info_note = _read_rollout_info(Path(rollout_mp4))
    clock["read_inputs_s"] = time.perf_counter() - started
    if rollout_info:
        model = model if model is not None else rollout_info.get("model")
        settings = settings if settings is not None else rollout_info.get("settings")
        if timings is None:
            timings = {key: rollout_info[key] for key in ("seconds", "server_seconds") if key in rollout_info}
    tiny_model = (model == "tiny") if tiny_model is None else tiny_model
    estimator = estimator or EstimatorConfig()

    sim = episode.sim_frames
    count = min(len(rollout), len(episode.poses), len(sim) if sim is not None else len(rollout))
    if count < 2:
        raise EpisodeError(
            f"only {count} common frame(s) between the rollout ({len(rollout)}), the poses "
            f"({len(episode.poses)}) and the sim frames; at least 2 are needed"
        )
    model_frames = rollout[:count]
    notes = [FRAME_RATE_NOTE] + ([info_note] if info_note else [])
    if abs(rollout_fps - DEFAULT_FPS) > 0.01:
        notes.append(f"The rollout video says {rollout_fps:g} fps, not 16: frames are still matched "
                     "by index.")
    if len(rollout) != len(episode.poses):
        notes.append(f"The rollout has {len(rollout)} frames and the episode {len(episode.poses)} poses.")

    # Image metrics on the common frames, rollout resized to the sim resolution.
    tick = time.perf_counter()
    per_frame: list[dict] = []
    if sim is not None:
        sim = sim[:count]
        sim_h, sim_w = sim.shape[1:3]
        resized = np.stack([resize_to(frame, sim_h, sim_w) for frame in model_frames])
        if resized.shape[1:3] != model_frames.shape[1:3]:
            notes.append(
                f"For PSNR/SSIM the rollout ({model_frames.shape[2]}x{model_frames.shape[1]}) is resized "
                f"to the sim resolution ({sim_w}x{sim_h})."
            )
        for k in range(count):
            value = psnr(sim[k], resized[k])
            # identical frames: PSNR is +inf, which JSON cannot hold: null plus "identical": true
            per_frame.append({"frame": k, "psnr_db": value if math.isfinite(value) else None,
                              "identical": not math.isfinite(value), "ssim": ssim(sim[k], resized[k])})
    else:
        resized = model_frames
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
    composed = compose_video(sim, resized)
    video_path = write_video(out_dir / "side_by_side.mp4", composed, fps=DEFAULT_FPS)
    thumbnail_path = out_dir / "thumbnail.jpg"
    atomic.write_bytes(thumbnail_path, _jpeg_bytes(composed[0], width=min(624, composed.shape[2])))
    clock["side_by_side_video_s"] = time.perf_counter() - tick

    image_summary = {
        "psnr_db": {**_stats([row["psnr_db"] for row in per_frame]),
                    "identical_frames": sum(row["identical"] for row in per_frame)},
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
            "sim_size_hw": None if sim is None else list(sim.shape[1:3]),
        },
        "rollout": {
            "path": str(Path(rollout_mp4).resolve()),
            "frames": len(rollout),
            "size_hw": list(rollout.shape[1:3]),
            "fps": rollout_fps,
            "info": rollout_info,
        },
        "model": model,
        "tiny_model": tiny_model,
        "notes": ([TINY_NOTE] if tiny_model else []) + notes,
        "compared_frames": count,
        "frame_mapping": "rollout frame i <-> sim frame i <-> pose i, both at 16 fps",
        "image_metrics": {
            "available": sim is not None,
            "method": {
                "psnr": "RGB, peak 255",
                "ssim": f"Gaussian window {SSIM_WINDOW}x{SSIM_WINDOW}, sigma {SSIM_SIGMA}, mean over RGB",
                "rollout_resized_to_sim": sim is not None,
            },
            "summary": image_summary,
            "per_frame": per_frame,
        },
        "camera_fidelity": {
            "rollout": trajectory_model.to_dict(),
            "sim_control": None if trajectory_control is None else trajectory_control.to_dict(),
        },
        "settings": {"generation": settings, "difference_gain": DIFF_GAIN},
        "timings": {"generation": timings, "comparison": clock},
        "outputs": {
            "html": "report.html", "json": "report.json", "side_by_side_mp4": "side_by_side.mp4",
            "thumbnail": "thumbnail.jpg",
        },
    }

    tick = time.perf_counter()
    thumbnails = []
    for k in sorted({round(x) for x in np.linspace(0, count - 1, min(count, THUMBNAIL_COUNT))}):
        thumbnails.append((
            k,
            None if sim is None else _data_uri(_jpeg_bytes(sim[k], THUMBNAIL_WIDTH), "image/jpeg"),
            _data_uri(_jpeg_bytes(resized[k], THUMBNAIL_WIDTH), "image/jpeg"),
        ))
    poster = _data_uri(_jpeg_bytes(composed[0]), "image/jpeg")
    video_bytes = video_path.stat().st_size
    video_src = (_data_uri(video_path.read_bytes(), "video/mp4") if video_bytes <= EMBED_VIDEO_LIMIT
                 else video_path.name)
    report["video_embedded"] = video_bytes <= EMBED_VIDEO_LIMIT
    clock["report_assets_s"] = time.perf_counter() - tick
    clock["total_s"] = time.perf_counter() - started

    report = _jsonable(report)
    atomic.write_bytes(out_dir / "report.json", json.dumps(report, indent=1).encode())
    html_path = out_dir / "report.html"
    atomic.write_bytes(html_path, render_episode_html(report, trajectory_model, trajectory_control,
                                                 poster, video_src, thumbnails).encode())
    return html_path


# ---------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222;
       max-width: 1400px; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 17px; margin: 28px 0 8px 0; }
.sub { color: #555; font-size: 13px; }
.warn { background: #fff3cd; border: 1px solid #e0b400; padding: 10px 14px; margin: 12px 0;
        font-weight: bold; }
.notes { font-size: 13px; color: #333; } .notes li { margin: 2px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f1f1f1; } td.l, th.l { text-align: left; }
td.failed { color: #b00020; }
video { max-width: 100%; background: #000; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #ddd; }
.thumbs { display: flex; flex-wrap: wrap; gap: 10px; }
.thumbs figure { margin: 0; font-size: 12px; text-align: center; }
.thumbs img { display: block; width: 208px; margin-bottom: 2px; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; overflow-x: auto; }
"""


def _pair_series(pairs: list[PairResult], key: str, label: str, color: str, dashed: bool = False) -> Series:
    return Series(label=label, xs=[p.j for p in pairs], ys=[getattr(p, key) for p in pairs], color=color,
                  dashed=dashed, markers_at=[p.j for p in pairs if p.status != "ok"])


def _camera_plots(model: TrajectoryResult, control: TrajectoryResult | None) -> list[str]:
    plots = []
    kinds = (("consecutive", "consecutive frames (k-1, k)"), ("first_to_k", "first frame to k (0, k)"))
    for kind, title_kind in kinds:
        for key, what, unit in (("rotation_error_deg", "rotation", "degrees"),
                                ("translation_error_deg", "translation-direction", "degrees")):
            series = [_pair_series(getattr(model, kind), key, "world model", "#d62728")]
            if control is not None:
                series.append(_pair_series(getattr(control, kind), key, "sim (control)", "#1f77b4",
                                           dashed=True))
            element_id = f"plot-{what.split('-')[0]}-{kind.replace('_', '-')}"
            plots.append(line_plot(series, f"{what} error, {title_kind}", "frame k", unit, element_id,
                                   y_min=0.0))
    return plots


def _camera_summary_rows(report: dict) -> str:
    rows = []
    fidelity = report["camera_fidelity"]
    for source, label in (("rollout", "world model"), ("sim_control", "sim (control)")):
        result = fidelity.get(source)
        if not result:
            continue
        for kind in ("consecutive", "first_to_k"):
            s = result["summary"][kind]
            rot, trans = s["rotation_error_deg"], s["translation_error_deg"]
            rows.append(
                f"<tr><td class='l'>{label}</td><td class='l'>{kind.replace('_', '-')}</td>"
                f"<td>{s['pairs']}</td><td>{s['failed']}</td>"
                f"<td>{_fmt(rot['median'])}</td><td>{_fmt(rot['mean'])}</td><td>{_fmt(rot['p90'])}</td>"
                f"<td>{_fmt(trans['median'])}</td><td>{_fmt(trans['mean'])}</td>"
                f"<td>{s['translation_undefined']}</td></tr>"
            )
    return "".join(rows)


def _cell(pair: PairResult | None, key: str) -> str:
    if pair is None:
        return "<td></td>"
    if pair.status != "ok":
        return f"<td class='failed' title='{html.escape(pair.reason or '')}'>failed</td>"
    return f"<td>{_fmt(getattr(pair, key))}</td>"


def render_episode_html(report: dict, model: TrajectoryResult, control: TrajectoryResult | None,
                        poster: str, video_src: str, thumbnails: list[tuple[int, str | None, str]]) -> str:
    """The self-contained HTML page of one episode's report."""
    episode, rollout = report["episode"], report["rollout"]
    name = episode["name"]
    image = report["image_metrics"]
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>lingbot-isaac comparison: {html.escape(name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Sim vs world model: {html.escape(name)}</h1>",
        f"<div class='sub'>model: <b>{_fmt(report['model'] or 'unknown')}</b> · episode: "
        f"{html.escape(episode['path'])} · rollout: {html.escape(rollout['path'])} · "
        f"{report['created']}</div>",
    ]
    if report["tiny_model"]:
        out.append(f"<div class='warn' id='tiny-model-note'>{html.escape(TINY_NOTE)}</div>")
    if episode["prompt"]:
        out.append(f"<p class='sub'>prompt: {html.escape(episode['prompt'])}</p>")
    out.append("<ul class='notes' id='notes'>")
    out += [f"<li>{html.escape(note)}</li>" for note in report["notes"] if note != TINY_NOTE]
    sim_desc = "none"
    if episode["sim_source"] is not None:
        sim_h, sim_w = episode["sim_size_hw"]
        sim_desc = f"{episode['sim_frames']} frames {sim_w}x{sim_h} ({episode['sim_source']})"
    out.append(f"<li>Compared frames: {report['compared_frames']} · rollout: {rollout['frames']} frames "
               f"{rollout['size_hw'][1]}x{rollout['size_hw'][0]} at {rollout['fps']:g} fps · "
               f"sim: {sim_desc} · poses: {episode['poses']}</li></ul>")

    out.append("<h2>Side by side: sim | world model | difference</h2>")
    out.append(f"<video id='side-by-side' controls loop muted playsinline preload='auto' poster='{poster}' "
               f"width='1260'><source src='{html.escape(video_src)}' type='video/mp4'></video>")
    out.append("<div class='sub'>The difference panel is the mean absolute RGB difference x"
               f"{report['settings']['difference_gain']:g}, inferno colour map (black = equal). "
               "File: side_by_side.mp4 beside this page.</div>")

    out.append("<h2>Summary</h2><table id='summary'>")
    out.append("<tr><th class='l'>image metric</th><th>mean</th><th>median</th><th>min</th><th>max</th></tr>")
    if image["available"]:
        for key, label in (("psnr_db", "PSNR (dB)"), ("ssim", "SSIM")):
            s = image["summary"][key]
            digits = 2 if key == "psnr_db" else 4
            if key == "psnr_db" and s["identical_frames"]:
                label += f" ({s['identical_frames']} identical frames: ∞, left out)"
            out.append(f"<tr><td class='l'>{label}</td><td>{_fmt(s['mean'], digits)}</td>"
                       f"<td>{_fmt(s['median'], digits)}</td><td>{_fmt(s['min'], digits)}</td>"
                       f"<td>{_fmt(s['max'], digits)}</td></tr>")
    else:
        out.append("<tr><td class='l' colspan='5'>no sim frames in the episode</td></tr>")
    out.append("</table><p></p><table id='camera-summary'>")
    out.append("<tr><th class='l'>frames</th><th class='l'>pairs</th><th>pairs</th><th>failed</th>"
               "<th>rot. err. median (°)</th><th>mean</th><th>p90</th><th>transl. dir. err. median (°)</th>"
               "<th>mean</th><th>transl. undefined</th></tr>")
    out.append(_camera_summary_rows(report) + "</table>")
    out.append("<div class='sub'>Camera fidelity: relative motion estimated from the frames "
               f"({model.feature} features, ratio test, essential matrix by RANSAC with the known "
               "intrinsics, cheirality check) against the commanded poses. The same estimator on the "
               "sim frames is the control: it shows how well the estimator itself does. Translation "
               "direction is undefined (—) where the commanded translation is about zero.</div>")

    out.append("<h2>Over time</h2><div class='plots'>")
    if image["available"]:
        frames = [row["frame"] for row in image["per_frame"]]
        out.append(line_plot([Series("PSNR", frames, [row["psnr_db"] for row in image["per_frame"]])],
                             "PSNR, sim vs world model", "frame", "dB", "plot-psnr"))
        out.append(line_plot([Series("SSIM", frames, [row["ssim"] for row in image["per_frame"]], "#2ca02c")],
                             "SSIM, sim vs world model", "frame", "SSIM", "plot-ssim"))
    out += _camera_plots(model, control)
    out.append("</div><div class='sub'>Crosses on the x axis mark pairs where estimation failed.</div>")

    out.append("<h2>Thumbnails</h2><div class='thumbs' id='thumbnails'>")
    for k, sim_uri, model_uri in thumbnails:
        sim_img = f"<img alt='sim frame {k}' src='{sim_uri}'>" if sim_uri else ""
        out.append(f"<figure>{sim_img}<img alt='world model frame {k}' src='{model_uri}'>"
                   f"<figcaption>frame {k}{' (sim above)' if sim_uri else ''}</figcaption></figure>")
    out.append("</div>")

    out.append("<h2>Per frame</h2><details open><summary>table</summary><table id='per-frame'>")
    out.append("<tr><th>frame</th><th>PSNR</th><th>SSIM</th><th>rot. err. (k-1,k)</th><th>control</th>"
               "<th>transl. err. (k-1,k)</th><th>control</th><th>rot. err. (0,k)</th><th>control</th>"
               "<th>transl. err. (0,k)</th><th>control</th></tr>")
    by_frame = {row["frame"]: row for row in image["per_frame"]}
    consecutive = {p.j: p for p in model.consecutive}
    first = {p.j: p for p in model.first_to_k}
    consecutive_c = {p.j: p for p in control.consecutive} if control else {}
    first_c = {p.j: p for p in control.first_to_k} if control else {}
    for k in range(report["compared_frames"]):
        row = by_frame.get(k, {})
        out.append(
            f"<tr><td>{k}</td><td>{'∞' if row.get('identical') else _fmt(row.get('psnr_db'))}</td>"
            f"<td>{_fmt(row.get('ssim'), 4)}</td>"
            + _cell(consecutive.get(k), "rotation_error_deg")
            + _cell(consecutive_c.get(k), "rotation_error_deg")
            + _cell(consecutive.get(k), "translation_error_deg")
            + _cell(consecutive_c.get(k), "translation_error_deg")
            + _cell(first.get(k), "rotation_error_deg") + _cell(first_c.get(k), "rotation_error_deg")
            + _cell(first.get(k), "translation_error_deg") + _cell(first_c.get(k), "translation_error_deg")
            + "</tr>"
        )
    out.append("</table></details>")

    out.append("<h2>Settings</h2><div id='settings'>")
    out.append(f"<p class='sub'>model: {_fmt(report['model'] or 'unknown')}</p>")
    out.append("<b>generation</b><pre>" + html.escape(json.dumps(report["settings"]["generation"], indent=1))
               + "</pre>")
    out.append("<b>camera estimator</b><pre>" + html.escape(json.dumps(
        {"feature": model.feature, **report["camera_fidelity"]["rollout"]["config"]}, indent=1)) + "</pre>")
    out.append("<b>episode.json</b><pre>" + html.escape(json.dumps(episode["meta"], indent=1))
               + "</pre></div>")
    out.append("<h2>Timings (seconds)</h2><div id='timings'><pre>"
               + html.escape(json.dumps(report["timings"], indent=1)) + "</pre></div>")
    out.append("<p class='sub'>Every number on this page is in report.json beside it.</p></body></html>")
    return "\n".join(out)


# ---------------------------------------------------------------- across episodes


def _summary_row(report_json: Path, out_dir: Path) -> dict:
    try:
        report = json.loads(report_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EpisodeError(f"{report_json}: not a readable report.json ({exc})") from exc
    if report.get("schema") != SCHEMA:
        raise EpisodeError(f"{report_json}: schema {report.get('schema')!r}, expected {SCHEMA!r}")
    fidelity = report["camera_fidelity"]
    control = fidelity.get("sim_control") or {}
    image = report["image_metrics"]["summary"]
    return {
        "episode": report["episode"]["name"],
        "report_html": os.path.relpath(report_json.parent / "report.html", out_dir),
        "report_json": os.path.relpath(report_json, out_dir),
        "model": report["model"],
        "tiny_model": report["tiny_model"],
        "compared_frames": report["compared_frames"],
        "psnr_db_mean": image["psnr_db"]["mean"],
        "ssim_mean": image["ssim"]["mean"],
        "rollout": fidelity["rollout"]["summary"],
        "sim_control": control.get("summary"),
        "per_pair_first_to_k": [p["rotation_error_deg"] for p in fidelity["rollout"]["first_to_k"]],
        "per_frame_psnr_db": [row["psnr_db"] for row in report["image_metrics"]["per_frame"]],
        "timings": report["timings"],
        "thumbnail": report_json.parent / report["outputs"]["thumbnail"],
    }


def write_summary(report_jsons: list[str | Path], out_dir: str | Path) -> Path:
    """Write summary.html and summary.json over several episodes' report.json; returns the HTML path."""
    out_dir = Path(out_dir)
    if not report_jsons:
        raise EpisodeError("no report.json files to summarize")
    rows = [_summary_row(Path(path), out_dir) for path in report_jsons]
    any_tiny = any(row["tiny_model"] for row in rows)

    def med(summary: dict | None, kind: str, key: str) -> float | None:
        return None if not summary else summary[kind][key]["median"]

    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>lingbot-isaac comparison summary</title>", f"<style>{_CSS}</style></head><body>",
        f"<h1>Sim vs world model: {len(rows)} episodes</h1>",
    ]
    if any_tiny:
        out.append(f"<div class='warn' id='tiny-model-note'>{html.escape(TINY_NOTE)}</div>")
    out.append(f"<ul class='notes'><li>{html.escape(FRAME_RATE_NOTE)}</li></ul>")
    out.append("<table id='summary'><tr><th class='l'>episode</th><th class='l'>model</th><th>frames</th>"
               "<th>PSNR mean</th><th>SSIM mean</th><th>rot. err. (0,k) median</th><th>control</th>"
               "<th>transl. err. (0,k) median</th><th>control</th><th>rot. err. (k-1,k) median</th>"
               "<th>control</th><th>failed pairs</th><th class='l'>thumbnail</th></tr>")
    for row in rows:
        thumb = row.pop("thumbnail")
        thumb_html = (f"<img style='width:312px' alt='{html.escape(row['episode'])}' "
                      f"src='{_data_uri(thumb.read_bytes(), 'image/jpeg')}'>" if thumb.is_file() else "")
        rollout, control = row["rollout"], row["sim_control"]
        failed = rollout["consecutive"]["failed"] + rollout["first_to_k"]["failed"]
        out.append(
            f"<tr><td class='l'><a href='{html.escape(row['report_html'])}'>"
            f"{html.escape(row['episode'])}</a></td>"
            f"<td class='l'>{_fmt(row['model'] or 'unknown')}</td><td>{row['compared_frames']}</td>"
            f"<td>{_fmt(row['psnr_db_mean'])}</td><td>{_fmt(row['ssim_mean'], 4)}</td>"
            f"<td>{_fmt(med(rollout, 'first_to_k', 'rotation_error_deg'))}</td>"
            f"<td>{_fmt(med(control, 'first_to_k', 'rotation_error_deg'))}</td>"
            f"<td>{_fmt(med(rollout, 'first_to_k', 'translation_error_deg'))}</td>"
            f"<td>{_fmt(med(control, 'first_to_k', 'translation_error_deg'))}</td>"
            f"<td>{_fmt(med(rollout, 'consecutive', 'rotation_error_deg'))}</td>"
            f"<td>{_fmt(med(control, 'consecutive', 'rotation_error_deg'))}</td>"
            f"<td>{failed}</td><td class='l'>{thumb_html}</td></tr>"
        )
    out.append("</table><h2>Over time</h2><div class='plots'>")
    out.append(line_plot(
        [Series(row["episode"], list(range(1, len(row["per_pair_first_to_k"]) + 1)),
                row["per_pair_first_to_k"]) for row in rows],
        "world-model rotation error, first frame to k", "frame k", "degrees", "plot-rotation-first-to-k",
        y_min=0.0))
    out.append(line_plot(
        [Series(row["episode"], list(range(len(row["per_frame_psnr_db"]))), row["per_frame_psnr_db"])
         for row in rows], "PSNR, sim vs world model", "frame", "dB", "plot-psnr"))
    out.append("</div><h2>Timings (seconds)</h2><pre id='timings'>" + html.escape(json.dumps(
        {row["episode"]: row["timings"] for row in rows}, indent=1)) + "</pre>")
    out.append("<p class='sub'>Every number is in summary.json beside this page; each episode's own "
               "report.json has the per-frame and per-pair values.</p></body></html>")

    summary = _jsonable({"schema": SUMMARY_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "tiny_model": any_tiny, "episodes": rows})
    atomic.write_bytes(out_dir / "summary.json", json.dumps(summary, indent=1).encode())
    html_path = out_dir / "summary.html"
    atomic.write_bytes(html_path, "\n".join(out).encode())
    return html_path
