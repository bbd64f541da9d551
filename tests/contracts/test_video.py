"""contracts.video: the one mp4 reader and writer (rollouts, sim videos, comparison videos, previews)."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.video import DEFAULT_FPS, STILL_MAX_SIDE, VideoError, read_mp4, still_png, write_mp4
from tests.conftest import files_matching


def frames(count: int, height: int, width: int):
    ys, xs = np.mgrid[0:height, 0:width]
    for k in range(count):  # a generator: the writer streams
        yield np.stack([(xs * 3 + 9 * k) % 256, (ys * 5) % 256, np.full_like(xs, 30 * k % 256)], -1).astype(np.uint8)


def test_streamed_frames_round_trip_with_odd_sides_padded(tmp_path):
    path = write_mp4(tmp_path / "a" / "clip.mp4", frames(6, 33, 50), fps=12)
    decoded, fps = read_mp4(path)
    assert decoded.shape == (6, 34, 50, 3) and fps == pytest.approx(12)
    expected = np.stack(list(frames(6, 33, 50)))
    assert np.abs(decoded[:, :33].astype(int) - expected.astype(int)).mean() < 6
    assert np.abs(decoded[:, 33].astype(int) - decoded[:, 32].astype(int)).mean() < 6  # the edge row repeated
    assert [p.name for p in path.parent.iterdir()] == ["clip.mp4"]
    assert read_mp4(write_mp4(tmp_path / "b.mp4", frames(1, 16, 16)))[1] == pytest.approx(DEFAULT_FPS)


def test_a_quick_video_is_encoded_with_x264s_quick_settings_and_reads_back_the_same(tmp_path):
    """A chunk someone waits for (`quick`): veryfast, zerolatency (x264 writes its settings into the stream: a
    quick motion search, no B-frames); the rollouts' videos keep the default preset. Both decode to the same frames."""
    default = write_mp4(tmp_path / "default.mp4", frames(8, 32, 48))
    quick = write_mp4(tmp_path / "quick.mp4", frames(8, 32, 48), quick=True)
    assert b"subme=2 " in quick.read_bytes() and b"bframes=0 " in quick.read_bytes()
    assert b"subme=7 " in default.read_bytes() and b"bframes=3 " in default.read_bytes()
    expected = np.stack(list(frames(8, 32, 48))).astype(int)
    for path in (default, quick):
        decoded, _ = read_mp4(path)
        assert decoded.shape == expected.shape and np.abs(decoded.astype(int) - expected).mean() < 6


def test_bad_frames_are_refused_and_nothing_is_left(tmp_path):
    mixed = [next(frames(1, 16, 16)), np.zeros((16, 18, 3), np.uint8)]
    with pytest.raises(VideoError, match=r"frame 1 is uint8 \(16, 18, 3\)"):
        write_mp4(tmp_path / "mixed.mp4", mixed)
    with pytest.raises(VideoError, match="no frames"):
        write_mp4(tmp_path / "none.mp4", [])
    with pytest.raises(VideoError, match="uint8"):
        write_mp4(tmp_path / "float.mp4", [np.zeros((8, 8, 3), np.float32)])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(VideoError, match="no such video"):
        read_mp4(tmp_path / "missing.mp4")


def test_only_contracts_video_runs_the_codec():
    """One reader and one writer of mp4 files: nobody else calls imageio-ffmpeg's frame reader/writer."""
    where = files_matching(r"imageio_ffmpeg\.(?:read_frames|write_frames)\(")
    assert where == ["contracts/video.py"]


def test_a_still_is_a_png_scaled_down_to_fit_never_up():
    import io

    from PIL import Image

    frame = next(frames(1, 480, 832))
    still = Image.open(io.BytesIO(still_png(frame)))
    assert still.format == "PNG" and still.size == (STILL_MAX_SIDE, 240)  # (W, H): half the model frame
    # a box filter: each still pixel is the mean of its 2x2 block
    block_means = frame.reshape(240, 2, 416, 2, 3).astype(float).mean(axis=(1, 3))
    assert np.abs(np.asarray(still).astype(float) - block_means).max() <= 1
    small = next(frames(1, 48, 80))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(still_png(small)))), small)  # already small: as it is
    tall = Image.open(io.BytesIO(still_png(next(frames(1, 833, 100)))))
    assert tall.size == (50, STILL_MAX_SIDE)  # the long side fits, the aspect is kept
    with pytest.raises(VideoError, match="uint8"):
        still_png(np.zeros((8, 8), np.uint8))


def test_a_video_streamed_chunk_by_chunk_is_the_video_written_at_once(tmp_path):
    """`Mp4Stream`: the frames appended a chunk at a time (ffmpeg encoding meanwhile) make the same file as
    `write_mp4` of all of them, and it appears only at `commit`."""
    from contracts.video import Mp4Stream

    whole = np.stack(list(frames(13, 32, 48)))
    at_once = write_mp4(tmp_path / "once.mp4", whole)
    stream = Mp4Stream(tmp_path / "out" / "streamed.mp4")
    for start in (0, 1, 5, 9):  # a first chunk of 1 frame, then 4 at a time
        stream.append(whole[start : start + (1 if start == 0 else 4)])
        assert not (tmp_path / "out" / "streamed.mp4").exists()
    assert (stream.frames, stream.frame_shape) == (13, (32, 48, 3))
    path = stream.commit()
    assert [p.name for p in path.parent.iterdir()] == ["streamed.mp4"]
    assert np.array_equal(read_mp4(path)[0], read_mp4(at_once)[0])


def test_an_aborted_or_refused_stream_leaves_nothing(tmp_path):
    from contracts.video import Mp4Stream

    stream = Mp4Stream(tmp_path / "gone.mp4")
    stream.append(np.stack(list(frames(3, 16, 16))))
    with pytest.raises(VideoError, match=r"frame 3 is uint8 \(16, 18, 3\)"):
        stream.append(np.zeros((1, 16, 18, 3), np.uint8))
    stream.abort()
    with pytest.raises(VideoError, match="no frames"):
        Mp4Stream(tmp_path / "empty.mp4").commit()
    with pytest.raises(VideoError, match=r"uint8 \[f, H, W, 3\]"):
        Mp4Stream(tmp_path / "float.mp4").append(np.zeros((2, 8, 8, 3), np.float32))
    assert list(tmp_path.iterdir()) == []
