"""The summary page over several episodes' reports (`compare` with several pairs, `--dataset`'s index):
one row per episode from its report.json, worst first where a number says so.

Its own module: the episode report (`comparison.report`) builds one page; this reads many.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from comparison.episode_input import EpisodeError
from comparison.report import FRAME_RATE_NOTE, SCHEMA, SUMMARY_SCHEMA, _data_uri, _jsonable, template_environment
from comparison.sfm_fidelity import headline
from comparison.svg_plot import Series, line_plot
from contracts import atomic


def _summary_row(report_json: Path, out_dir: Path) -> dict:
    try:
        report = json.loads(report_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EpisodeError(f"{report_json}: not a readable report.json ({exc})") from exc
    if report.get("schema") != SCHEMA:
        raise EpisodeError(
            f"{report_json}: schema {report.get('schema')!r}, expected {SCHEMA!r} "
            "(run `lingbot-isaac compare` again to remake it)"
        )
    fidelity = report["camera_fidelity"]
    control = fidelity.get("sim_control") or {}
    image = report["image_metrics"]["summary"]
    return {
        "episode": report["episode"]["name"],
        "report_html": Path(os.path.relpath(report_json.parent / "report.html", out_dir)).as_posix(),
        "report_json": Path(os.path.relpath(report_json, out_dir)).as_posix(),
        "model": report["model"],
        "tiny_model": report["tiny_model"],
        "provenance": report.get("provenance"),
        "compared_frames": report["compared_frames"],
        "psnr_db_mean": image["psnr_db"]["mean"],
        "ssim_mean": image["ssim"]["mean"],
        "whole_clip_status": fidelity["whole_clip"]["rollout"]["status"],
        "whole_clip_reason": fidelity["whole_clip"]["rollout"]["reason"],
        "whole_clip": headline(fidelity["whole_clip"]["rollout"]),
        "whole_clip_control": headline(fidelity["whole_clip"].get("control")),
        "rollout": fidelity["rollout"]["summary"],
        "sim_control": control.get("summary"),
        "per_pair_first_to_k": [p["rotation_error_deg"] for p in fidelity["rollout"]["first_to_k"]],
        "per_frame_psnr_db": [row["psnr_db"] for row in report["image_metrics"]["per_frame"]],
        "timings": report["timings"],
        "thumbnail": report_json.parent / report["outputs"]["thumbnail"],
    }


def write_summary(report_jsons: list[str | Path], out_dir: str | Path) -> Path:
    """Write summary.html and summary.json over several episodes' report.json; returns the HTML path."""
    from markupsafe import Markup

    out_dir = Path(out_dir)
    if not report_jsons:
        raise EpisodeError("no report.json files to summarize")
    rows = [_summary_row(Path(path), out_dir) for path in report_jsons]
    any_tiny = any(row["tiny_model"] for row in rows)
    page_rows = []
    for row in rows:
        thumb = row.pop("thumbnail")
        page_rows.append(
            {**row, "thumbnail_uri": _data_uri(thumb.read_bytes(), "image/jpeg") if thumb.is_file() else None}
        )
    plots = [
        line_plot(
            [
                Series(row["episode"], list(range(1, len(row["per_pair_first_to_k"]) + 1)), row["per_pair_first_to_k"])
                for row in rows
            ],
            "world-model rotation error, first frame to k",
            "frame k",
            "degrees",
            "plot-rotation-first-to-k",
            y_min=0.0,
        ),
        line_plot(
            [
                Series(row["episode"], list(range(len(row["per_frame_psnr_db"]))), row["per_frame_psnr_db"])
                for row in rows
            ],
            "PSNR, sim vs world model",
            "frame",
            "dB",
            "plot-psnr",
        ),
    ]
    page = (
        template_environment()
        .get_template("summary.html.j2")
        .render(
            rows=page_rows,
            any_tiny=any_tiny,
            frame_rate_note=FRAME_RATE_NOTE,
            plots=[Markup(p) for p in plots],
            timings={row["episode"]: row["timings"] for row in rows},
        )
    )
    summary = _jsonable(
        {
            "schema": SUMMARY_SCHEMA,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tiny_model": any_tiny,
            "episodes": rows,
        }
    )
    atomic.write_bytes(out_dir / "summary.json", json.dumps(summary, indent=1).encode())
    html_path = out_dir / "summary.html"
    atomic.write_bytes(html_path, page.encode())
    return html_path
