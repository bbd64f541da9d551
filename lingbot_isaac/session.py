"""What the "LingBot World" window drives: record, stop, generate off the UI thread, report status.

No omni imports, so it runs (and is tested) outside Isaac Sim. The Kit side forwards sim steps
(`on_step`) and reads `status()` once per frame; everything slow (writing the episode aside, the
server round trip, the comparison report) happens on a worker thread, and results come back
through the status object. The one callback, `on_chunk`, hands each finished chunk of a Fast job
(`ChunkPreview`: its place, its mp4 and a still of its last frame, on disk) to whoever shows it;
it runs on the worker thread, so a UI only keeps the preview there and draws it on its own thread.
The job itself is followed by `bridge.client.follow.submit_and_follow`, the same loop as `submit` and
`replay`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH
from lingbot_isaac.recorder import Capture, Recorder, RecorderError


@dataclass
class SessionSettings:
    """The Settings panel. `frame_num` etc. override the server's preset only when set."""

    server: str = DEFAULT_ENDPOINT
    output_dir: Path = field(default_factory=lambda: Path.home() / "lingbot_episodes")
    width: int = MODEL_WIDTH
    height: int = MODEL_HEIGHT
    sample_on: str = "render"  # "render": every app update; "physics": every physics step
    keep_sim_frames: bool = False  # also keep every frame (sim.mp4/frames) for the comparison
    max_seconds: float = 30.0  # recording stops by itself after this much sim time
    frame_num: int | None = None
    steps: int | None = None
    seed: int | None = None
    preset: str | None = None  # send all settings of this preset instead of the server's
    model: str | None = None  # base | fast (contracts.engine_options.MODELS), per job; None: the server's
    gpus: int | None = None  # 1 | 2 GPUs per job (contracts.settings `gpus`); None: the server's preset
    timeout: float = REQUEST_TIMEOUT_S  # seconds per request to the server
    compare: bool = True  # build the sim-vs-rollout report when sim frames exist
    first_frame: Path | None = None  # a real photo to start the rollout from (`first_frame.with_photo`)
    photo_intrinsics: str | None = None  # "fx,fy,cx,cy" of that photo in its pixels (default: the sim camera's)

    def generation(self) -> dict[str, Any]:
        from contracts.settings import GenerationSettings, load_settings

        settings: dict[str, Any] = load_settings(preset=self.preset).to_dict() if self.preset else {}
        flags = {
            "frame_num": self.frame_num,
            "steps": self.steps,
            "seed": self.seed,
            "model": self.model,
            "gpus": self.gpus,
        }
        settings.update({k: v for k, v in flags.items() if v is not None})
        GenerationSettings.from_dict(settings)  # SettingsError names a bad value now, not on the server
        return settings


@dataclass(frozen=True)
class ChunkPreview:
    """One finished chunk of a Fast job, as the window shows it (files in the episode's
    `preview/` folder, replaced by the next generation; the final rollout.mp4 holds every frame)."""

    job: str
    index: int  # 0-based, in order
    total: int  # chunks in the whole video
    frames: int  # video frames in this chunk
    frames_so_far: int  # video frames in this chunk and every one before it
    video: Path  # this chunk's mp4
    image: Path | None  # its last frame as PNG, small (None: an older server sent none and no decoder here)
    lag_chunks: int | None = None  # Live mode: chunks whose poses were sent but whose pixels have not come

    @property
    def label(self) -> str:
        lag = "" if self.lag_chunks is None else f", {self.lag_chunks} chunk(s) behind the sim"
        return f"Chunk {self.index + 1}/{self.total} ready: {self.frames_so_far} frames so far{lag}"


PREVIEW_DIR = "preview"  # in the episode folder: the chunks of the generation under way


@dataclass(frozen=True)
class Status:
    state: str = "idle"  # idle | recording | saving | generating | done | failed
    message: str = "Pick a camera, write a prompt, press Record and play the simulation."
    progress: float = 0.0  # 0..1 of the current phase
    episode: Path | None = None
    result: Path | None = None  # rollout.mp4
    report: Path | None = None  # comparison report, when made
    error: str | None = None
    serial: int = 0  # bumps on every change, so the UI redraws only when needed


class Session:
    def __init__(
        self,
        settings: SessionSettings | None = None,
        build_report: Callable[[Path, Path, Path], Path] | None = None,
        on_chunk: Callable[[ChunkPreview], None] | None = None,
    ) -> None:
        """`build_report(episode, rollout, out_dir) -> report.html`: how comparison reports are made
        (default: `compare_with_cli`, the CLI in its own process; `SessionSettings.compare` turns
        reports off). `on_chunk(preview)`: each finished chunk of a Fast job, in order, before the
        result (on the worker thread; keep it short); none after a cancel."""
        self.settings = settings or SessionSettings()
        self.build_report = build_report if build_report is not None else compare_with_cli
        self.on_chunk = on_chunk
        self._lock = threading.Lock()
        self._status = Status()
        self._recorder: Recorder | None = None
        self._worker: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._run = 0  # bumps on generate() and cancel(): a worker thread of an older run stays silent
        self._live = None  # Live mode's stream (lingbot_isaac.live_stream.LiveStream) while it runs

    # -- status (any thread) ----------------------------------------------------------------------

    def status(self) -> Status:
        with self._lock:
            return self._status

    def _set(self, run: int | None = None, **changes: Any) -> None:
        """Change the status; from a worker thread (`run` given) only while its run is current."""
        with self._lock:
            if run is not None and run != self._run:
                return  # cancelled meanwhile: the UI has moved on
            self._status = replace(self._status, serial=self._status.serial + 1, **changes)

    @property
    def busy(self) -> bool:
        return self.status().state in ("recording", "saving", "generating")

    # -- recording (UI thread) --------------------------------------------------------------------

    def start_recording(self, stage, camera_path: str, capture: Capture | None = None) -> Recorder:
        if self.busy:
            raise RecorderError(f"busy ({self.status().state}); wait or stop first")
        settings = self.settings
        self._recorder = Recorder(
            stage,
            camera_path,
            (settings.height, settings.width),
            capture=capture,
            keep_frames=settings.keep_sim_frames,
            max_seconds=settings.max_seconds,
        )
        self._recorder.start()
        self._set(
            state="recording",
            message=f"Recording {camera_path}: play the simulation.",
            progress=0.0,
            error=None,
            result=None,
            report=None,
        )
        return self._recorder

    def on_step(self, sim_time: float, time_code: float | None) -> None:
        """Forwarded from the physics or render step subscription while recording (or live)."""
        live = self._live
        if live is not None and live.recorder.recording:
            live.on_step(sim_time, time_code)
            return
        recorder = self._recorder
        if recorder is None or not recorder.recording:
            return
        if recorder.sample(sim_time, time_code) and recorder.sample_count % 10 == 0:
            seconds = recorder.seconds
            self._set(
                message=f"Recording: {recorder.sample_count} steps, {seconds:.2f} s of sim time",
                progress=min(1.0, seconds / self.settings.max_seconds),
            )
        if not recorder.recording:  # max_seconds reached
            self._set(message=f"Recording stopped after {self.settings.max_seconds:g} s; press Stop to save.")

    def stop_recording(self, prompt: str, name: str | None = None, scene_id: str | None = None) -> Path:
        """Write the episode (on this thread: it is a few small files) and return its folder."""
        recorder = self._recorder
        if recorder is None:
            raise RecorderError("not recording; press Record first")
        if not prompt or not prompt.strip():
            raise RecorderError("write a prompt first (what the scene is and how the camera moves)")
        self._set(state="saving", message="Writing the episode ...")
        folder = self.settings.output_dir / (name or time.strftime("episode_%Y%m%d_%H%M%S"))
        try:
            episode = recorder.write_episode(
                folder, prompt.strip(), generation=self.settings.generation() or None, scene_id=scene_id
            )
        except Exception as exc:
            self._recorder = None
            self._set(state="failed", message=f"Could not save: {exc}", error=str(exc))
            raise
        self._recorder = None
        self._set(state="idle", message=f"Saved {episode}", episode=episode, progress=1.0)
        return episode

    # -- live mode (UI thread; the network on the stream's own thread) ---------------------------

    @property
    def live(self) -> bool:
        return self._live is not None

    def start_live(self, stage, camera_path: str, prompt: str, capture: Capture | None = None,
                   client_factory: Callable[[], Any] | None = None) -> None:  # fmt: skip
        """Live: the camera's poses go to a live job chunk by chunk as the timeline plays; each chunk's
        still comes back to `on_chunk` with the lag in chunks (lingbot_isaac.live_stream)."""
        from bridge.client.client import Client
        from lingbot_isaac.live_stream import LiveStream

        if self.busy:
            raise RecorderError(f"busy ({self.status().state}); wait or stop first")
        settings = self.settings
        previews = _Previews(settings.output_dir / ".live_preview")
        with self._lock:
            self._run += 1
            run = self._run

        def on_chunk(view) -> None:  # the stream's thread
            preview = replace(previews.add(view), lag_chunks=view.lag_chunks)
            self._set(run, message=preview.label, progress=(view.index + 1) / max(view.total, 1))
            if self.on_chunk is not None and run == self._run:
                self.on_chunk(preview)

        if client_factory is None:
            from bridge.client.reach import check_listening

            check_listening(settings.server)
        factory = client_factory or (lambda: Client(settings.server, timeout=settings.timeout))
        self._live = LiveStream(stage, camera_path, (settings.height, settings.width), prompt,
                                settings.generation(), factory, capture=capture, on_chunk=on_chunk)  # fmt: skip
        self._set(state="recording", message=f"Live: {camera_path}; play the simulation, chunks come as they are made.",
                  progress=0.0, error=None, result=None, report=None)  # fmt: skip

    def stop_live(self, name: str | None = None) -> None:
        """End the live job; its episode and rollout are written on a worker thread (the UI goes on)."""
        live, self._live = self._live, None
        if live is None:
            raise RecorderError("Live mode is not running")
        live.stop()
        folder = self.settings.output_dir / (name or time.strftime("live_%Y%m%d_%H%M%S"))
        run = self._run
        self._set(state="generating", message="Live: the last chunks ...")

        def finish() -> None:
            try:
                episode, result = live.write(folder)
                report = self._report(episode, result, run)
                self._set(run, state="done", message=f"Live rollout written: {result}", progress=1.0,
                          episode=episode, result=result, report=report)  # fmt: skip
            except Exception as exc:
                self._set(run, state="failed", message=f"Live mode failed: {exc}", error=str(exc))

        self._worker = threading.Thread(target=finish, name="lingbot-live-finish", daemon=True)
        self._worker.start()

    # -- generation (worker thread) --------------------------------------------------------------

    def generate(self, episode: Path | None = None, client_factory: Callable[[], Any] | None = None) -> None:
        """Send `episode` (default: the last one saved) to the server on a worker thread."""
        episode = episode or self.status().episode
        if episode is None:
            raise RecorderError("no episode yet: record one (Record, play, Stop) or pick a folder")
        if self.busy:
            raise RecorderError(f"busy ({self.status().state}); wait for it to finish or cancel")
        self.settings.generation()  # a bad setting (SettingsError names it) is refused here, not on the server
        with self._lock:
            self._run += 1
            run = self._run
        self._cancelled = threading.Event()  # each run has its own: an abandoned thread keeps its own set
        self._set(
            state="generating",
            message=f"Connecting to {self.settings.server} ...",
            progress=0.0,
            episode=Path(episode),
            error=None,
            result=None,
            report=None,
        )
        self._worker = threading.Thread(
            target=self._generate,
            args=(Path(episode), client_factory, run, self._cancelled),
            name="lingbot-generate",
            daemon=True,
        )
        self._worker.start()

    def wait(self, timeout: float | None = None) -> Status:
        if self._worker is not None:
            self._worker.join(timeout)
        return self.status()

    def cancel(self) -> None:
        """Stop the current generation. Never blocks (Kit's UI thread calls it): the session is
        free at once; the worker thread asks the server to cancel the job (bounded by the
        request timeout, even if the server is gone) and closes its connection by itself."""
        with self._lock:
            generating = self._status.state == "generating" or self._live is not None
            self._run += 1
        self._cancelled.set()
        live, self._live = self._live, None
        if live is not None:  # Live mode: the job is cancelled on the stream's own thread
            live.cancel()
        if generating:
            self._set(state="failed", message="Cancelled.", error="cancelled", progress=0.0)

    def shutdown(self, timeout: float = 1.0) -> None:
        """For the extension's on_shutdown: cancel, then wait at most `timeout` s for the worker
        thread (a daemon thread: it cannot keep Kit from exiting either way)."""
        self.cancel()
        worker = self._worker
        if worker is not None:
            worker.join(max(0.0, timeout))

    def _generate(
        self, episode: Path, client_factory: Callable[[], Any] | None, run: int, cancelled: threading.Event
    ) -> None:
        from bridge.client.client import Client
        from bridge.client.client_errors import JobFailed, RequestFailed, ServerUnavailable
        from bridge.client.episode_payload import EpisodePayload
        from bridge.client.follow import submit_and_follow
        from contracts.episode import read_episode, write_rollout
        from contracts.settings import job_settings
        from lingbot_isaac.first_frame import first_frame_record, parse_intrinsics, with_photo

        timeout = self.settings.timeout
        previews = _Previews(episode / PREVIEW_DIR)

        def on_progress(event: Any) -> None:
            done = event.step / max(event.total, 1)
            if event.phase == "chunk":  # the chunk's own line (on_chunk, just before) says more
                self._set(run, progress=done)
            else:
                self._set(run, message=_describe(event), progress=done)

        def on_chunk(chunk: Any) -> None:  # on this worker thread, between the job's events
            done = (chunk.index + 1) / max(chunk.total, 1)
            try:
                preview = previews.add(chunk)
            except OSError as exc:  # a preview that cannot be written (disk full ...) never stops the job
                self._set(run, message=f"Chunk {chunk.index + 1}/{chunk.total} ready; no preview: {exc}", progress=done)
                return
            self._set(run, message=preview.label, progress=done)
            callback = self.on_chunk
            if callback is not None and run == self._run:  # a cancelled run shows nothing more
                callback(preview)

        try:
            if self.settings.first_frame is not None:
                self._set(message=f"Fitting {self.settings.first_frame.name} as the first frame ...")
                k = parse_intrinsics(self.settings.photo_intrinsics)
                with_photo(episode, self.settings.first_frame, episode, k)  # in place, atomically
            meta = read_episode(episode).meta
            settings = job_settings(meta.generation if meta else None, self.settings.generation())
            if client_factory is None:
                from bridge.client.reach import check_listening

                check_listening(self.settings.server)  # "no server: start one with ..." at once
            factory = client_factory or (lambda: Client(self.settings.server, timeout=timeout))
            with factory() as client:
                health = client.health()
                started = time.monotonic()
                job, outcome = submit_and_follow(
                    client,
                    EpisodePayload.from_dir(episode),
                    settings or None,
                    on_progress=on_progress,
                    on_submitted=lambda job: self._set(
                        run,
                        message=f"Queued as {job.id[:8]} (position {job.queue_position}) on "
                        f"{_server_model(health, settings.get('model'))}",
                    ),
                    on_chunk=on_chunk,
                    # bounded: a dead server costs this thread `timeout` per request, never the UI
                    cancelled=cancelled.is_set,
                    check_alive_s=max(timeout, 5.0),
                    want_stills=True,  # the server's PNG of each chunk: no video decoder needed here
                )
                info = {
                    "id": job.id,
                    "server": self.settings.server,
                    "asked": settings,
                    "seconds": round(time.monotonic() - started, 3),
                    "episode": str(episode),
                    "provenance": outcome.provenance,
                    "first_frame": first_frame_record(read_episode(episode)),
                }
                result = write_rollout(episode, outcome.video, info, client="extension")
            report = self._report(episode, result, run)
            self._set(
                run, state="done", message=f"Rollout written: {result}", progress=1.0, result=result, report=report
            )
        except Exception as exc:
            if isinstance(exc, ServerUnavailable):
                message = f"Generation failed: the server at {self.settings.server} stopped answering ({exc})"
            elif isinstance(exc, (RequestFailed, JobFailed)) and exc.code == "bad_settings":
                message = refused_settings_line(exc.message)
            else:
                message = "Cancelled." if cancelled.is_set() else f"Generation failed: {exc}"
            self._set(run, state="failed", message=message,
                      error="".join(traceback.format_exception_only(exc)).strip())  # fmt: skip

    def _report(self, episode: Path, rollout: Path, run: int | None = None) -> Path | None:
        """The comparison report, when sim frames exist, built by `build_report` (by default the
        CLI's `compare` command in its own process: OpenCV never enters Isaac Sim's Python)."""
        from contracts.episode import read_episode

        if not self.settings.compare or self.build_report is None or read_episode(episode).sim_frames_path is None:
            return None
        self._set(run, message="Comparing the sim frames with the rollout ...")
        try:
            return self.build_report(episode, rollout, episode / "comparison")
        except Exception as exc:  # the rollout is still good; say why there is no report
            self._set(run, message=f"Rollout written; comparison failed: {exc}")
            return None


def refused_settings_line(message: str) -> str:
    """The status line of a `bad_settings` refusal, in the server's words after a plain lead-in:
    at submit (e.g. gpus 2 on a one-device server) or of a queued job the server can no longer
    run (e.g. spooled by a laxer server before a restart: "not run: settings: steps 8 > ...")."""
    return f"The server refused the settings: {message.removeprefix('not run: ').removeprefix('settings: ')}"


def compare_with_cli(episode: Path, rollout: Path, out: Path) -> Path:
    """Build the comparison report with `lingbot-isaac compare` in a separate process; return the
    HTML report's path. Raises RuntimeError with the command's last words when it fails (e.g. the
    `compare` extra is not installed in this Python)."""
    command = [sys.executable, "-m", "lingbot_cli", "compare", str(episode), str(rollout), "--out", str(out)]
    done = subprocess.run([*command, "--no-progress"], capture_output=True, text=True, check=False)
    reports = [line.removeprefix("report: ") for line in done.stdout.splitlines() if line.startswith("report: ")]
    if done.returncode != 0 or not reports:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"`lingbot-isaac compare` failed: {last[0]}")
    return Path(reports[0])


class _Previews:
    """The chunks of one generation as files the window can show: `chunk_NNN.mp4` and
    `chunk_NNN.png`, the chunk's last frame (omni.ui.Image shows PNG files, not videos). The PNG is
    the still the server sends with the chunk (`want_stills`), so Isaac Sim's Python needs no video
    decoder; from an older server that sends none, it is decoded here when imageio-ffmpeg is
    installed, else there is none (the window shows the chunk's line alone). A new generation
    starts with an empty folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.frames = 0
        self._fresh = False

    def add(self, chunk: Any) -> ChunkPreview:
        from contracts import atomic

        self.frames += chunk.frames  # counted even if its preview cannot be written
        if not self._fresh:  # the first chunk of this run: drop an earlier run's previews
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder.mkdir(parents=True, exist_ok=True)
            self._fresh = True
        stem = f"chunk_{chunk.index:03d}"
        video = atomic.write_bytes(self.folder / f"{stem}.mp4", chunk.video, durable=False)  # a preview
        image = self.folder / f"{stem}.png"
        if chunk.still:
            atomic.write_bytes(image, chunk.still, durable=False)
        else:
            image = _last_frame_png(video, image)
        return ChunkPreview(chunk.job, chunk.index, chunk.total, chunk.frames, self.frames, video, image)


def _last_frame_png(video: Path, out: Path) -> Path | None:
    """The video's last frame as the server's stills are (`contracts.video.still_png`) at `out`;
    None where imageio-ffmpeg is not installed (it is optional on the Isaac side) or the video
    cannot be read."""
    from contracts import atomic
    from contracts.video import VideoError, have_codec, read_mp4, still_png

    if not have_codec():
        return None
    try:
        frames, _ = read_mp4(video)  # a chunk: at most a dozen frames
    except VideoError:
        return None
    return atomic.write_bytes(out, still_png(frames[-1]), durable=False)


def model_choices() -> list[tuple[str, str | None]]:
    """The Settings panel's model list as (label, value): the server's own choice (None: nothing
    sent), then every model `contracts` knows (one home: `contracts.engine_options.MODELS`)."""
    from contracts.engine_options import MODELS

    return [(SERVER_CHOICE_LABEL, None), *((name, name) for name in MODELS)]


SERVER_CHOICE_LABEL = "server's choice"  # first in the Model and GPUs lists: nothing sent


def gpu_choices() -> list[tuple[str, int | None]]:
    """The window's GPUs list as (label, value): the server's choice (None: nothing sent), then
    every count the one `gpus` setting allows (`contracts.settings`: 1, or 2 for a base job split
    over two of the server's GPUs; a server that cannot do it refuses with `bad_settings`)."""
    from contracts.settings import FIELD_BY_NAME

    spec = FIELD_BY_NAME["gpus"]
    return [(SERVER_CHOICE_LABEL, None), *((str(n), n) for n in range(int(spec.low), int(spec.high) + 1))]


def _server_model(health: dict[str, Any], asked: str | None) -> str:
    """'tiny, model fast' for the status line, from the server's health answer."""
    model = health.get("model") if isinstance(health.get("model"), dict) else {}
    name = model.get("model") or "the server"
    return f"{name}, model {asked}" if asked else f"{name}, the server's model"


def _describe(event) -> str:
    phase = event.phase
    if phase == "queued":
        return f"Queued (position {event.queue_position})"
    eta = f", about {event.eta_s:.0f} s left" if getattr(event, "eta_s", None) else ""
    return f"{phase.capitalize()} {event.step}/{event.total}{eta}"


def safe_name(text: str) -> str:
    """A folder name from free text (prim names, prompts)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "episode"
