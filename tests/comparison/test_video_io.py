"""mp4 and PNG-folder round trips through imageio-ffmpeg and OpenCV."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from comparison.video_io import VideoError, read_frame_folder, read_video, write_video


def gradient_frames(count: int, height: int, width: int) -> np.ndarray:
    ys, xs = np.mgrid[0:height, 0:width]
    return np.stack(
        [
            np.stack([(xs * 3 + 10 * k) % 256, (ys * 4) % 256, np.full_like(xs, 40 * k % 256)], axis=-1)
            for k in range(count)
        ]
    ).astype(np.uint8)


def test_write_then_read_round_trip(tmp_path):
    frames = gradient_frames(5, 64, 96)
    path = write_video(tmp_path / "sub" / "clip.mp4", frames, fps=16)
    decoded, fps = read_video(path)
    assert decoded.shape == frames.shape and fps == pytest.approx(16)
    # lossy H.264 / yuv420p: close, not equal
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 6
    assert [p.name for p in path.parent.iterdir()] == ["clip.mp4"], "no temporary file left behind"


def test_odd_sizes_are_padded_not_rescaled(tmp_path):
    frames = gradient_frames(3, 33, 51)
    decoded, _ = read_video(write_video(tmp_path / "odd.mp4", frames))
    assert decoded.shape == (3, 34, 52, 3)
    assert np.abs(decoded[:, :33, :51].astype(int) - frames.astype(int)).mean() < 6


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(VideoError, match="no such video"):
        read_video(tmp_path / "missing.mp4")
    (tmp_path / "junk.mp4").write_bytes(b"not a video at all")
    with pytest.raises(VideoError, match="cannot decode"):
        read_video(tmp_path / "junk.mp4")
    with pytest.raises(VideoError, match="uint8"):
        write_video(tmp_path / "float.mp4", np.zeros((2, 8, 8, 3), np.float32))
    assert not list(tmp_path.glob("*float*")), "a refused write leaves nothing behind"


def test_frame_folder_in_name_order(tmp_path):
    frames = gradient_frames(3, 20, 30)
    for k in (2, 0, 1):
        cv2.imwrite(str(tmp_path / f"{k:05d}.png"), cv2.cvtColor(frames[k], cv2.COLOR_RGB2BGR))
    assert np.array_equal(read_frame_folder(tmp_path), frames)  # PNG is lossless
    jpegs = tmp_path / "jpegs"  # the episode format's frames/ holds 000000.jpg, 000001.jpg, ...
    jpegs.mkdir()
    for k in range(3):
        cv2.imwrite(str(jpegs / f"{k:06d}.jpg"), cv2.cvtColor(frames[k], cv2.COLOR_RGB2BGR))
    assert np.abs(read_frame_folder(jpegs).astype(int) - frames.astype(int)).mean() < 4
    with pytest.raises(VideoError, match="no PNG or JPEG"):
        read_frame_folder(tmp_path / "empty")
