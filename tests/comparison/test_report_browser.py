"""The report renders in headless Chromium: a screenshot that is not blank and a DOM with the key parts.

Skipped only when no Chromium is installed (`make test` installs Debian's via
scripts/install-chromium.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import cv2
import numpy as np
import pytest

from comparison.summary import write_summary

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (run scripts/install-chromium.sh or `make test`)",
)


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_report_screenshot_is_not_blank(tmp_path, report_case):
    png = tmp_path / "report.png"
    result = chromium(
        tmp_path, f"--screenshot={png}", "--window-size=1280,2000", report_case["html"].resolve().as_uri()
    )
    assert png.is_file(), f"no screenshot; chromium said:\n{result.stderr[-2000:]}"
    image = cv2.imread(str(png))
    assert image is not None and image.shape[:2] == (2000, 1280)
    assert image.std() > 30, "the page should show images and plots, not a blank page"
    not_white = (image.min(axis=2) < 200).mean()
    assert not_white > 0.15, f"only {not_white:.0%} of the page is drawn"
    # the tiny-model warning box (#fff3cd) is drawn near the top
    warn = np.all(np.abs(image[:300].astype(int) - [0xCD, 0xF3, 0xFF]) < 6, axis=2)
    assert warn.mean() > 0.02, "the tiny-model note is visible at the top"


def test_report_dom_has_the_key_elements(tmp_path, report_case):
    result = chromium(tmp_path, "--dump-dom", report_case["html"].resolve().as_uri())
    dom = result.stdout
    assert "<title>lingbot-isaac comparison: room_walk</title>" in dom, result.stderr[-2000:]
    assert '<video id="side-by-side"' in dom and '<source src="side_by_side.mp4"' in dom  # beside the page
    assert '<table id="summary">' in dom and '<table id="camera-summary">' in dom
    assert '<table id="per-frame">' in dom
    # PSNR, SSIM, whole-clip rotation and position, pairwise rotation and translation x (consecutive, 0-to-k)
    assert dom.count('class="plot"') == 8
    assert '<table id="whole-clip">' in dom and dom.count('class="whole-clip-ok"') == 2  # world model, control
    assert "scale vs command" in dom and "RotErr" in dom and "CamMC" in dom
    assert 'id="tiny-model-note"' in dom and "tiny-model output is noise" in dom
    assert '<details open="" id="provenance">' in dom  # what made the rollout, at the top
    assert dom.count("<img ") == 2 * 8, "8 thumbnails of sim and world model, first to last frame"
    assert 'alt="world model frame 16"' in dom


def test_summary_page_renders(tmp_path, report_case):
    summary = write_summary([report_case["html"].with_name("report.json")], tmp_path)
    dom = chromium(tmp_path, "--dump-dom", summary.resolve().as_uri()).stdout
    assert "<title>lingbot-isaac comparison summary</title>" in dom
    link = os.path.relpath(report_case["html"], tmp_path)
    assert '<table id="summary">' in dom and f'href="{link}"' in dom
    assert "room_walk" in dom and dom.count('class="plot"') == 2
