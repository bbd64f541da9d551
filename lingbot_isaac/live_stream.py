"""Live mode on the Isaac side: the window's Live button (docs/isaac-sim.md, "Live mode").

While the timeline plays, the chosen camera is sampled by the recorder (`recorder.Recorder`: the same
conventions, OpenCV axes, pinhole intrinsics, frame 0's pose is the first image's), resampled to the
model's frame rate as the episode writer does (`resample.interpolate_at` at t0 + k / 16 s: each model
frame is sent as soon as the sim has passed its time), and sent per chunk to a live job (the first 9
poses, then 12 a chunk: the poses each chunk of the Fast model waits for). The chunks come back as
`ChunkPreview`s (the server's still of each), with the lag in chunks: chunks whose poses were sent
but whose pixels have not arrived yet. Stop ends the job; the episode (the same poses, resampled the
same way) and the live job's rollout are written as an ordinary episode folder with its rollout, so
the comparison report works on it.

No omni imports (the extension's glue calls `on_step`); the network is on a thread of its own, so the
UI thread never waits on the server.
"""

from __future__ import annotations

import dataclasses
import io
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from contracts.model_frame import to_model_intrinsics
from contracts.settings import FIELD_BY_NAME
from lingbot_isaac.recorder import Capture, Recorder
from lingbot_isaac.resample import EPISODE_FPS, interpolate_at

FIRST_BATCH, CHUNK_POSES = 9, 12  # the Fast model's first chunk waits for 9 poses, each later one for 12 more


@dataclasses.dataclass(frozen=True)
class LiveChunkView:
    """One chunk of a live job as the window shows it."""

    job: str
    index: int
    total: int
    frames: int
    video: bytes  # the chunk's mp4
    still: bytes | None  # PNG of its last frame (the server's)
    lag_chunks: int  # chunks whose poses were sent when it arrived, minus the chunks arrived
    lag_s: float | None  # the server's pose-to-pixels latency of this chunk

    @property
    def label(self) -> str:
        lag = "" if self.lag_s is None else f", {self.lag_s:.1f} s after its poses"
        return f"Live chunk {self.index + 1}/{self.total}: {self.lag_chunks} chunk(s) behind{lag}"


class LiveStream:
    """One live job fed from a playing camera."""

    def __init__(
        self,
        stage,
        camera_path: str,
        resolution: tuple[int, int],
        prompt: str,
        settings: dict[str, Any],
        client_factory: Callable[[], Any],
        capture: Capture | None = None,
        on_chunk: Callable[[LiveChunkView], None] | None = None,
        fps: float = EPISODE_FPS,
    ) -> None:
        if settings.get("model") != "fast":
            raise ValueError("Live mode streams poses to LingBot-World-Fast: pick the model fast")
        if not prompt or not prompt.strip():
            raise ValueError("write a prompt first (what the scene is and how the camera moves)")
        self.recorder = Recorder(stage, camera_path, resolution, capture=capture)
        self.prompt, self.settings, self.fps = prompt.strip(), dict(settings), fps
        # the job's planned length, its frame limit: the window's Frames (else the settings' default)
        self.planned = int(settings.get("frame_num") or FIELD_BY_NAME["frame_num"].default)
        self.settings["frame_num"] = self.planned
        self.client_factory, self.on_chunk = client_factory, on_chunk
        self.sent = 0  # model frames handed to the sender
        self.next_batch = FIRST_BATCH
        self.chunks_sent = 0
        self.chunks: list[LiveChunkView] = []
        self.batches: list[np.ndarray] = []  # every batch sent, in order (float32, as on the wire)
        self.outbox: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.outcome: Any = None
        self.job_id: str | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.recorder.start()

    # -- the UI thread ---------------------------------------------------------------------------

    def on_step(self, sim_time: float, time_code: float | None = None) -> None:
        """A physics or render step while the timeline plays: sample, then send what is complete."""
        if not self.recorder.sample(sim_time, time_code):
            return
        times, poses, intrinsics = self.recorder.samples()
        if self.thread is None:  # the first image is there: open the job (on the sender thread)
            image = _jpeg(self.recorder.first_frame)
            height, width = self.recorder.resolution
            k = to_model_intrinsics(intrinsics[:1], height, width).astype(np.float32)
            self.thread = threading.Thread(target=self._send_all, args=(image, k), name="lingbot-live", daemon=True)
            self.thread.start()
        available = min(self.planned, int(np.floor((times[-1] - times[0]) * self.fps + 1e-6)) + 1)
        while available >= min(self.next_batch, self.planned) and self.sent < self.planned and len(times) >= 2:
            end = min(self.next_batch, self.planned)
            targets = times[0] + np.arange(self.sent, end) / self.fps
            batch = interpolate_at(times, poses, intrinsics, np.minimum(targets, times[-1])).poses
            self.batches.append(batch.astype(np.float32))
            self.outbox.put(("poses", self.batches[-1], end == self.planned))
            self.sent, self.next_batch = end, end + CHUNK_POSES
            self.chunks_sent += 1

    def cancel(self) -> None:
        """Cancel the live job (the chunks shown so far stay); never blocks."""
        self.recorder.recording = False
        self.outbox.put(("cancel",))

    def stop(self) -> None:
        """No more poses: the job makes the chunks it has the poses of, then its result."""
        self.recorder.recording = False
        if self.sent < self.planned:
            self.outbox.put(("end",))

    # -- the sender thread -----------------------------------------------------------------------

    def _send_all(self, image: bytes, intrinsics: np.ndarray) -> None:
        from bridge.client.job_events import Chunk
        from bridge.client.live_client import LiveJob

        def on_event(event: Any) -> None:
            if isinstance(event, Chunk):
                lag = (event.live or {}).get("lag_s")
                view = LiveChunkView(event.job, event.index, event.total, event.frames, event.video, event.still,
                                     max(0, self.chunks_sent - event.index - 1), lag)  # fmt: skip
                self.chunks.append(view)
                if self.on_chunk is not None:
                    self.on_chunk(view)

        try:
            with self.client_factory() as client:
                live = LiveJob.open(client, image, self.prompt, intrinsics, self.settings, want_stills=True,
                                    on_event=on_event)  # fmt: skip
                self.job_id = live.job.id
                while True:
                    item = self.outbox.get()
                    if item[0] == "end":
                        live.end()
                        break
                    if item[0] == "cancel":
                        live.cancel()
                        break
                    live.send_poses(item[1], end=item[2], timeout=600.0)
                    if item[2]:
                        break
                self.outcome = live.job.wait(timeout=None)
        except BaseException as exc:  # the window shows it
            self.error = exc
        finally:
            self.done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """The job's outcome (Result or JobError) once it ended; raises what the sender met."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"the live job did not end within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.outcome

    def write(self, folder: Path, name_prompt: str | None = None) -> tuple[Path, Path]:
        """The episode (the poses the stream sent, resampled the same way) and the live rollout beside
        it: an ordinary episode folder. -> (episode folder, rollout.mp4)."""
        from bridge.client.job_events import Result
        from contracts.episode import write_rollout

        outcome = self.wait()
        if not isinstance(outcome, Result):
            raise RuntimeError(f"the live job ended with {outcome.code}: {outcome.message}")
        frames = int(outcome.provenance["output"]["frames"]) if outcome.provenance else self.sent
        episode = self.recorder_episode(folder, frames)
        info = {"id": self.job_id, "mode": "live", "provenance": outcome.provenance}
        return episode, write_rollout(episode, outcome.video, info, client="extension")

    def recorder_episode(self, folder: Path, frames: int) -> Path:
        from lingbot_isaac.recording import write_recording_episode

        recording = self.recorder.stop()
        return write_recording_episode(recording, folder, self.prompt, fps=self.fps, max_frames=frames,
                                       generation=self.settings)  # fmt: skip


def _jpeg(frame: np.ndarray) -> bytes:
    """The first frame as the episode writer stores it (JPEG, `contracts.episode.JPEG_QUALITY`, 4:4:4)."""
    from PIL import Image

    from contracts.episode import JPEG_QUALITY

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(frame, dtype=np.uint8)).save(buffer, "JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buffer.getvalue()
