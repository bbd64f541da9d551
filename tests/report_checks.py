"""What every report must show at its top, whichever path made the rollout (issue 14)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from contracts.provenance import REQUIRED_SETTINGS, TINY_NOTE, make_record, read_record


def tiny_record(**settings) -> dict:
    """A provenance record as the worker writes it for the tiny model (for rollouts tests make themselves)."""
    used = {
        "size": "96*160",
        "frame_num": 17,
        "steps": 4,
        "shift": 5.0,
        "guide_scale": [5.0, 5.0],
        "seed": 42,
        **settings,
    }
    return make_record(
        producer="worker",
        model={
            "family": "lingbot-world",
            "variant": "base",
            "weights": "tiny",
            "random_weights": True,
            "name": "tiny (random weights), bf16 checkpoint layout",
        },
        checkpoint={
            "path": "/cache/tiny-v1/bf16",
            "layout": "bf16",
            "fingerprint": "sha256:ab",
            "files": 9,
            "bytes": 1,
        },
        compute={"device": "cpu", "dtype": "float32"},
        settings=used,
        output={"frames": used["frame_num"], "height": 80, "width": 160, "fps": 16},
        timings={"generate_s": 9.5},
    )


def assert_tiny_rollout_is_traceable(rollout: Path, report_html: Path, client: str | None) -> dict:
    """The record beside `rollout` names the tiny model and every setting, and the report's top shows
    the model, the noise banner and every setting used. Returns the record."""
    record, note = read_record(rollout)
    assert note is None and record is not None, f"no provenance record beside {rollout}"
    assert record["model"]["random_weights"] is True and record["model"]["weights"] == "tiny"
    assert record["checkpoint"]["fingerprint"].startswith("sha256:")
    assert all(record["settings"].get(key) is not None for key in REQUIRED_SETTINGS), record["settings"]
    if client is not None:
        assert record["job"]["client"] == client and record["job"]["id"], record["job"]
    page = html.unescape(report_html.read_text())
    top = page[: page.index("<h2>")]  # before the first section: what a reader sees first
    assert "tiny (random weights)" in top, "the model"
    assert TINY_NOTE in top, "the noise banner"
    for key, value in record["settings"].items():
        shown = "default" if value is None else ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        assert f"setting: {key}</th><td class='l'>{shown}</td>" in top, (key, shown)
    report = json.loads(report_html.with_name("report.json").read_text())
    assert report["tiny_model"] is True and report["provenance"]["model"] == record["model"]
    return record
