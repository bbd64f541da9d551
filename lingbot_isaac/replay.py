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

import dataclasses
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from contracts.connection import DEFAULT_ENDPOINT, REQUEST_TIMEOUT_S
from contracts.episode import ROLLOUT_INFO, ROLLOUT_VIDEO, EpisodeError, read_episode
from contracts.settings import (
    GenerationSettings,
    SettingsError,
    job_settings,
    load_settings,
    parse_guide_scale,
)
from contracts.toml_file import read_toml
from lingbot_isaac.first_frame import fit_photo, parse_intrinsics, with_photo
from lingbot_isaac.lens import CameraError
from lingbot_isaac.recording import write_recording_episode
from lingbot_isaac.replay_batch import PENDING, Batch, dataset_bar
from lingbot_isaac.replay_live import LiveReplayError, replay_live
from lingbot_isaac.sources import SourceOptions, TrajectorySource, kind_of, open_source
from lingbot_isaac.sources.isaaclab_hdf5 import QUAT_ORDERS

ISAAC_CONFIG = Path(__file__).resolve().parent.parent / "config" / "isaac.toml"


class ReplayError(ValueError):
    """Bad replay arguments (names the flag and the fix)."""


def _bridge_errors() -> tuple[type[BaseException], ...]:
    try:
        from bridge.client.client_errors import BridgeError, PayloadError
    except ImportError:  # the bridge client is not installed: only --export-only works
        return ()
    return (BridgeError, PayloadError)


USER_ERRORS = (ReplayError, LiveReplayError, EpisodeError, CameraError, SettingsError, *_bridge_errors())


@dataclasses.dataclass
class ReplayOptions:
    """What a replay does, as data (`lingbot-isaac replay`'s options: lingbot_cli/replay.py says
    what each means; the error messages name those flags)."""

    sources: list[Path]  # episode folders (or their episode.json), USD or HDF5 files
    server: str = DEFAULT_ENDPOINT
    out: Path | None = None  # result folders here instead of beside the sources
    overwrite: bool = False
    export_only: bool = False
    first_frame: Path | None = None  # a real photo as every rollout's first frame
    photo_intrinsics: str | None = None  # "FX,FY,CX,CY" of that photo
    demos: str = "all"  # Isaac Lab HDF5: all, successful, or indices like 0-99 or 3,7,10-19
    window: int | None = None  # most jobs in flight at once (None: what the server takes)
    image: Path | None = None  # files without a first frame or prompt (USD, HDF5) ...
    prompt: str | None = None
    prompt_file: Path | None = None
    camera: str | None = None
    resolution: str | None = None  # "WxH"
    rate: float | None = None
    meters_per_unit: float | None = None
    stage: Path | None = None
    quat_order: str | None = None
    preset: str | None = None  # generation settings: a preset of config/generation.toml, then single values
    compute: str | None = None
    model: str | None = None
    gpus: int | None = None
    frame_num: int | None = None
    steps: int | None = None
    seed: int | None = None
    size: str | None = None
    guide_scale: str | None = None  # one value or "low,high"
    shift: float | None = None
    timeout: float = REQUEST_TIMEOUT_S  # seconds for each request to the server
    job_timeout: float | None = None  # cancel a job after this many s without progress
    no_progress: bool = False
    live: bool = False  # each episode as a live stream of poses (model fast; lingbot_isaac.replay_live)
    pace: float = 1.0  # --live: the recorded pace times this (0: as fast as the server takes them)


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


def _prompt(options: ReplayOptions) -> str | None:
    if options.prompt and options.prompt_file:
        raise ReplayError("give --prompt or --prompt-file, not both")
    if options.prompt_file:
        try:
            return options.prompt_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ReplayError(f"--prompt-file {options.prompt_file}: {exc}") from None
    return options.prompt


def config_quat_order(path: Path = ISAAC_CONFIG) -> str | None:
    """`[isaaclab] quat_order` of config/isaac.toml ("" or a missing file: None, i.e. ask)."""
    if not path.is_file():
        return None
    value = read_toml(path, error=ReplayError).get("isaaclab", {}).get("quat_order", "")
    if value not in ("", *QUAT_ORDERS):
        raise ReplayError(f'{path}: [isaaclab] quat_order must be "", "wxyz" or "xyzw" (got {value!r})')
    return value or None


def settings_overrides(options: ReplayOptions) -> dict[str, Any]:
    """The generation settings given on the command line (whole preset first, then single flags)."""
    settings: dict[str, Any] = {}
    if options.preset:
        settings.update(load_settings(preset=options.preset).to_dict())
    flags = {
        "frame_num": options.frame_num,
        "steps": options.steps,
        "seed": options.seed,
        "size": options.size,
        "shift": options.shift,
        "compute": getattr(options, "compute", None),
        "model": getattr(options, "model", None),
        "gpus": getattr(options, "gpus", None),
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    if options.guide_scale:
        settings["guide_scale"] = list(parse_guide_scale(options.guide_scale))
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
    from bridge.client.episode_payload import EpisodePayload
    from bridge.client.follow import submit_and_follow

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


def run(options: ReplayOptions) -> int:
    episodes, overrides = prepare(options)
    if options.export_only:
        for folder in episodes:
            print(folder)
        return 0
    return replay_episodes(options, episodes, overrides)


def prepare(options: ReplayOptions) -> tuple[list[Path], dict[str, Any]]:
    """Read and validate every source, export the episode folders; (folders, setting overrides)."""
    image = _load_image(options.image)
    resolution = _parse_resolution(options.resolution)
    if image is not None:
        if resolution is not None and resolution != image.shape[:2]:
            raise ReplayError(
                f"--resolution {options.resolution} differs from --image's {image.shape[1]}x{image.shape[0]}"
            )
        resolution = image.shape[:2]
    prompt = _prompt(options)
    overrides = settings_overrides(options)
    demos = parse_demos(options.demos)
    source_options = SourceOptions(
        camera=options.camera,
        resolution=resolution,
        rate=options.rate,
        meters_per_unit=options.meters_per_unit,
        quat_order=options.quat_order,
        default_quat_order=config_quat_order(),
        stage=options.stage,
    )

    # Read and validate every source before sending anything.
    sources: list[tuple[TrajectorySource, int]] = []
    frameless: list[Path] = []  # recorder sessions: they cannot hold camera frames
    for path in options.sources:
        if path.name == "episode.json" and path.is_file():  # `replay DIR/**/episode.json`
            path = path.parent
        found = open_source(path, source_options)
        siblings = len(found)
        kind = kind_of(path)
        if kind == "isaaclab-hdf5":
            found = select_demos(found, demos, path)
        elif kind == "isaacsim-hdf5":
            frameless.append(path)
        sources += [(source, siblings) for source in found]
    if not sources:
        raise ReplayError(f"--demos {options.demos}: no demo of {', '.join(map(str, options.sources))} matches")
    if frameless:
        from lingbot_isaac.sources.isaacsim_hdf5 import no_frames_note

        print(no_frames_note(frameless), file=sys.stderr)  # once, for all of them
    photo_k = parse_intrinsics(options.photo_intrinsics)
    if photo_k is not None and options.first_frame is None:
        raise ReplayError("--photo-intrinsics describes the --first-frame photo; give --first-frame PHOTO too")
    if options.first_frame is not None and not options.first_frame.is_file():
        raise ReplayError(f"--first-frame {options.first_frame}: no such file")
    plan = []
    for source, siblings in sources:
        target = _result_dir(source, options.out, siblings)
        if (
            options.first_frame is not None
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
    if options.out:
        options.out.mkdir(parents=True, exist_ok=True)
    resume = not options.export_only
    episodes = [
        export(source, target, image, prompt, options.overwrite, resume, options.first_frame, photo_k)
        for source, target in plan
    ]
    return episodes, overrides


def replay_episodes(options: ReplayOptions, episodes: list[Path], overrides: dict[str, Any]) -> int:
    """Send every unfinished episode through the server; 0 if all have a rollout in the end."""
    if options.live:  # one live stream of poses after the other (lingbot_isaac.replay_live)
        return replay_live(options.server, episodes, overrides, pace=options.pace, timeout=options.timeout,
                           overwrite=options.overwrite)  # fmt: skip
    from bridge.client.client import Client
    from bridge.client.client_errors import ServerUnavailable
    from bridge.client.reach import check_listening, explain_no_answer

    finished = [f for f in episodes if (f / ROLLOUT_VIDEO).is_file() and not options.overwrite]
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
    check_listening(options.server)  # a closed port is said at once, with how to start a server
    with Client(options.server, timeout=options.timeout) as client:
        try:
            health = client.health()  # before any upload
        except ServerUnavailable as exc:
            raise explain_no_answer(options.server, exc) from None
        window = window_of(health, options.window)
        bar = dataset_bar(len(episodes), len(finished), not options.no_progress)
        batch = Batch(
            client, options.server, window, options.job_timeout, bar, (health.get("model") or {}).get("model")
        )
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
