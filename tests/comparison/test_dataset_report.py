"""`lingbot-isaac compare --dataset DIR`: every episode's report, and one dataset report over them.

The dataset: three episodes of the rendered room in nested folders: a rollout that follows the
camera (good), one that pans the other way (bad: the worst, so listed first) and one episode whose
rollout is not a video (listed as not compared, with the reason).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import cv2
import numpy as np
import pytest

from comparison.dataset_report import parallel_plan
from comparison.video_io import write_video
from contracts.provenance import write_record
from lingbot_cli.main import main as cli
from tests.comparison.scene import write_episode
from tests.report_checks import tiny_record

SFM = ["--sfm-trials", "1"]  # one reconstruction trial per episode: the test's time
CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)  # fmt: skip


def _noisy(frames: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(frames.astype(np.float64) + rng.normal(0, 3, frames.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, commanded_poses, rendered, rendered_mirrored):
    root = tmp_path_factory.mktemp("dataset")
    good = write_episode(root / "run1" / "good", commanded_poses, rendered)
    write_video(good / "rollout.mp4", _noisy(rendered, 1))
    write_record(good / "rollout.mp4", tiny_record(steps=4))  # the provenance record replay leaves beside it
    bad = write_episode(root / "run1" / "bad", commanded_poses, rendered)
    write_video(bad / "rollout.mp4", _noisy(rendered_mirrored, 2))
    broken = write_episode(root / "run2" / "broken", commanded_poses, rendered)
    (broken / "rollout.mp4").write_bytes(b"not a video")
    write_episode(root / "run2" / "no_rollout", commanded_poses, rendered)  # not replayed yet: not listed
    out = root / "report"
    assert cli(["compare", "--dataset", str(root), "--out", str(out), "--no-progress", *SFM]) == 0
    return {"root": root, "out": out, "html": out / "dataset.html",
            "json": json.loads((out / "dataset.json").read_text())}  # fmt: skip


def test_dataset_numbers_equal_the_episode_reports(dataset):
    data, out = dataset["json"], dataset["out"]
    assert data["schema"] == "lingbot-isaac/compare-dataset/1" and data["tiny_model"] is True
    rows = data["episodes"]
    assert [row["episode"] for row in rows] == ["bad", "good"]  # worst first
    for row in rows:
        report = json.loads((out / row["report_json"]).read_text())
        assert (out / row["report_html"]).is_file()
        rollout = report["camera_fidelity"]["rollout"]["summary"]
        assert row["psnr_db"] == report["image_metrics"]["summary"]["psnr_db"]["mean"]
        assert row["ssim"] == report["image_metrics"]["summary"]["ssim"]["mean"]
        assert row["rotation_error_deg"] == rollout["first_to_k"]["rotation_error_deg"]["median"]
        assert row["translation_error_deg"] == rollout["first_to_k"]["translation_error_deg"]["median"]
        assert row["rotation_error_consecutive_deg"] == rollout["consecutive"]["rotation_error_deg"]["median"]
        assert row["estimation_failures"] == rollout["first_to_k"]["failed"] + rollout["consecutive"]["failed"]
        assert row["compared_frames"] == report["compared_frames"] == 17
        whole = report["camera_fidelity"]["whole_clip"]["rollout"]
        assert row["whole_clip_status"] == whole["status"] == "reconstructed"
        assert row["rot_err_deg_per_frame"] == whole["summary"]["rot_err_deg_per_frame"]["mean"]
        assert row["scale_vs_command"] == whole["summary"]["scale_vs_command"]["mean"]
        assert row["seconds"] == report["timings"]["comparison"]["total_s"]
    good, bad = rows[1], rows[0]
    assert bad["made_by"].startswith("unknown") and not good["made_by"].startswith("unknown")
    assert good["rotation_error_deg"] < 2.0 < bad["rotation_error_deg"]
    # whole clip: the mirrored pan turns frame k by 40 deg x k/16 against the command: 20 deg per frame
    assert good["rot_err_deg_per_frame"] < 0.5 and bad["rot_err_deg_per_frame"] == pytest.approx(20.0, abs=1.0)
    assert good["scale_vs_command"] == pytest.approx(1.0, abs=0.05)
    assert good["psnr_db"] > bad["psnr_db"]
    totals = data["totals"]
    assert totals["episodes"] == 3 and totals["compared"] == 2 and totals["not_compared"] == 1
    assert totals["compared_frames"] == 34
    assert totals["across_episodes"]["psnr_db"]["mean"] == pytest.approx((good["psnr_db"] + bad["psnr_db"]) / 2)
    [(path, why)] = data["not_compared"].items()
    assert path.endswith("broken") and why


def test_rerun_keeps_up_to_date_reports(dataset):
    out = dataset["out"]
    report = out / "episodes" / "run1__good" / "report.json"
    before = report.stat().st_mtime_ns
    assert cli(["compare", "--dataset", str(dataset["root"]), "--out", str(out), "--no-progress", *SFM]) == 0
    assert report.stat().st_mtime_ns == before
    assert json.loads((out / "dataset.json").read_text())["episodes"] == dataset["json"]["episodes"]


def test_episodes_run_in_parallel_one_a_core(dataset, tmp_path, capfd):
    """Issue 54: --cores 2 runs two episodes at once (COLMAP one thread each), each printed when it ends."""
    assert parallel_plan(3, 2) == (2, 1) and parallel_plan(1, 16) == (1, 16) and parallel_plan(0, 4) == (1, 4)
    with pytest.raises(ValueError, match="cores 0"):
        parallel_plan(2, 0)
    assert (
        cli(["compare", "--dataset", str(dataset["root"] / "run1"), "--out", str(tmp_path), "--cores", "2", *SFM]) == 0
    )
    err = capfd.readouterr().err
    assert "2 episode(s), 2 at a time, COLMAP with 1 thread(s) each" in err
    assert re.search(r"good: whole clip reconstructed \(\d+ s\)", err) and re.search(r"bad: whole clip \w+", err)
    assert len(json.loads((tmp_path / "dataset.json").read_text())["episodes"]) == 2
    assert cli(["compare", "--dataset", str(dataset["root"]), "--cores", "0"]) == 2


def test_dataset_and_episode_arguments_do_not_mix(dataset, capsys):
    assert cli(["compare", "x", "y", "--dataset", str(dataset["root"])]) == 2
    assert "--dataset compares every episode" in capsys.readouterr().err


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (scripts/install-chromium.sh)")
def test_dataset_report_renders_in_chromium(dataset, tmp_path):
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    url = dataset["html"].resolve().as_uri()
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "<title>lingbot-isaac dataset evaluation:" in dom
    assert 'id="episodes"' in dom and dom.count('class="episode"') == 2
    assert dom.index('href="episodes/run1__bad/report.html"') < dom.index('href="episodes/run1__good/report.html"')
    assert dom.count('class="plot histogram"') == 10 and 'id="tiny-model-note"' in dom
    assert 'id="not-compared"' in dom and "broken" in dom
    # what made the rollouts: the single report's provenance block, once per model
    assert 'id="made-by"' in dom and dom.count("What made this rollout") == 2
    assert "1 of 2 episode(s): unknown (no provenance record" in dom
    png = tmp_path / "dataset.png"
    subprocess.run([*base, f"--screenshot={png}", "--window-size=1280,1600", url], capture_output=True, timeout=120)
    image = cv2.imread(str(png))
    assert image is not None and image.shape[:2] == (1600, 1280)
    assert image.std() > 20 and (image.min(axis=2) < 200).mean() > 0.05, "the page is drawn, not blank"
