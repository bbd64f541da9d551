"""Episode folders: write, read, validate, atomic replacement, and the 480x832 intrinsics rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from contracts.episode import (
    EpisodeError,
    EpisodeMeta,
    is_episode_dir,
    read_episode,
    write_episode,
)
from contracts.model_frame import from_model_intrinsics, to_model_intrinsics
from tests.room_render import look_at


def trajectory(n: int = 9) -> np.ndarray:
    return np.stack([look_at((0.1 * i, 0, 1.5), (0.1 * i, 3, 1.2)) for i in range(n)])


def image(h: int = 720, w: int = 1280) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def meta(h: int = 720, w: int = 1280, **kw) -> EpisodeMeta:
    return EpisodeMeta(source_resolution=(h, w), **kw)


def test_write_then_read(tmp_path):
    poses = trajectory()
    k = np.array([900.0, 905.0, 640.0, 360.0])
    out = write_episode(
        tmp_path / "ep",
        poses,
        k,
        image(),
        "A robot drives through a room.",
        meta(
            camera_prim="/World/Cam",
            sim_times=[i / 16 for i in range(9)],
            scene_id="room",
            robot_id="cart",
            meters_per_unit=0.01,
            generation={"steps": 4},
        ),
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "episode.json",
        "image.jpg",
        "intrinsics.npy",
        "poses.npy",
        "prompt.txt",
    ]
    episode = read_episode(out)
    assert episode.frame_count == 9
    assert episode.poses.dtype == np.float32 and episode.intrinsics.dtype == np.float32
    np.testing.assert_allclose(episode.poses, poses, atol=1e-6)
    # intrinsics.npy is for a 480x832 frame: x by 832/1280, y by 480/720.
    np.testing.assert_allclose(episode.intrinsics[0], [900 * 0.65, 905 * 480 / 720, 416, 240], rtol=1e-6)
    np.testing.assert_allclose(from_model_intrinsics(episode.intrinsics[0], 720, 1280), k, rtol=1e-6)
    assert episode.meta.source_intrinsics == k.tolist()
    assert episode.meta.source_resolution == (720, 1280)
    assert episode.meta.camera_prim == "/World/Cam" and episode.meta.meters_per_unit == 0.01
    assert episode.meta.generation == {"steps": 4}
    assert episode.prompt == "A robot drives through a room."
    assert episode.image().shape == (720, 1280, 3)
    assert episode.sim_frames_path is None
    assert is_episode_dir(out) and not is_episode_dir(tmp_path)
    data = json.loads((out / "episode.json").read_text())
    assert data["schema"] == "lingbot-isaac/episode" and data["schema_version"] == 1
    assert data["frame_count"] == 9 and data["lingbot_resolution"] == [480, 832]


def test_reads_the_reference_lingbot_examples(lingbot_examples):
    episode = read_episode(lingbot_examples / "00")
    assert episode.meta is None and episode.frame_count == 961
    np.testing.assert_array_equal(episode.poses, np.load(lingbot_examples / "00" / "poses.npy"))


def test_sim_frames_as_arrays_as_mp4_path_and_folder(tmp_path):
    frames = np.stack([image(48, 64) for _ in range(5)])
    out = write_episode(
        tmp_path / "a", trajectory(5), [50, 50, 32, 24], frames[0], "p", meta(48, 64), sim_frames=frames
    )
    episode = read_episode(out)
    assert episode.meta.sim_frames == "frames" and len(episode.sim_frame_files()) == 5
    copied = write_episode(
        tmp_path / "b",
        trajectory(5),
        [50, 50, 32, 24],
        frames[0],
        "p",
        meta(48, 64),
        sim_frames=out / "frames",
    )
    assert len(read_episode(copied).sim_frame_files()) == 5
    fake_mp4 = tmp_path / "sim.mp4"
    fake_mp4.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    video = write_episode(
        tmp_path / "c", trajectory(5), [50, 50, 32, 24], frames[0], "p", meta(48, 64), sim_frames=fake_mp4
    )
    assert read_episode(video).sim_frames_path == video / "sim.mp4"
    with pytest.raises(EpisodeError, match="got 4 frames for 5 poses"):
        write_episode(
            tmp_path / "d",
            trajectory(5),
            [50, 50, 32, 24],
            frames[0],
            "p",
            meta(48, 64),
            sim_frames=frames[:4],
        )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(poses=np.zeros((3, 4, 4))), "last row"),
        (dict(poses=np.ones((3, 3, 3))), r"\[N, 4, 4\]"),
        (dict(poses=np.stack([np.diag([2.0, 2, 2, 1])] * 3)), "not a proper rotation"),
        (dict(poses=np.stack([np.diag([1.0, 1, -1, 1])] * 3)), "not a proper rotation"),
        (dict(intrinsics=[0, 500, 300, 200]), "fx, fy must be > 0"),
        (dict(intrinsics=np.ones((2, 4))), r"\[3, 4\]"),
        (dict(prompt="  "), "prompt"),
        (dict(image=np.zeros((10, 10, 3), np.uint8)), "source_resolution"),
        (dict(image=b"not an image"), "not a readable image"),
        (dict(meta=meta(sim_times=[0.0])), "sim_times"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(tmp_path, change, match):
    args = dict(
        poses=np.stack([np.eye(4)] * 3),
        intrinsics=[900, 900, 640, 360],
        image=image(),
        prompt="p",
        meta=meta(),
    )
    args.update(change)
    with pytest.raises(EpisodeError, match=match):
        write_episode(tmp_path / "ep", **args)
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_needs_overwrite_and_is_replaced_whole(tmp_path):
    first = write_episode(
        tmp_path / "ep", trajectory(5), [900, 900, 640, 360], image(), "first", meta(), sim_frames=None
    )
    (first / "stale.txt").write_text("from an old recording")
    with pytest.raises(EpisodeError, match="already exists"):
        write_episode(tmp_path / "ep", trajectory(9), [900, 900, 640, 360], image(), "second", meta())
    write_episode(tmp_path / "ep", trajectory(9), [900, 900, 640, 360], image(), "second", meta(), overwrite=True)
    episode = read_episode(tmp_path / "ep")
    assert episode.prompt == "second" and episode.frame_count == 9
    assert not (tmp_path / "ep" / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ep"]  # no staging or backup folders left behind


def test_image_inputs_png_bytes_pil_rgba(tmp_path):
    rgba = np.dstack([image(48, 64), np.full((48, 64), 255, np.uint8)])
    png = tmp_path / "first.png"
    Image.fromarray(rgba[..., :3]).save(png)
    for i, img in enumerate([rgba, png, png.read_bytes(), Image.open(png)]):
        out = write_episode(tmp_path / f"e{i}", trajectory(5), [50, 50, 32, 24], img, "p", meta(48, 64))
        assert read_episode(out).image().shape == (48, 64, 3)


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda d: (d / "poses.npy").unlink(), "poses.npy: missing"),
        (lambda d: (d / "image.jpg").unlink(), "image.jpg"),
        (lambda d: (d / "prompt.txt").write_text("\n"), "empty"),
        (lambda d: np.save(d / "intrinsics.npy", np.ones((2, 4), np.float32)), r"\[5, 4\]"),
        (lambda d: (d / "poses.npy").write_bytes(b"garbage"), "not a readable .npy"),
        (lambda d: (d / "episode.json").write_text("{"), "not valid JSON"),
        (lambda d: _edit_json(d, schema_version=99), "upgrade lingbot-isaac"),
        (lambda d: _edit_json(d, frame_count=7), "frame_count 7"),
        (lambda d: _edit_json(d, source_resolution=[10, 10]), "source_resolution"),
        (lambda d: _edit_json(d, schema="other"), "'schema'"),
    ],
)
def test_read_names_what_is_wrong(tmp_path, damage, match):
    out = write_episode(tmp_path / "ep", trajectory(5), [900, 900, 640, 360], image(), "p", meta())
    damage(out)
    with pytest.raises(EpisodeError, match=match):
        read_episode(out)


def _edit_json(directory, **changes):
    path = directory / "episode.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_lingbot_intrinsics_rescale():
    np.testing.assert_allclose(to_model_intrinsics([100, 100, 50, 50], 240, 416), [200, 200, 100, 100])
