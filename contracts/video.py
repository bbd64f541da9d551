"""Video files: uint8 RGB frames [F, H, W, 3] <-> H.264 mp4, read and written in one place.

Every video of the project is this format: rollouts (worldgen), sim videos (the Isaac side's
recorder and the sample episode), comparison side-by-sides, `submit --follow`'s growing preview.
H.264 in yuv420p (plays in every browser and player), `+faststart` (the index first: a browser
starts playing before the whole file has arrived), one quality (`CRF`), written atomically
(`contracts.atomic`: temp file beside it, rename; durable unless asked otherwise). yuv420p needs
even sides: odd frames are padded by repeating their last row or column, never rescaled.

imageio-ffmpeg (it bundles an ffmpeg binary) is imported only when a video is read or written: it
is an optional dependency (the `gen` and `compare` extras); `have_codec()` says whether it is here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from contracts import atomic
from contracts.settings import FIELD_BY_NAME

DEFAULT_FPS = FIELD_BY_NAME["fps"].default  # a video without a rate of its own plays at LingBot's
CRF = 18  # x264 constant rate factor: near-transparent at 480x832 (lower: larger files)
# x264's speed for a video written while someone waits for it (a chunk of a live view, a growing preview): at
# CRF 18 a 16-frame 464x832 chunk of the sample room took 0.13 s on a 2-core host against the default preset's
# 0.41 s, at a similar size (599 against 584 KiB); the whole rollouts keep the default (their numbers are compared)
QUICK_X264 = ("-preset", "veryfast", "-tune", "zerolatency")


class VideoError(ValueError):
    """A video that cannot be read, or frames that cannot be written; the message names the file."""


def have_codec() -> bool:
    """Whether videos can be read and written here (imageio-ffmpeg installed)."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def pad_to_even(frame: np.ndarray) -> np.ndarray:
    """Repeat the last row/column where a side is odd (H.264 yuv420p needs even sizes)."""
    height, width = frame.shape[:2]
    if not (height % 2 or width % 2):
        return frame
    return np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def write_mp4(
    path: str | os.PathLike,
    frames: Iterable[np.ndarray],
    fps: float = DEFAULT_FPS,
    durable: bool = True,
    quick: bool = False,
) -> Path:
    """Encode uint8 RGB frames [H, W, 3] (any iterable: they are streamed to ffmpeg) to `path`,
    atomically; returns the path (`quick`: x264's `QUICK_X264`, for a video someone is waiting for). Refused
    (VideoError, nothing written): no frames, frames that are not uint8 RGB, frames of different shapes."""
    stream = Mp4Stream(path, fps, durable, quick)
    try:
        for frame in frames:
            stream.append(np.asarray(frame)[None])
        return stream.commit()
    finally:
        stream.abort()


class Mp4Stream:
    """An mp4 written as its frames come (`append`, a few frames at a time, ffmpeg encoding them meanwhile): a long
    video is never held whole (a 4,097-frame live job at 464x832 is 4.7 GB of uint8 frames). The file appears at
    `path` at `commit` only, atomically, as `write_mp4`'s does; `abort` (or a failure) leaves nothing there. `frames`
    and `frame_shape` say what was appended."""

    def __init__(self, path: str | os.PathLike, fps: float = DEFAULT_FPS, durable: bool = True, quick: bool = False):
        self.path, self.fps, self.durable, self.quick = Path(path), fps, durable, quick
        self.frames = 0
        self.frame_shape: tuple[int, int, int] | None = None  # (H, W, 3) of the first frame appended
        self._tmp: Path | None = None
        self._writer = None

    def append(self, frames: np.ndarray) -> None:
        """uint8 RGB frames [f, H, W, 3], every one the shape of the first appended (VideoError otherwise)."""
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
            raise VideoError(f"{self.path}: frames must be uint8 [f, H, W, 3] RGB, got {frames.dtype} {frames.shape}")
        if self._writer is None:
            self._open(frames.shape[1:])
        if frames.shape[1:] != self.frame_shape:
            raise VideoError(
                f"{self.path}: frame {self.frames} is {frames.dtype} {frames.shape[1:]}; every frame must be uint8 "
                f"{self.frame_shape}"
            )
        for frame in frames:
            self._writer.send(np.ascontiguousarray(pad_to_even(frame)))
            self.frames += 1

    def _open(self, shape: tuple[int, int, int]) -> None:
        import imageio_ffmpeg

        self.frame_shape = tuple(shape)
        height, width = pad_to_even(np.zeros(shape, dtype=np.uint8)).shape[:2]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = atomic.temp_path(self.path)
        self._writer = imageio_ffmpeg.write_frames(
            str(self._tmp),
            (width, height),
            fps=self.fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=None,  # the rate is CRF's
            macro_block_size=1,  # keep the exact (even) size
            output_params=["-crf", str(CRF), *(QUICK_X264 if self.quick else ()), "-movflags", "+faststart"],
            ffmpeg_log_level="error",
        )
        self._writer.send(None)  # start ffmpeg

    def commit(self) -> Path:
        """Finish the file and put it at `path` (VideoError where no frame came)."""
        if self._writer is None:
            raise VideoError(f"{self.path}: no frames to write")
        writer, self._writer = self._writer, None
        try:
            writer.close()  # ffmpeg finishes the file (with +faststart, the index moved first)
        except BaseException:
            self._tmp.unlink(missing_ok=True)
            raise
        atomic.commit(self._tmp, self.path, self.durable)
        self._tmp = None
        return self.path

    def abort(self) -> None:
        """Stop ffmpeg and remove what it wrote; nothing at `path` (a no-op after `commit`)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None


STILL_MAX_SIDE = 416  # a chunk's still (`still_png`): half the 832-pixel model frame on its long side


def still_png(frame: np.ndarray, max_side: int = STILL_MAX_SIDE) -> bytes:
    """One uint8 RGB frame [H, W, 3] as a small PNG: scaled down (never up) to fit `max_side` on its
    long side, aspect kept. A chunk's preview still (the worker makes it from the frames it has, so a
    client shows it without a video decoder: omni.ui.Image shows PNG files, not videos)."""
    import io

    from PIL import Image

    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise VideoError(f"a still must be one uint8 [H, W, 3] RGB frame, got {frame.dtype} {frame.shape}")
    image = Image.fromarray(frame)
    height, width = frame.shape[:2]
    scale = max_side / max(height, width)
    if scale < 1:
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BOX)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def read_mp4(path: str | os.PathLike) -> tuple[np.ndarray, float]:
    """Decode every frame of `path`: (uint8 RGB frames [F, H, W, 3], frames per second)."""
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such video file")
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        meta = next(reader)
        width, height = meta["size"]
        frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
    except (RuntimeError, OSError, StopIteration) as exc:
        # ffmpeg's message is its whole banner; its last line says what went wrong
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(exc).__name__
        raise VideoError(f"{path}: cannot decode video ({reason}); expected an mp4 video file") from exc
    if not frames:
        raise VideoError(f"{path}: the video has no frames")
    return np.stack(frames), float(meta.get("fps") or DEFAULT_FPS)
