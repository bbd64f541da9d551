"""`data/sample_room` is what `scripts/make_sample_episode.py` makes; its sim frames follow its poses."""

from __future__ import annotations

import json
import re
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


# The generator's floats may differ in the last digit between CPUs (libm's sin and cos round differently:
# 0.34202014332566866 on one, 0.3420201433256687 on another), so generated files are compared by value.
# float64 (the stage, episode.json): within 1e-12 relative (+1e-9 absolute, for zeros); float32 arrays
# (poses in metres, intrinsics in pixels): within 1e-6 relative (+1e-6 absolute), 8 float32 steps.
# Any real change to the sample (a pose moved by a micron, a box by a micrometre) is far outside both.
F64 = {"rtol": 1e-12, "atol": 1e-9}
F32 = {"rtol": 1e-6, "atol": 1e-6}


def stage_values(path: Path) -> dict[tuple[str, str], object]:
    """Everything authored in a USD stage: layer metadata, prim types, each attribute at each time code."""
    from pxr import Usd

    stage = Usd.Stage.Open(str(path))
    root = stage.GetRootLayer().pseudoRoot
    values: dict[tuple[str, str], object] = {("layer", key): root.GetInfo(key) for key in root.ListInfoKeys()}
    for prim in stage.Traverse():
        values[(str(prim.GetPath()), "type")] = str(prim.GetTypeName())
        for attr in prim.GetAuthoredAttributes():
            for time in attr.GetTimeSamples() or [Usd.TimeCode.Default()]:
                values[(str(attr.GetPath()), str(time))] = attr.Get(time)
    return values


def same_value(a: object, b: object) -> bool:
    """Equal, where numbers (USD vectors and matrices, JSON numbers and lists) may differ within F64."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    try:
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):  # token and string arrays
        return list(a) == list(b)
    return x.shape == y.shape and bool(np.allclose(x, y, **F64))


def stage_differences(a: Path, b: Path) -> list[str]:
    ours, theirs = stage_values(a), stage_values(b)
    if ours.keys() != theirs.keys():
        return [f"authored in only one: {sorted(set(ours) ^ set(theirs))}"]
    return [f"{key}: {ours[key]} != {theirs[key]}" for key in ours if not same_value(ours[key], theirs[key])]


def test_sample_is_what_the_script_makes(regenerated):
    for name in ("poses.npy", "intrinsics.npy"):
        ours, theirs = np.load(SAMPLE / name), np.load(regenerated / name)
        assert ours.dtype == theirs.dtype == np.float32, name
        np.testing.assert_allclose(theirs, ours, **F32, err_msg=name)
    assert (SAMPLE / "prompt.txt").read_text() == (regenerated / "prompt.txt").read_text()
    assert stage_differences(SAMPLE / "room.usda", regenerated / "room.usda") == []
    ours, theirs = (json.loads((d / "episode.json").read_text()) for d in (SAMPLE, regenerated))
    assert ours.pop("sim_frames") == "sim.mp4" and theirs.pop("sim_frames") is None
    assert same_value(ours, theirs), (ours, theirs)
    a, b = (np.asarray(Image.open(d / "image.jpg"), dtype=np.float64) for d in (SAMPLE, regenerated))
    assert np.abs(a - b).mean() < 0.5  # same JPEG up to encoder version


def test_stages_differing_in_the_last_digit_are_the_same_and_a_real_change_is_not(tmp_path):
    """One float64 step (what another CPU's trigonometry gives) passes; a change of 1e-6 does not."""
    pytest.importorskip("pxr", reason="usd-core (pxr) is needed to read the sample stage")
    text = (SAMPLE / "room.usda").read_text()
    number = re.search(r"\( *\(([-0-9.e]+),", text[text.index("xformOp:transform.timeSamples") :]).group(1)
    assert len(number) > 15  # a camera rotation entry at full float64 precision, as the generator writes it
    next_float = repr(float(np.nextafter(float(number), np.inf)))
    changed_by_1e6 = repr(float(number) + 1e-6)
    for replacement, same in ((next_float, True), (changed_by_1e6, False)):
        assert float(replacement) != float(number)
        changed = tmp_path / f"room_{same}.usda"
        changed.write_text(text.replace(number, replacement, 1))
        assert (stage_differences(SAMPLE / "room.usda", changed) == []) == same, replacement


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
