"""One live rollout (model fast) from a live job's folder: the first frame, prompt and intrinsics in
`episode_dir`, the camera path arriving as pose batches in `live_dir` (bridge.server.live_jobs writes them;
their names are `bridge.workers.worker_protocol.LIVE_BATCH_FILE` and `LIVE_END_FILE`, handed in by the worker). Chunk k starts as soon as the poses it
needs are there (`worldgen.pipelines.fast_live`, which also says how the live video relates to the
batch video of the same poses). Like `worldgen.rollout.generate_episode`, it writes the mp4 and its
provenance record beside it (with a `live` section: the poses and start time of every chunk), and the
poses it used as the episode's `poses.npy`, so the job's folder is an ordinary episode + rollout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from contracts import atomic, episode
from contracts.provenance import write_record
from contracts.settings import GenerationSettings
from contracts.video import Mp4Stream
from worldgen.errors import InputError
from worldgen.pipelines.base import Progress
from worldgen.pipelines.fast_live import LiveCamera, live_frames, poses_needed
from worldgen.pipelines.request import resolve_request
from worldgen.rollout import find_image, generate_noting, mp4_only, read_prompt, rollout_record, streamed_shape
from worldgen.video_out import frames_shape, write_mp4

WAIT_TICK_S = 0.5  # while waiting for poses: re-read the folder and report progress this often


class LivePoseFeed:
    """The poses of a live job as they appear in its folder. `wait(count)` blocks until `count` are
    there (or the feed ended); `nudge()` (the worker's reader thread, on `live_poses`) wakes it."""

    def __init__(self, live_dir: Path, keep_alive: Callable[[int, int], None], batch_file: str, end_file: str) -> None:
        self.live_dir = Path(live_dir)
        self.batch_file, self.end_file = batch_file, end_file  # "poses-{seq:06d}.npy", "end"
        self.keep_alive = keep_alive  # (held, needed): a progress report; it raises to cancel the job
        self.batches: list[np.ndarray] = []
        self.held = 0
        self.ended = False
        self.wake = threading.Event()

    def nudge(self) -> None:
        self.wake.set()

    def _read(self) -> None:
        while True:
            path = self.live_dir / self.batch_file.format(seq=len(self.batches))
            if not path.is_file():
                break
            batch = episode.check_poses(np.load(path, allow_pickle=False), f"live pose batch {path.name}")
            self.batches.append(batch.astype(np.float32))
            self.held += len(batch)
        self.ended = (self.live_dir / self.end_file).exists()

    def count(self) -> int:
        """How many poses are there now (the folder read again; never waits)."""
        self._read()
        return self.held

    def poses(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else np.zeros((0, 4, 4), np.float32)

    def wait(self, count: int) -> np.ndarray | None:
        self._read()
        while self.held < count and not self.ended:
            self.keep_alive(self.held, count)
            self.wake.wait(WAIT_TICK_S)
            self.wake.clear()
            self._read()
        return self.poses() if self.held >= count else None


def generate_live_episode(
    pipe,
    episode_dir: Path,
    feed: LivePoseFeed,
    settings: GenerationSettings,
    output_path: Path,
    progress: Progress | None = None,
    on_chunk=None,
    on_plan: Callable[[list[int], int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> tuple[Path, int]:
    """The live rollout of `feed`'s poses; -> (the mp4, its frame count). `on_plan(poses_needed,
    frames)` first; `on_start(chunk, poses)` as each chunk starts; `on_chunk` as `generate_episode`."""
    if settings.model != "fast":
        raise InputError(f"a live job needs model fast (got {settings.model!r})")
    folder = Path(episode_dir)
    intrinsics = episode.load_npy(folder / episode.INTRINSICS_FILE, "[1, 4] fx, fy, cx, cy")
    image_path = find_image(folder)
    from worldgen.pipelines.image_input import load_image

    image = load_image(image_path)
    prompt = read_prompt(folder)
    n = pipe.family.chunk_frames  # latent frames a chunk: the model family's (3 for v1 Fast, 4 for 2.0)
    frames = live_frames(settings.frame_num, n)
    chunks = frames.latent_frames // n
    needed = [poses_needed(frames, c, n) for c in range(chunks)]
    if on_plan is not None:
        on_plan(needed, frames.frames)
    resolved = resolve_request(settings, (image.height, image.width), frames.pose_frames)
    height, width = resolved.height, resolved.width
    starts: list[dict] = []

    def started(chunk: int, poses: int) -> None:
        starts.append({"index": chunk, "poses": poses, "started_at": round(time.time(), 4)})
        if on_start is not None:
            on_start(chunk, poses)

    camera = LiveCamera(
        feed.wait, intrinsics, frames, height, width, chunk_frames=n, on_start=started,
        translation_scale=settings.translation_scale, held=feed.count,
    )  # fmt: skip
    path = Path(output_path)
    mp4 = Mp4Stream(path, fps=settings.fps)  # each chunk's frames go there as they come: a live video of any length
    try:  # holds none of them
        first_phase, t0 = len(pipe.meter.records), time.perf_counter()
        extra = {} if on_chunk is None else {"on_chunk": on_chunk}
        extra.update(mp4_only(pipe, mp4))  # only the mp4 is written: the uint8 frames, a quarter of the float32 video
        video, notes = generate_noting(
            pipe, image, prompt, None, None, settings, progress=progress, camera=camera, **extra
        )
        used = starts[-1]["poses"]
        if progress:
            progress("write", 0, 1)
        atomic.write_bytes(folder / episode.POSES_FILE, _npy(feed.poses()[:used]))  # the episode, complete
        shape = streamed_shape(mp4) or frames_shape(video)
        record = rollout_record(
            pipe,
            settings,
            resolved,
            producer="worker",
            phases=pipe.meter.records[first_phase:],
            video_shape=shape,
            notes=notes,
            inputs={
                "episode": folder.name,
                "image": image_path.name,
                "image_size": [image.width, image.height],
                "poses": used,
                "prompt": prompt,
            },  # fmt: skip
            timings={"generate_s": round(time.perf_counter() - t0, 3)},
        )
        # a live job (the server adds its own timings under the same key: bridge/server/live_jobs.py)
        record["live"] = {"planned_frames": frames.frames, "poses_needed": needed, "poses_held": feed.held,
                          "chunk_starts": starts}  # fmt: skip
        write_record(path, record)  # the record first: a video never exists without one
        path = mp4.commit() if streamed_shape(mp4) else write_mp4(video, path, fps=settings.fps)
    finally:
        mp4.abort()  # after a failure: nothing half-written (a no-op once committed)
    if progress:
        progress("write", 1, 1)
    return path, shape[0]


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float32))
    return buffer.getvalue()
