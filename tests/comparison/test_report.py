"""compare_episode / write_summary on real files: what the report holds and how bad input fails."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from comparison.episode_input import EpisodeError
from comparison.report import SCHEMA, TINY_NOTE, compare_episode
from comparison.side_by_side import GAP, label_height
from comparison.summary import write_summary
from comparison.svg_plot import LEGEND_CHAR_PX
from comparison.video_io import read_video, write_video
from contracts.provenance import with_job, write_record
from tests.comparison.conftest import FRAMES, HEIGHT, SMALL_SFM, WIDTH
from tests.comparison.scene import write_episode
from tests.report_checks import tiny_record


def strict_json(path):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name} in {path}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_report_files_and_numbers(report_case):
    out = report_case["html"].parent
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "side_by_side.mp4", "thumbnail.jpg"]
    report = strict_json(out / "report.json")
    assert report["schema"] == SCHEMA and report["model"] == "tiny" and report["tiny_model"] is True
    assert report["compared_frames"] == FRAMES
    assert report["rollout"]["frames"] == FRAMES + 4 and report["rollout"]["size_hw"] == [176, 320]
    assert report["episode"]["sim_size_hw"] == [HEIGHT, WIDTH]
    assert report["episode"]["sim_source"] == "sim.mp4"
    per_frame = report["image_metrics"]["per_frame"]
    assert [row["frame"] for row in per_frame] == list(range(FRAMES))
    # compared in the common 320x176 frame: about 26 dB and SSIM 0.86 (noise: 10 dB, 0.02); resizing the
    # rollout up to the sim's size instead blurred this fine texture down to 22.5 dB and SSIM 0.72
    assert all(20 < row["psnr_db"] < 40 and 0.6 < row["ssim"] < 0.95 for row in per_frame), per_frame
    fidelity = report["camera_fidelity"]
    for source in ("rollout", "sim_control"):
        summary = fidelity[source]["summary"]
        assert len(fidelity[source]["consecutive"]) == FRAMES - 1
        assert len(fidelity[source]["first_to_k"]) == FRAMES - 1
        assert summary["first_to_k"]["rotation_error_deg"]["median"] < 1.0, (source, summary)
    assert fidelity["rollout"]["frame_size"] == [176, 320], "the estimator sees the rollout at its own size"
    # the whole clip: the rollout follows the command (same path, resized, a little noise): scale ~1
    whole = fidelity["whole_clip"]
    assert whole["status"] == "reconstructed" and whole["run"]["frame_size"] == [176, 320]
    for source in ("rollout", "control"):
        summary = whole[source]["summary"]
        assert whole[source]["trials_reconstructed"] == 2 and summary["registered_ratio"]["min"] == 1.0
        assert summary["rot_err_deg_per_frame"]["max"] < 0.5, (source, summary)
        assert summary["rot_err_deg"]["trials"] == 2
        assert len(whole[source]["per_frame"]["rotation_error_deg"]) == FRAMES
    assert whole["rollout"]["summary"]["scale_vs_command"]["mean"] == pytest.approx(1.0, abs=0.05)
    assert fidelity["pairwise_role"].startswith("a second view")
    page = report_case["html"].read_text()
    assert "<h2>Camera control: the whole clip reconstructed</h2>" in page
    # issue 54: every legend entry of the position plot (three, the last one was cut to "wo..") inside the plot
    svg = re.search(r'<svg id="plot-sfm-position".*?</svg>', page).group(0)
    width = float(re.search(r'width="(\d+)"', svg).group(1))
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="11">([^<]*(?:model|control)[^<]*)</text>', svg)
    assert len(labels) == 3, labels
    assert all(float(x) + LEGEND_CHAR_PX * len(html.unescape(text)) <= width for x, text in labels), labels
    assert report["timings"]["comparison"]["whole_clip_reconstruction_s"] > 0
    assert report["settings"]["generation"]["steps"] == 4
    assert report["timings"]["generation"] == {"generate_s": 1.5}
    assert report["timings"]["comparison"]["total_s"] > 0
    assert TINY_NOTE in report["notes"]
    assert any("16 fps" in note for note in report["notes"])
    # common frame: the smaller size (the rollout's); the sim is scaled down to it, the rollout untouched
    frame = report["common_frame"]
    assert frame["size_hw"] == [176, 320] and frame["rollout_scale_yx"] == [1.0, 1.0]
    assert frame["sim_scale_yx"] == [176 / HEIGHT, 320 / WIDTH]
    assert any(
        note.startswith("Compared in a common 320x176 frame: the sim (416x240) scaled by") for note in report["notes"]
    )
    assert any("aspects differ by 4.7%" in note for note in report["notes"])  # 176/320 vs 240/416


def test_side_by_side_video(report_case):
    frames, fps = read_video(report_case["html"].parent / "side_by_side.mp4")
    assert fps == pytest.approx(16)
    height, width = 176, 320  # the panels are in the common frame: the rollout's, the smaller
    label = label_height(width)
    assert frames.shape == (FRAMES, height + label, 3 * width + 2 * GAP, 3)
    sim_panel = frames[:, label:, :width].astype(int)
    model_panel = frames[:, label:, width + GAP : 2 * width + GAP].astype(int)
    diff_panel = frames[:, label:, 2 * (width + GAP) :].astype(int)
    assert np.abs(sim_panel - model_panel).mean() < 15, "sim and a faithful rollout look alike"
    assert diff_panel.mean() < sim_panel.mean(), "a small difference is dark in the inferno map"


def test_html_is_self_contained(report_case):
    page = report_case["html"].read_text()
    assert "<title>lingbot-isaac comparison: room_walk</title>" in page
    assert TINY_NOTE in html.unescape(page)
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page), "no external URL"
    assert "<script" not in page and "<link" not in page
    assert "src='side_by_side.mp4'" in page and "data:video" not in page, "the video is referenced, not inlined"
    assert report_case["html"].stat().st_size < 1_000_000, "thumbnails inline (~300 KB here), videos beside the page"
    for element_id in (
        "side-by-side",
        "summary",
        "camera-summary",
        "per-frame",
        "thumbnails",
        "plot-psnr",
        "plot-ssim",
        "plot-rotation-consecutive",
        "plot-rotation-first-to-k",
        "plot-translation-first-to-k",
        "whole-clip",
        "plot-sfm-rotation",
        "plot-sfm-position",
        "settings",
        "timings",
    ):
        assert re.search(f"id=['\"]{element_id}['\"]", page), element_id


def test_noise_rollout_without_sim_frames(tmp_path, commanded_poses, rendered):
    """No sim frames: camera fidelity only. A noise video: its failures are reported, not hidden."""
    count = 9
    episode = write_episode(tmp_path / "no_sim", commanded_poses[:count], sim_frames=None)
    noise = np.random.default_rng(0).integers(0, 256, (count, HEIGHT, WIDTH, 3), dtype=np.uint8)
    html_path = compare_episode(
        episode, write_video(tmp_path / "noise.mp4", noise), tmp_path / "out", reconstruction=SMALL_SFM
    )
    report = strict_json(html_path.with_name("report.json"))
    assert report["model"] is None and report["tiny_model"] is False and report["provenance"] is None
    assert any("No provenance record" in note for note in report["notes"])
    assert report["image_metrics"]["available"] is False and report["image_metrics"]["per_frame"] == []
    assert report["camera_fidelity"]["sim_control"] is None
    rollout = report["camera_fidelity"]["rollout"]
    assert len(rollout["consecutive"]) == count - 1
    assert rollout["summary"]["consecutive"]["failed"] >= count // 2
    assert all(p["reason"] for p in rollout["consecutive"] if p["status"] == "failed")
    whole = report["camera_fidelity"]["whole_clip"]  # noise is "not reconstructed", with why, not a number
    assert whole["status"] == "not reconstructed" and whole["control"] is None
    assert "geometric verification" in whole["rollout"]["reason"] and whole["rollout"]["summary"] == {}
    assert report["camera_fidelity"]["pairwise_role"] == "the camera numbers"
    page = html_path.read_text()
    assert "failed" in page and "no sim frames" in page and TINY_NOTE not in page
    assert "not reconstructed: no pair of frames passed geometric verification" in page
    assert "Camera fidelity, pairwise (the fallback: the whole clip was not reconstructed)" in page
    assert "<h2>Camera control: the whole clip not reconstructed</h2>" in page  # issue 54: not "reconstructed"
    frames, _ = read_video(html_path.with_name("side_by_side.mp4"))
    assert frames.shape == (count, HEIGHT + label_height(WIDTH), WIDTH, 3), "only the world-model panel"


def test_png_frame_folder_and_summary(tmp_path, report_case, commanded_poses, rendered):
    count = 6
    episode = write_episode(tmp_path / "pngs", commanded_poses[:count], rendered[:count], frames_as="png")
    html_path = compare_episode(
        episode, report_case["rollout"], tmp_path / "pngs_report", model="ckpt-A", whole_clip=False
    )
    report = strict_json(html_path.with_name("report.json"))
    assert report["episode"]["sim_source"] == "frames/" and report["compared_frames"] == count
    assert "tiny" not in json.dumps(report["notes"])

    summary_html = write_summary(
        [report_case["html"].with_name("report.json"), html_path.with_name("report.json")], tmp_path
    )
    summary = strict_json(tmp_path / "summary.json")
    assert [row["episode"] for row in summary["episodes"]] == ["room_walk", "pngs"]
    assert summary["tiny_model"] is True
    first = summary["episodes"][0]
    assert first["rollout"]["first_to_k"]["rotation_error_deg"]["median"] < 1.0
    assert first["whole_clip_status"] == "reconstructed" and first["whole_clip"]["rot_err_deg_per_frame"] < 0.5
    assert summary["episodes"][1]["whole_clip_status"] == "not reconstructed"  # switched off for it
    page = summary_html.read_text()
    assert "href='pngs_report/report.html'" in page
    assert page.count("src='data:image/jpeg;base64,") == 2
    assert 'id="plot-rotation-first-to-k"' in page and TINY_NOTE in html.unescape(page)


def test_bad_episodes_are_clear_errors(tmp_path, report_case, commanded_poses, rendered):
    rollout = report_case["rollout"]
    with pytest.raises(EpisodeError, match="not a folder"):
        compare_episode(tmp_path / "missing", rollout, tmp_path / "o1")
    episode = write_episode(tmp_path / "ep", commanded_poses[:3], rendered[:3])
    (episode / "poses.npy").unlink()
    with pytest.raises(EpisodeError, match=r"poses\.npy: missing"):
        compare_episode(episode, rollout, tmp_path / "o2")
    np.save(episode / "poses.npy", commanded_poses[:3, :3])
    with pytest.raises(EpisodeError, match=r"poses\.npy has shape \[3, 3, 4\]"):
        compare_episode(episode, rollout, tmp_path / "o3")
    np.save(episode / "poses.npy", commanded_poses[:3])
    np.save(episode / "intrinsics.npy", np.ones((3, 3)))
    with pytest.raises(EpisodeError, match=r"intrinsics\.npy has shape \[3, 3\]"):
        compare_episode(episode, rollout, tmp_path / "o4")
    one = write_episode(tmp_path / "one", commanded_poses[:1], rendered[:1])
    with pytest.raises(EpisodeError, match="at least 2"):
        compare_episode(one, rollout, tmp_path / "o5")
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3", "o4", "o5")), "nothing written"


def test_rollout_sidecar_and_episode_json_sim_frames(tmp_path, commanded_poses, rendered):
    count = 5
    episode = write_episode(tmp_path / "ep", commanded_poses[:count], rendered[:count])
    rollout = write_video(episode / "rollout.mp4", rendered[:count])  # as `lingbot-isaac replay` leaves it
    record = with_job(
        {**tiny_record(frame_num=5), "adjustments": ["81 frames asked, 5 poses: generating 5"]},
        {"client": "replay", "id": "j-1", "seconds": 12.5, "server_seconds": 11.0},
    )
    write_record(rollout, record)  # as `lingbot-isaac replay` leaves it
    out = compare_episode(episode, rollout, tmp_path / "out", whole_clip=False)
    report = strict_json(out.with_name("report.json"))
    assert report["provenance"]["job"]["id"] == "j-1"
    assert "switched off" in report["camera_fidelity"]["whole_clip"]["reason"]
    assert report["model"] == "lingbot-world base, tiny (random weights), bf16 checkpoint layout"
    assert report["tiny_model"] is True, "the noise banner follows the record"
    assert report["settings"]["generation"]["steps"] == 4
    assert report["timings"]["generation"] == {"generate_s": 9.5, "job_seconds": 12.5, "job_server_seconds": 11.0}
    page = html.unescape(out.read_text())
    top = page[: page.index("<h2>")]  # model, banner and every setting come before the first section
    assert "tiny (random weights), bf16 checkpoint layout" in top and TINY_NOTE in top and "sha256:ab" in top
    for key, value in record["settings"].items():
        assert f"setting: {key}" in top and str(value if not isinstance(value, list) else value[0]) in top
    assert "81 frames asked, 5 poses: generating 5" in top
    # given values win over the sidecar
    given = compare_episode(episode, rollout, tmp_path / "out2", settings={"steps": 4}, timings={}, whole_clip=False)
    assert strict_json(given.with_name("report.json"))["settings"]["generation"] == {"steps": 4}

    (episode / "rollout.json").write_text("{broken")
    report = strict_json(
        compare_episode(episode, rollout, tmp_path / "out3", whole_clip=False).with_name("report.json")
    )
    assert any("rollout.json beside the rollout is not readable JSON" in note for note in report["notes"])

    meta = json.loads((episode / "episode.json").read_text())
    (episode / "episode.json").write_text(json.dumps({**meta, "sim_frames": "frames"}))
    with pytest.raises(EpisodeError, match=r"says sim_frames \"frames\" but .*frames is missing"):
        compare_episode(episode, rollout, tmp_path / "out4", whole_clip=False)
