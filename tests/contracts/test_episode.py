"""contracts.episode: the one validator's rules, and the reader/writer round trip."""

from __future__ import annotations

import numpy as np
import pytest

from contracts import episode
from contracts.episode import EpisodeError, EpisodeMeta, check_action, load_action, read_episode, write_episode


def walk(n: int = 9) -> np.ndarray:
    poses = np.repeat(np.eye(4)[None], n, axis=0)
    poses[:, 2, 3] = np.arange(n) * 0.1
    return poses


def test_round_trip(tmp_path):
    image = np.zeros((48, 64, 3), np.uint8)
    folder = write_episode(tmp_path / "ep", walk(5), [50, 50, 32, 24], image, " go ", EpisodeMeta((48, 64)))
    read = read_episode(folder)
    assert read.frame_count == 5 and read.prompt == "go" and read.intrinsics.shape == (5, 4)
    np.testing.assert_allclose(read.intrinsics[0], [50 * 832 / 64, 50 * 480 / 48, 32 * 832 / 64, 24 * 480 / 48])
    assert [p.name for p in tmp_path.iterdir()] == ["ep"]


def test_rigid_tolerance_is_one_constant(monkeypatch):
    poses = walk()
    poses[3, 3, 0] = 5e-6
    with pytest.raises(EpisodeError, match="pose 3 has last row"):
        check_action(poses, [500, 500, 416, 240])
    monkeypatch.setattr(episode, "RIGID_TOLERANCE", 1e-5)
    check_action(poses, [500, 500, 416, 240])


def test_one_intrinsics_rule(tmp_path):
    row = np.array([500, 500, 416, 240.0])
    for shape_ok in (row, row[None], np.tile(row, (9, 1))):
        assert check_action(walk(), shape_ok)[1].shape in ((1, 4), (9, 4))
    with pytest.raises(EpisodeError, match=r"has 2 rows but there are 9 poses; need shape \[9, 4\]"):
        check_action(walk(), np.tile(row, (2, 1)))
    # a reader of the folder gets [N, 4] either way
    folder = tmp_path / "a"
    folder.mkdir()
    np.save(folder / "poses.npy", walk().astype(np.float32))
    np.save(folder / "intrinsics.npy", row.astype(np.float32))
    (folder / "prompt.txt").write_text("p")
    (folder / "image.png").write_bytes(episode.PNG_MAGIC)
    assert read_episode(folder).intrinsics.shape == (9, 4)


def test_minimum_pose_count_is_named():
    check_action(walk(1), [500, 500, 416, 240])
    with pytest.raises(EpisodeError, match=r"has 4 poses; at least 5 are needed \(a video"):
        check_action(walk(4), [500, 500, 416, 240], min_poses=episode.GENERATE_MIN_POSES)


def test_load_action_names_the_file(tmp_path):
    with pytest.raises(EpisodeError, match=r"poses\.npy: missing \(file not found\)"):
        load_action(tmp_path)


def test_meta_refuses_bad_generation_and_sim_frames(tmp_path):
    data = EpisodeMeta((48, 64)).to_json(5)
    with pytest.raises(EpisodeError, match="'generation' must be an object"):
        EpisodeMeta.from_json({**data, "generation": "fast please"}, "episode.json")
    with pytest.raises(EpisodeError, match="sim_frames is 'video.avi'"):
        EpisodeMeta.from_json({**data, "sim_frames": "video.avi"}, "episode.json")
