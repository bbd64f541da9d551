"""`data/sample_room` is what `scripts/make_sample_episode.py` makes; its sim frames follow its poses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from contracts.episode import read_episode
from contracts.model_frame import from_model_intrinsics
from tests.room_render import render_room

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample_room"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    pytest.importorskip("pxr", reason="usd-core (pxr) is needed to rebuild the sample stage")
    out = tmp_path_factory.mktemp("sample") / "sample_room"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_sample_episode.py"),
            "--out",
            str(out),
            "--no-sim-video",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def test_sample_is_what_the_script_makes(regenerated):
    for name in ("poses.npy", "intrinsics.npy"):
        assert np.array_equal(np.load(SAMPLE / name), np.load(regenerated / name)), name
    assert (SAMPLE / "prompt.txt").read_text() == (regenerated / "prompt.txt").read_text()
    assert (SAMPLE / "room.usda").read_text() == (regenerated / "room.usda").read_text()
    ours, theirs = (json.loads((d / "episode.json").read_text()) for d in (SAMPLE, regenerated))
    assert ours.pop("sim_frames") == "sim.mp4" and theirs.pop("sim_frames") is None
    assert ours == theirs
    a, b = (np.asarray(Image.open(d / "image.jpg"), dtype=np.float64) for d in (SAMPLE, regenerated))
    assert np.abs(a - b).mean() < 0.5  # same JPEG up to encoder version


def test_sample_episode_is_valid_and_its_frames_follow_its_poses():
    from contracts.video import read_mp4

    episode = read_episode(SAMPLE)
    assert episode.frame_count == 33 and (episode.frame_count - 1) % 4 == 0
    assert episode.meta.source_resolution == (480, 832) and episode.meta.meters_per_unit == 0.01
    assert episode.sim_frames_path == SAMPLE / "sim.mp4"
    assert sum(p.stat().st_size for p in SAMPLE.iterdir()) < 3_000_000  # keep data/ small
    frames, _ = read_mp4(SAMPLE / "sim.mp4")
    assert frames.shape == (33, 480, 832, 3)
    k = tuple(from_model_intrinsics(episode.intrinsics[0], 480, 832))
    luma = np.array([0.299, 0.587, 0.114])  # yuv420p halves chroma, so compare brightness

    def psnr(a, b):
        return 10 * np.log10(255**2 / np.mean(((a - b) @ luma) ** 2))

    for i in (0, 16, 32):
        rendered = render_room(episode.poses[i].astype(np.float64), k, 480, 832).astype(np.float64)
        neighbour = render_room(episode.poses[i - 1].astype(np.float64), k, 480, 832).astype(np.float64)
        assert psnr(frames[i], rendered) > 35, f"sim frame {i} does not match its pose"
        assert psnr(frames[i], neighbour) < 25, "consecutive poses should render visibly different frames"
    # The first frame is image.jpg; a neighbouring pose's render is clearly different.
    first = np.asarray(Image.open(SAMPLE / "image.jpg"), dtype=np.float64)
    assert psnr(first, render_room(episode.poses[0].astype(np.float64), k, 480, 832)) > 35
    assert psnr(first, frames[8]) < 25
