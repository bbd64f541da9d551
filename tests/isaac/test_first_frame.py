"""`--first-frame PHOTO`: a real camera's photo as the rollout's first frame, fitted like a sim image."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from contracts.episode import EpisodeError, read_episode
from contracts.model_frame import from_model_intrinsics, to_model_intrinsics
from contracts.provenance import summary_rows
from lingbot_isaac.first_frame import crop_box, fit_photo, parse_intrinsics, with_photo
from tests.isaac.test_replay import SAMPLE, needs_server, run_replay, server  # noqa: F401  (fixture)
from tests.room_render import render_room


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255**2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def real_photo(width: int, height: int, k: tuple[float, float, float, float]) -> Image.Image:
    """A "photo" of the sample room from the sample's start pose by another camera (own size, K)."""
    pose = read_episode(SAMPLE).poses[0].astype(np.float64)
    return Image.fromarray(render_room(pose, k, height, width))


@pytest.mark.parametrize(
    "size,k",
    [
        ((1600, 1200), (1150.0, 1150.0, 790.0, 610.0)),  # 4:3, taller than the 832x480 frame: rows cropped
        ((1000, 400), (520.0, 520.0, 505.0, 196.0)),  # wider than the frame: columns cropped
    ],
)
def test_photo_and_its_intrinsics_are_fitted_together(size, k):
    photo = real_photo(*size, k)
    image, fitted_k, info = fit_photo(photo, 480, 832, k)
    assert image.shape == (480, 832, 3) and info["source"] == "photo"
    x0, y0, cw, ch = info["crop"]
    assert abs(cw / ch - 832 / 480) < 0.01 and (x0 == 0 or y0 == 0)
    # The fitted photo is what a camera with the fitted K renders at 832x480 from the same pose.
    pose = read_episode(SAMPLE).poses[0].astype(np.float64)
    expected = render_room(pose, tuple(fitted_k), 480, 832)
    assert psnr(image, expected) > 24
    # ... and not what the unadjusted K would give (the adjustment matters).
    naive = render_room(pose, (k[0] * 832 / size[0], k[1] * 480 / size[1], 416.0, 240.0), 480, 832)
    assert psnr(image, expected) > psnr(image, naive) + 3


def test_crop_box_and_intrinsics_text():
    assert crop_box((1600, 1200), 480, 832) == (0, 138, 1600, 923)
    assert crop_box((832, 480), 480, 832) == (0, 0, 832, 480)
    assert parse_intrinsics("600,600,416,240") == (600.0, 600.0, 416.0, 240.0)
    for bad in ("600,600,416", "a,b,c,d", "0,600,416,240"):
        with pytest.raises(EpisodeError, match="--photo-intrinsics"):
            parse_intrinsics(bad)


def test_with_photo_rewrites_the_episode_and_records_it(tmp_path):
    k_photo = (1150.0, 1150.0, 790.0, 610.0)
    real_photo(1600, 1200, k_photo).save(tmp_path / "photo.jpg", quality=95)
    sample = read_episode(SAMPLE)
    # Without intrinsics: the sim camera's stay; the photo replaces image.jpg; the sample is untouched.
    out = with_photo(SAMPLE, tmp_path / "photo.jpg", tmp_path / "ep")
    episode = read_episode(out)
    np.testing.assert_array_equal(episode.poses, sample.poses)
    np.testing.assert_allclose(episode.intrinsics, sample.intrinsics, rtol=1e-6)
    assert episode.meta.extra["first_frame"]["intrinsics"] == "the sim camera's"
    assert episode.sim_frames_path is not None  # sim frames kept for the comparison
    fitted, _, _ = fit_photo(tmp_path / "photo.jpg", 480, 832)
    assert psnr(episode.image(), fitted) > 35  # the photo (JPEG q95 again: ~40 dB), not the sim render
    assert psnr(episode.image(), sample.image()) < 30
    # With intrinsics: they replace the sim's for every frame, fitted like the image.
    out = with_photo(SAMPLE, tmp_path / "photo.jpg", tmp_path / "ep", k_photo, overwrite=True)
    episode = read_episode(out)
    _, k, _ = fit_photo(tmp_path / "photo.jpg", 480, 832, k_photo)
    np.testing.assert_allclose(episode.intrinsics, np.tile(to_model_intrinsics(k, 480, 832), (33, 1)), rtol=1e-6)
    np.testing.assert_allclose(from_model_intrinsics(episode.intrinsics[0], 480, 832), k, rtol=1e-6)
    # In place (an exported episode) works too and keeps its sim frames.
    assert with_photo(out, tmp_path / "photo.jpg", out).joinpath("sim.mp4").is_file()


def test_replay_first_frame_errors_are_named(tmp_path, capsys):
    from lingbot_cli.main import main as cli

    code = cli(["replay", str(SAMPLE), "--export-only", "--first-frame", str(tmp_path / "nope.jpg")])
    assert code == 2 and "--first-frame" in capsys.readouterr().err
    code = cli(["replay", str(SAMPLE), "--export-only", "--photo-intrinsics", "1,1,1,1"])
    assert code == 2 and "--first-frame" in capsys.readouterr().err


@needs_server
@pytest.mark.slow
def test_replay_with_first_frame_photo_sends_the_photo_and_says_so(tmp_path, server):  # noqa: F811
    from bridge.client.episode_payload import EpisodePayload

    real_photo(1600, 1200, (1150.0, 1150.0, 790.0, 610.0)).save(tmp_path / "photo.jpg", quality=95)
    result = run_replay(server, tmp_path / "results", "--first-frame", str(tmp_path / "photo.jpg"))
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "results" / "sample_room"
    assert (folder / "rollout.mp4").is_file()
    assert f"first frame: photo {tmp_path / 'photo.jpg'}" in result.stderr
    record = json.loads((folder / "rollout.json").read_text())  # the provenance record
    first = record["inputs"]["first_frame"]
    assert first["source"] == "photo" and first["path"] == str(tmp_path / "photo.jpg")
    rows = dict(summary_rows(record))  # what the top of every report shows
    assert rows["first frame"] == f"photo (not the sim's render): {tmp_path / 'photo.jpg'}"
    # What the client submitted as the first frame is the photo, fitted to the frame.
    sent = np.asarray(Image.open(io.BytesIO(EpisodePayload.from_dir(folder).image)).convert("RGB"))
    fitted, _, _ = fit_photo(tmp_path / "photo.jpg", 480, 832)
    assert psnr(sent, fitted) > 35 and psnr(sent, read_episode(SAMPLE).image()) < 30
    assert record["inputs"]["image_size"] == [832, 480]  # the server generated from an image of that size
    assert np.array_equal(np.load(SAMPLE / "poses.npy"), np.load(folder / "poses.npy"))  # the sim trajectory
