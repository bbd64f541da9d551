"""Send logged camera trajectories to a generation server and write the rollouts beside them.

A SOURCE is an episode folder, a folder of episode folders, a USD stage with a time-sampled
camera, an Isaac Sim 6 episode-recorder session (.hdf5) or an Isaac Lab dataset (.hdf5) with
camera poses (see `docs/isaac-sim.md`). Files are first exported to episode folders beside them
(`<stem>/` for a stage, `<stem>-<episode>/` for each episode of an HDF5 file); `--image` and
`--prompt` give the first frame and the text where the file has none. Each result is
`rollout.mp4` plus `rollout.json`, its provenance record (model, checkpoint, every setting used,
versions, timings, the job: `contracts.provenance`), in the episode folder.

Datasets: `--demos all|0-99|3,7,10-19|successful` picks demos of an Isaac Lab file. Many episodes
go through the server in a bounded window (never more in flight than the server takes; a `busy`
answer means wait, not fail) under one progress bar. Rerunning the same command resumes: finished
episodes (a `rollout.mp4`) are skipped, jobs still on the server (`rollout.pending.json`) are
followed again, and the rest are submitted.

Never imports torch: generation happens in the server (`lingbot-isaac serve`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from contracts import atomic
from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.engine_options import COMPUTE_CHOICES, FP8_HELP, MODELS
from contracts.episode import ROLLOUT_INFO, ROLLOUT_VIDEO, EpisodeError, read_episode, write_rollout
from contracts.settings import (
    FIELD_BY_NAME,
    GenerationSettings,
    SettingsError,
    job_settings,
    load_settings,
    parse_guide_scale,
)
from contracts.toml_file import read_toml
from lingbot_isaac.first_frame import describe_first_frame, first_frame_record, fit_photo, parse_intrinsics, with_photo
from lingbot_isaac.lens import CameraError
from lingbot_isaac.recording import write_recording_episode
from lingbot_isaac.sources import SourceOptions, TrajectorySource, kind_of, open_source
from lingbot_isaac.sources.isaaclab_hdf5 import QUAT_ORDERS

ISAAC_CONFIG = Path(__file__).resolve().parent.parent / "config" / "isaac.toml"

PENDING = "rollout.pending.json"  # {job, server}: submitted, no result yet (a rerun follows it again)
BUSY_BACKOFF_S = (0.5, 8.0)  # first and longest wait after a `busy` answer


class ReplayError(ValueError):
    """Bad replay arguments (names the flag and the fix)."""


def _bridge_errors() -> tuple[type[BaseException], ...]:
    try:
        from bridge.client_errors import BridgeError, PayloadError
    except ImportError:  # the bridge client is not installed: only --export-only works
        return ()
    return (BridgeError, PayloadError)


USER_ERRORS = (ReplayError, EpisodeError, CameraError, SettingsError, *_bridge_errors())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources",
        nargs="+",
        type=Path,
        metavar="SOURCE",
        help="episode folder (or its episode.json: `DIR/**/episode.json` replays a whole tree), USD or HDF5 file",
    )
    parser.add_argument(
        "--server", default=DEFAULT_ENDPOINT, help=f"the generation server's endpoint (default: {DEFAULT_ENDPOINT})"
    )
    parser.add_argument("--out", type=Path, help="write result folders here instead of beside the sources")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing results and exports (without it a rerun resumes: finished episodes are skipped)",
    )
    parser.add_argument("--export-only", action="store_true", help="write the episode folders, send nothing")
    photo = parser.add_argument_group("a real photo as the first frame (sim-to-real)")
    photo.add_argument(
        "--first-frame",
        type=Path,
        metavar="PHOTO",
        help="start every rollout from this photo (the real camera at the start pose) instead of the sim's "
        "first frame; centre-cropped and resized to the episode's frame. An episode folder given as SOURCE "
        "is left as it is: the result goes to <folder>-photo (or under --out)",
    )
    photo.add_argument(
        "--photo-intrinsics",
        metavar="FX,FY,CX,CY",
        help="the photo's pinhole intrinsics in its own pixels (default: it shows the sim camera's view)",
    )
    parser.add_argument(
        "--demos",
        default="all",
        help="Isaac Lab HDF5: which demos: all, successful (attribute success), or indices like 0-99 or 3,7,10-19",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="most jobs in flight at once, at most what the server takes from one client (its per-client "
        "queue plus its workers) (default: that most)",
    )
    source = parser.add_argument_group("files without a first frame or prompt (USD, HDF5)")
    source.add_argument("--image", type=Path, help="first frame (png/jpg); its size is the render resolution")
    source.add_argument("--prompt", help="text prompt (or --prompt-file)")
    source.add_argument("--prompt-file", type=Path, help="text prompt from a file")
    source.add_argument("--camera", help="camera prim path, recorder group or Isaac Lab camera name")
    source.add_argument("--resolution", help="WxH the intrinsics are for, if no --image gives it")
    source.add_argument(
        "--rate",
        type=float,
        help="Isaac Lab env step rate in Hz (1 / (sim.dt * decimation)) (default: none; "
        "a demo without time stamps needs it)",
    )
    source.add_argument(
        "--meters-per-unit",
        type=float,
        help="Isaac Sim recorder positions' stage unit in metres (1 metre stage, 0.01 centimetre stage) "
        "(default: from --stage, else the recorder's stage_snapshot.usd beside the file)",
    )
    source.add_argument(
        "--stage", type=Path, help="the USD stage an Isaac Sim recorder session was recorded on (for its units)"
    )
    source.add_argument(
        "--quat-order",
        choices=QUAT_ORDERS,
        help="quaternion order of an Isaac Lab dataset without a format_version mark: wxyz (Isaac Lab 2.x) "
        "or xyzw (3.x); default: [isaaclab] quat_order of config/isaac.toml",
    )
    gen = parser.add_argument_group("generation (default: the episode's settings, then the server's preset)")
    gen.add_argument(
        "--preset",
        help="send all settings of this [preset] of config/generation.toml: default = the reference's own 70 "
        "steps, shift 10 (exact); fast40 = 40 steps, shift 5 (approximate: 0.57x the time); tiny",
    )
    gen.add_argument(
        "--compute",
        choices=COMPUTE_CHOICES,
        help=FIELD_BY_NAME["compute"].help + ". " + FP8_HELP,
    )
    gen.add_argument(
        "--model",
        choices=MODELS,
        help="per job: base = the two experts with guidance; fast = LingBot-World-Fast (chunk by chunk, 4 steps; "
        "progress shows each finished chunk)",
    )
    gen.add_argument("--gpus", type=int, choices=(1, 2), help="per job: " + FIELD_BY_NAME["gpus"].help)
    gen.add_argument("--frame-num", type=int, help="frames to generate (4n+1)")
    gen.add_argument("--steps", type=int, help="denoising steps")
    gen.add_argument("--seed", type=int, help="random seed of the initial noise")
    gen.add_argument("--size", help="max area as H*W, e.g. 480*832")
    gen.add_argument("--guide-scale", help="one value or low,high")
    gen.add_argument("--shift", type=float, help="noise schedule shift")
    parser.add_argument(
        "--timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help=f"seconds for each request to the server (default: {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=None,
        help="cancel a job (and count it failed) after this many seconds without any progress from it "
        "(default: no limit while the server answers)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _parse_resolution(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ReplayError(f"--resolution must look like 832x480 (W x H), got {text!r}") from None
    if width < 16 or height < 16:
        raise ReplayError(f"--resolution {text!r} is too small")
    return height, width


def _load_image(path: Path | None) -> np.ndarray | None:
    if path is None:
        return None
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"--image {path}: not a readable image ({exc})") from None


def _prompt(args: argparse.Namespace) -> str | None:
    if args.prompt and args.prompt_file:
        raise ReplayError("give --prompt or --prompt-file, not both")
    if args.prompt_file:
        try:
            return args.prompt_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ReplayError(f"--prompt-file {args.prompt_file}: {exc}") from None
    return args.prompt


def config_quat_order(path: Path = ISAAC_CONFIG) -> str | None:
    """`[isaaclab] quat_order` of config/isaac.toml ("" or a missing file: None, i.e. ask)."""
    if not path.is_file():
        return None
    value = read_toml(path, error=ReplayError).get("isaaclab", {}).get("quat_order", "")
    if value not in ("", *QUAT_ORDERS):
        raise ReplayError(f'{path}: [isaaclab] quat_order must be "", "wxyz" or "xyzw" (got {value!r})')
    return value or None


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings given on the command line (whole preset first, then single flags)."""
    settings: dict[str, Any] = {}
    if args.preset:
        settings.update(load_settings(preset=args.preset).to_dict())
    flags = {
        "frame_num": args.frame_num,
        "steps": args.steps,
        "seed": args.seed,
        "size": args.size,
        "shift": args.shift,
        "compute": getattr(args, "compute", None),
        "model": getattr(args, "model", None),
        "gpus": getattr(args, "gpus", None),
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    if args.guide_scale:
        settings["guide_scale"] = list(parse_guide_scale(args.guide_scale))
    GenerationSettings.from_dict(settings)  # SettingsError names a bad value before anything runs
    return settings


def _result_dir(source: TrajectorySource, out: Path | None, file_sources: int) -> Path:
    if source.episode_dir is not None:
        return source.episode_dir if out is None else out / source.name
    stem = source.origin.stem
    name = stem if file_sources == 1 and source.name == stem else f"{stem}-{source.name}"
    return (out or source.origin.parent) / name


def _exported_from(target: Path, source: TrajectorySource) -> bool:
    """True if `target` is a valid episode folder exported from this very source."""
    if not (target / "episode.json").is_file():
        return False
    try:
        episode = read_episode(target)
    except EpisodeError:
        return False
    return episode.meta is not None and episode.meta.source == source.recording.source


def _has_photo(target: Path, photo: Path) -> bool:
    """True if `target` is a valid episode folder whose first frame is already this photo."""
    try:
        episode = read_episode(target)
    except EpisodeError:
        return False
    return bool(episode.meta) and (episode.meta.extra.get("first_frame") or {}).get("path") == str(photo)


def export(
    source: TrajectorySource,
    target: Path,
    image,
    prompt: str | None,
    overwrite: bool,
    resume: bool = False,
    photo: Path | None = None,
    photo_intrinsics: tuple[float, float, float, float] | None = None,
) -> Path:
    """Make `target` an episode folder for `source` (copy or export); return it. `resume`: an
    earlier export of the same source is kept as it is. `photo`: the first frame instead of the
    source's (`first_frame.fit_photo`)."""
    if photo is not None and source.episode_dir is not None:
        if resume and not overwrite and target.is_dir() and _has_photo(target, photo):
            return target
        if target.exists() and not overwrite:
            raise ReplayError(f"{target} already exists; pass --overwrite to replace it")
        return with_photo(source.episode_dir, photo, target, photo_intrinsics, overwrite=True)
    if photo is not None:
        recording = source.recording
        image, k, info = fit_photo(photo, *recording.resolution, photo_intrinsics)
        if k is not None:
            recording.intrinsics = np.tile(k, (len(recording.times), 1))
        recording.extra = {**recording.extra, "first_frame": info}
    if source.episode_dir is not None:
        if target.resolve() != source.episode_dir.resolve():
            if target.exists():
                if not overwrite:
                    raise ReplayError(f"{target} already exists; pass --overwrite to replace it")
                shutil.rmtree(target)
            shutil.copytree(source.episode_dir, target, ignore=shutil.ignore_patterns(ROLLOUT_VIDEO, ROLLOUT_INFO))
        read_episode(target)  # validate before sending
        return target
    if prompt is None:
        raise ReplayError(f"{source.origin}: has no prompt; pass --prompt TEXT or --prompt-file FILE")
    if resume and not overwrite and _exported_from(target, source):
        return target  # exported by an earlier run of this replay: resume with it
    if target.exists() and not overwrite:
        raise ReplayError(f"{target} already exists; pass --overwrite to export again")
    return write_recording_episode(source.recording, target, prompt, image=image, overwrite=overwrite)


class _ProgressBar:
    """A tqdm bar per job, fed from the client's events (falls back to plain lines without tqdm)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.bar, self.phase = label, None, None
        self.enabled = enabled
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self._tqdm = tqdm

    def update(self, phase: str, step: int, total: int) -> None:
        if not self.enabled:
            return
        if phase == "chunk":  # a Fast job's finished chunk: said on the bar it interrupts, not a bar of its own
            if self.bar is not None:
                self.bar.set_postfix_str(f"chunk {step}/{total} done")
            else:
                print(f"{self.label}: chunk {step}/{total} done", file=sys.stderr)
            return
        if self._tqdm is None:
            if phase != self.phase:
                print(f"{self.label}: {phase}", file=sys.stderr)
            self.phase = phase
            return
        if phase != self.phase or self.bar is None:
            if self.bar is not None:
                self.bar.close()
            self.bar = self._tqdm(total=max(total, 1), desc=f"{self.label} {phase}", unit="step", leave=False)
            self.phase = phase
        self.bar.total = max(total, 1)
        self.bar.n = min(step, self.bar.total)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def generate(
    client, episode_dir: Path, settings: dict[str, Any], label: str, progress: bool, job_timeout: float | None
) -> tuple[bytes, dict[str, Any]]:
    """Submit one episode, follow its events with a progress bar, return (mp4 bytes, job info)."""
    from bridge.episode_payload import EpisodePayload
    from bridge.follow import submit_and_follow

    started = time.monotonic()
    bar = _ProgressBar(label, progress)
    try:
        job, result = submit_and_follow(
            client,
            EpisodePayload.from_dir(episode_dir),
            settings or None,
            on_progress=lambda event: bar.update(event.phase, event.step, event.total),
            timeout=job_timeout,
        )
    except TimeoutError:
        raise ReplayError(f"{label}: no progress for {job_timeout} s; cancelled the job") from None
    finally:
        bar.close()
    info = {"id": job.id, "queue_position": job.queue_position, "server_seconds": result.seconds}
    info["seconds"] = round(time.monotonic() - started, 3)
    info["provenance"] = job.provenance
    return result.video, info


def parse_demos(spec: str) -> str | set[int]:
    """`--demos`: "all", "successful", or a set of indices from "0-99" / "3,7,10-19"."""
    spec = spec.strip().lower()
    if spec in ("all", "successful"):
        return spec
    indices: set[int] = set()
    try:
        for part in spec.split(","):
            low, dash, high = part.strip().partition("-")
            first, last = int(low), int(high if dash else low)
            if first < 0 or last < first:
                raise ValueError
            indices.update(range(first, last + 1))
    except ValueError:
        raise ReplayError(f"--demos {spec!r}: expected all, successful, or indices like 0-99 or 3,7,10-19") from None
    return indices


def select_demos(sources: list[TrajectorySource], spec: str | set[int], path: Path) -> list[TrajectorySource]:
    """The demos of one Isaac Lab file that `--demos` picks (`success` is the demo attribute
    Isaac Lab's recorder writes)."""
    if spec == "all":
        return sources
    if spec == "successful":
        import h5py

        with h5py.File(path, "r") as h5:
            ok = {name: bool(h5["data"][name].attrs.get("success", False)) for name in h5["data"]}
        return [source for source in sources if ok.get(source.name)]
    return [source for source in sources if source.name.startswith("demo_") and int(source.name[5:]) in spec]


def window_of(health: dict[str, Any], asked: int | None) -> int:
    """Jobs in flight at once: what the server takes from one client (its per-client queue plus
    one running job per worker), or less if asked."""
    queue = health.get("queue") or {}
    workers = len(health.get("workers") or [None])
    server = min(int(queue.get("max_queue_per_client", 16)) + workers, int(queue.get("max_queue", 32)) + workers)
    if asked is not None and asked < 1:
        raise ReplayError("--window must be >= 1")
    return min(asked, server) if asked else server


class Batch:
    """Many episodes through one client: a bounded window, `busy` backs off, results land as they come."""

    def __init__(self, client, server: str, window: int, job_timeout: float | None, bar, model: str | None) -> None:
        self.client, self.server, self.window, self.job_timeout, self.bar = client, server, window, job_timeout, bar
        self.model = model  # what the server runs (health); rollout.json has the worker's own record
        self.in_flight: dict[str, tuple[Path, dict[str, Any], float]] = {}  # job -> (folder, settings, t0)
        self.jobs: dict[str, Any] = {}
        self.last_event: dict[str, float] = {}
        self.wake = threading.Event()
        self.done: list[Path] = []
        self.failed: dict[Path, str] = {}
        self.busy_answers = 0

    def _on_event(self, event) -> None:  # on the client's I/O thread
        self.last_event[event.job] = time.monotonic()
        from bridge.job_events import JobError, Result

        if isinstance(event, (Result, JobError)):
            self.wake.set()

    def _follow(self, job, folder: Path, settings: dict[str, Any]) -> None:
        self.in_flight[job.id] = (folder, settings, time.monotonic())
        self.jobs[job.id] = job
        self.last_event[job.id] = time.monotonic()

    def resume(self, folder: Path, settings: dict[str, Any]) -> bool:
        """Follow the job an earlier run left on the server; False if the server no longer has it."""
        from bridge.client_errors import RequestFailed

        try:
            pending = json.loads((folder / PENDING).read_text())
            job = self.client.watch(str(pending["job"]), on_event=self._on_event)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        except RequestFailed as exc:
            if exc.code != "not_found":
                raise
            (folder / PENDING).unlink(missing_ok=True)
            return False
        self._follow(job, folder, settings)
        return True

    def run(self, todo: list[tuple[Path, dict[str, Any]]]) -> None:
        from bridge.client_errors import RequestFailed
        from bridge.episode_payload import EpisodePayload

        todo = list(todo)
        backoff = 0.0
        while todo or self.in_flight:
            while todo and len(self.in_flight) < self.window and backoff == 0.0:
                folder, settings = todo[0]
                try:
                    job = self.client.submit(EpisodePayload.from_dir(folder), settings or None, on_event=self._on_event)
                except RequestFailed as exc:
                    if exc.code != "busy":
                        todo.pop(0)
                        self._fail(folder, f"{exc.code}: {exc.message}")
                        continue
                    self.busy_answers += 1
                    backoff = BUSY_BACKOFF_S[0]  # the server is full: wait for a job to end, then retry
                    break
                todo.pop(0)
                atomic.write_json(folder / PENDING, {"job": job.id, "server": self.server}, indent=1)
                self._follow(job, folder, settings)
            self._postfix()
            self.wake.wait(backoff or 0.5)
            self.wake.clear()
            finished = self._collect()
            if backoff:
                backoff = 0.0 if finished else min(BUSY_BACKOFF_S[1], backoff * 2)
                if finished == 0 and not self.in_flight:
                    backoff = 0.0  # nothing of ours holds the queue: try again now-ish

    def _collect(self) -> int:
        from bridge.job_events import JobError

        finished = 0
        now = time.monotonic()
        for job_id in list(self.in_flight):
            job = self.jobs[job_id]
            folder, settings, started = self.in_flight[job_id]
            if not job.done():
                if self.job_timeout and now - self.last_event.get(job_id, now) > self.job_timeout:
                    self.client.cancel_async(job_id)
                    del self.in_flight[job_id]
                    (folder / PENDING).unlink(missing_ok=True)
                    self._fail(folder, f"no progress from job {job_id} for {self.job_timeout} s; cancelled it")
                    finished += 1
                continue
            del self.in_flight[job_id]
            finished += 1
            outcome = job.outcome
            if isinstance(outcome, JobError):
                if outcome.code in ("unreachable", "closed"):
                    self._fail(folder, f"{outcome.code}: {outcome.message}")  # the job may go on: keep PENDING
                    continue
                (folder / PENDING).unlink(missing_ok=True)
                self._fail(folder, f"{outcome.code}: {outcome.message}")
                continue
            info = {"id": job_id, "queue_position": job.queue_position, "server_seconds": outcome.seconds,
                    "seconds": round(time.monotonic() - started, 3), "server": self.server,
                    "episode": str(folder), "asked": settings, "provenance": outcome.provenance,
                    "first_frame": first_frame_record(read_episode(folder))}  # fmt: skip
            print(f"{folder.name}: first frame: {describe_first_frame(info['first_frame'])}", file=sys.stderr)
            for line in (outcome.provenance or {}).get("adjustments", []):  # what the engine changed, once
                print(f"{folder.name}: {line}", file=sys.stderr)
            print(write_rollout(folder, outcome.video, info), flush=True)
            (folder / PENDING).unlink(missing_ok=True)
            self.done.append(folder)
            self.bar.update(1)
        return finished

    def _fail(self, folder: Path, reason: str) -> None:
        self.failed[folder] = reason
        self.bar.update(1)
        print(f"{folder.name}: failed: {reason}", file=sys.stderr, flush=True)

    def _postfix(self) -> None:
        with contextlib.suppress(AttributeError):
            self.bar.set_postfix(in_flight=len(self.in_flight), failed=len(self.failed), refresh=False)


def run(args: argparse.Namespace) -> int:
    episodes, overrides = prepare(args)
    if args.export_only:
        for folder in episodes:
            print(folder)
        return 0
    return replay_episodes(args, episodes, overrides)


def prepare(args: argparse.Namespace) -> tuple[list[Path], dict[str, Any]]:
    """Read and validate every source, export the episode folders; (folders, setting overrides)."""
    image = _load_image(args.image)
    resolution = _parse_resolution(args.resolution)
    if image is not None:
        if resolution is not None and resolution != image.shape[:2]:
            raise ReplayError(
                f"--resolution {args.resolution} differs from --image's {image.shape[1]}x{image.shape[0]}"
            )
        resolution = image.shape[:2]
    prompt = _prompt(args)
    overrides = settings_overrides(args)
    demos = parse_demos(args.demos)
    options = SourceOptions(
        camera=args.camera,
        resolution=resolution,
        rate=args.rate,
        meters_per_unit=args.meters_per_unit,
        quat_order=args.quat_order,
        default_quat_order=config_quat_order(),
        stage=args.stage,
    )

    # Read and validate every source before sending anything.
    sources: list[tuple[TrajectorySource, int]] = []
    frameless: list[Path] = []  # recorder sessions: they cannot hold camera frames
    for path in args.sources:
        if path.name == "episode.json" and path.is_file():  # `replay DIR/**/episode.json`
            path = path.parent
        found = open_source(path, options)
        siblings = len(found)
        kind = kind_of(path)
        if kind == "isaaclab-hdf5":
            found = select_demos(found, demos, path)
        elif kind == "isaacsim-hdf5":
            frameless.append(path)
        sources += [(source, siblings) for source in found]
    if not sources:
        raise ReplayError(f"--demos {args.demos}: no demo of {', '.join(map(str, args.sources))} matches")
    if frameless:
        from lingbot_isaac.sources.isaacsim_hdf5 import no_frames_note

        print(no_frames_note(frameless), file=sys.stderr)  # once, for all of them
    photo_k = parse_intrinsics(args.photo_intrinsics)
    if photo_k is not None and args.first_frame is None:
        raise ReplayError("--photo-intrinsics describes the --first-frame photo; give --first-frame PHOTO too")
    if args.first_frame is not None and not args.first_frame.is_file():
        raise ReplayError(f"--first-frame {args.first_frame}: no such file")
    plan = []
    for source, siblings in sources:
        target = _result_dir(source, args.out, siblings)
        if (
            args.first_frame is not None
            and source.episode_dir is not None
            and target.resolve() == (source.episode_dir.resolve())
        ):
            target = target.with_name(f"{target.name}-photo")  # never replace the user's own first frame
        plan.append((source, target))
    targets: dict[Path, TrajectorySource] = {}
    for source, target in plan:
        other = targets.setdefault(target.resolve(), source)
        if other is not source:
            raise ReplayError(
                f"{other.origin} and {source.origin} would both write {target}; give them different "
                "names or replay them with different --out folders"
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    resume = not args.export_only
    episodes = [
        export(source, target, image, prompt, args.overwrite, resume, args.first_frame, photo_k)
        for source, target in plan
    ]
    return episodes, overrides


def replay_episodes(args: argparse.Namespace, episodes: list[Path], overrides: dict[str, Any]) -> int:
    """Send every unfinished episode through the server; 0 if all have a rollout in the end."""
    from bridge.client import Client
    from bridge.client_errors import ServerUnavailable
    from bridge.reach import check_listening, explain_no_answer

    finished = [f for f in episodes if (f / ROLLOUT_VIDEO).is_file() and not args.overwrite]
    todo = []
    for folder in episodes:
        if folder in finished:
            continue
        episode = read_episode(folder)
        todo.append((folder, job_settings(episode.meta.generation if episode.meta else None, overrides)))
    if finished:
        print(f"{len(finished)} of {len(episodes)} episode(s) already have {ROLLOUT_VIDEO}: skipped "
              "(--overwrite generates them again)", file=sys.stderr)  # fmt: skip
    if not todo:
        return 0
    check_listening(args.server)  # a closed port is said at once, with how to start a server
    with Client(args.server, timeout=args.timeout) as client:
        try:
            health = client.health()  # before any upload
        except ServerUnavailable as exc:
            raise explain_no_answer(args.server, exc) from None
        window = window_of(health, args.window)
        bar = _dataset_bar(len(episodes), len(finished), not args.no_progress)
        batch = Batch(client, args.server, window, args.job_timeout, bar, (health.get("model") or {}).get("model"))
        try:
            fresh = [(f, s) for f, s in todo if not ((f / PENDING).is_file() and batch.resume(f, s))]
            batch.run(fresh)
        except KeyboardInterrupt:
            print(f"interrupted: {len(batch.in_flight)} job(s) go on on the server; run the same command "
                  "again to collect them", file=sys.stderr)  # fmt: skip
            raise
        finally:
            bar.close()
    if batch.busy_answers:
        print(f"the server was busy {batch.busy_answers} time(s): waited and sent again", file=sys.stderr)
    if batch.failed:
        print(f"{len(batch.failed)} of {len(episodes)} episode(s) failed (run again to retry them):",
              file=sys.stderr)  # fmt: skip
        for folder, reason in batch.failed.items():
            print(f"  {folder}: {reason}", file=sys.stderr)
        return 1
    return 0


def _dataset_bar(total: int, initial: int, enabled: bool):
    """One bar over the dataset (episodes), or a stand-in with the same methods."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        return _NoBar()
    return tqdm(total=total, initial=initial, unit="episode", desc="replay", file=sys.stderr)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass
