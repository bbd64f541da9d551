"""Send logged camera trajectories to a generation server and write the rollouts beside them.

A SOURCE is an episode folder, a folder of episode folders, a USD stage with a time-sampled
camera, an Isaac Sim 6 episode-recorder session (.hdf5) or an Isaac Lab dataset (.hdf5) with
camera poses (see `docs/isaac-sim.md`). Files are first exported to episode folders beside them
(`<stem>/` for a stage, `<stem>-<episode>/` for each episode of an HDF5 file); `--image` and
`--prompt` give the first frame and the text where the file has none. Each result is
`rollout.mp4` plus `rollout.json`, its provenance record (model, checkpoint, every setting used,
versions, timings, the job: `contracts.provenance`), in the episode folder.

Never imports torch: generation happens in the server (`lingbot-isaac serve`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bridge.settings import GenerationSettings, SettingsError, load_settings, parse_guide_scale
from contracts.provenance import sidecar_path, with_job, write_record
from lingbot_isaac.episode import EpisodeError, read_episode
from lingbot_isaac.lens import CameraError
from lingbot_isaac.recording import write_recording_episode
from lingbot_isaac.sources import SourceOptions, TrajectorySource, open_source
from lingbot_isaac.sources.isaaclab_hdf5 import QUAT_ORDERS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ISAAC_CONFIG = Path(__file__).resolve().parent.parent / "config" / "isaac.toml"

RESULT_VIDEO = "rollout.mp4"
RESULT_INFO = "rollout.json"


class ReplayError(ValueError):
    """Bad replay arguments (names the flag and the fix)."""


def _bridge_errors() -> tuple[type[BaseException], ...]:
    try:
        from bridge.client import BridgeError, PayloadError
    except ImportError:  # the bridge client is not installed: only --export-only works
        return ()
    return (BridgeError, PayloadError)


USER_ERRORS = (ReplayError, EpisodeError, CameraError, SettingsError, *_bridge_errors())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources", nargs="+", type=Path, metavar="SOURCE", help="episode folder, USD or HDF5 file"
    )
    parser.add_argument("--server", default="tcp://127.0.0.1:5570", help="the generation server's endpoint")
    parser.add_argument("--out", type=Path, help="write result folders here instead of beside the sources")
    parser.add_argument("--overwrite", action="store_true", help="replace existing results and exports")
    parser.add_argument("--export-only", action="store_true", help="write the episode folders, send nothing")
    source = parser.add_argument_group("files without a first frame or prompt (USD, HDF5)")
    source.add_argument("--image", type=Path, help="first frame (png/jpg); its size is the render resolution")
    source.add_argument("--prompt", help="text prompt (or --prompt-file)")
    source.add_argument("--prompt-file", type=Path, help="text prompt from a file")
    source.add_argument("--camera", help="camera prim path, recorder group or Isaac Lab camera name")
    source.add_argument("--resolution", help="WxH the intrinsics are for, if no --image gives it")
    source.add_argument(
        "--rate", type=float, help="Isaac Lab env step rate in Hz (1 / (sim.dt * decimation))"
    )
    source.add_argument(
        "--meters-per-unit",
        type=float,
        help="Isaac Sim recorder positions' stage unit in metres (1 metre stage, 0.01 centimetre stage)",
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
    gen.add_argument("--preset", help="send all settings of this [preset] of config/generation.toml")
    gen.add_argument("--frame-num", type=int, help="frames to generate (4n+1)")
    gen.add_argument("--steps", type=int, help="denoising steps")
    gen.add_argument("--seed", type=int, help="random seed of the initial noise")
    gen.add_argument("--size", help="max area as H*W, e.g. 480*832")
    gen.add_argument("--guide-scale", help="one value or low,high")
    gen.add_argument("--shift", type=float, help="noise schedule shift")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for each request to the server")
    parser.add_argument("--job-timeout", type=float, default=None, help="seconds to wait for each rollout")
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
    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get("isaaclab", {}).get("quat_order", "")
    except tomllib.TOMLDecodeError as exc:
        raise ReplayError(f"{path}: not valid TOML ({exc})") from None
    if value not in ("", *QUAT_ORDERS):
        raise ReplayError(f"{path}: [isaaclab] quat_order must be \"\", \"wxyz\" or \"xyzw\" (got {value!r})")
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
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    if args.guide_scale:
        settings["guide_scale"] = list(parse_guide_scale(args.guide_scale))
    GenerationSettings.from_dict(settings)  # SettingsError names a bad value before anything runs
    return settings


def job_settings(episode_generation: dict[str, Any] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The episode's own settings (episode.json `generation`) under the command line's."""
    settings = {**(episode_generation or {}), **overrides}
    GenerationSettings.from_dict(settings)
    return settings


def _result_dir(source: TrajectorySource, out: Path | None, file_sources: int) -> Path:
    if source.episode_dir is not None:
        return source.episode_dir if out is None else out / source.name
    stem = source.origin.stem
    name = stem if file_sources == 1 and source.name == stem else f"{stem}-{source.name}"
    return (out or source.origin.parent) / name


def export(source: TrajectorySource, target: Path, image, prompt: str | None, overwrite: bool) -> Path:
    """Make `target` an episode folder for `source` (copy or export); return it."""
    if source.episode_dir is not None:
        if target.resolve() != source.episode_dir.resolve():
            if target.exists():
                if not overwrite:
                    raise ReplayError(f"{target} already exists; pass --overwrite to replace it")
                shutil.rmtree(target)
            shutil.copytree(
                source.episode_dir, target, ignore=shutil.ignore_patterns(RESULT_VIDEO, RESULT_INFO)
            )
        read_episode(target)  # validate before sending
        return target
    if prompt is None:
        raise ReplayError(f"{source.origin}: has no prompt; pass --prompt TEXT or --prompt-file FILE")
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
    from bridge.client import EpisodePayload, JobError, Progress, Result

    payload = EpisodePayload.from_dir(episode_dir)
    started = time.monotonic()
    job = client.submit(payload, settings or None)
    bar = _ProgressBar(label, progress)
    info: dict[str, Any] = {"id": job.id, "queue_position": job.queue_position}
    try:
        for event in job.events(timeout=job_timeout):
            if isinstance(event, Progress):
                bar.update(event.phase, event.step, event.total)
            elif isinstance(event, Result):
                info["server_seconds"] = event.seconds
            elif isinstance(event, JobError):
                break
    except TimeoutError:
        client.cancel(job.id)
        raise ReplayError(
            f"{label}: no progress from job {job.id} for {job_timeout} s; cancelled it"
        ) from None
    except KeyboardInterrupt:
        client.cancel(job.id)
        raise
    finally:
        bar.close()
    video = job.result(timeout=0)  # raises JobFailed with the server's reason
    info["seconds"] = round(time.monotonic() - started, 3)
    info["provenance"] = job.provenance
    return video, info


def write_result(folder: Path, video: bytes, info: dict[str, Any], client: str = "replay") -> Path:
    """rollout.mp4 and its provenance record rollout.json (the worker's record plus this job: `info`
    from `generate`), each written to a temp file and renamed into place, the record first."""
    target = folder / RESULT_VIDEO
    job = {key: value for key, value in info.items() if key != "provenance"}
    record = with_job(info.get("provenance"), {"client": client, **job})
    if record is not None:
        write_record(target, record)
    else:
        sidecar_path(target).unlink(missing_ok=True)  # a stale record would describe another video
        print(f"warning: the server sent no provenance record for {target}: its report cannot say "
              "what made it (an older server?)", file=sys.stderr)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(video)
    os.replace(partial, target)
    return target


def run(args: argparse.Namespace) -> int:
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
    for path in args.sources:
        found = open_source(path, options)
        sources += [(source, len(found)) for source in found]
    plan = []
    for source, siblings in sources:
        target = _result_dir(source, args.out, siblings)
        if not args.export_only and (target / RESULT_VIDEO).exists() and not args.overwrite:
            raise ReplayError(
                f"{target / RESULT_VIDEO} already exists; pass --overwrite to generate it again"
            )
        plan.append((source, target))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    episodes = [export(source, target, image, prompt, args.overwrite) for source, target in plan]
    if args.export_only:
        for folder in episodes:
            print(folder)
        return 0

    from bridge.client import Client, ServerUnavailable
    from bridge.reach import check_listening, explain_no_answer

    check_listening(args.server)  # a closed port is said at once, with how to start a server
    with Client(args.server, timeout=args.timeout) as client:
        try:
            client.health()  # before any upload
        except ServerUnavailable as exc:
            raise explain_no_answer(args.server, exc) from None
        for index, folder in enumerate(episodes, 1):
            episode = read_episode(folder)
            settings = job_settings(episode.meta.generation if episode.meta else None, overrides)
            label = f"[{index}/{len(episodes)}] {folder.name}"
            video, info = generate(client, folder, settings, label, not args.no_progress, args.job_timeout)
            info.update({"server": args.server, "episode": str(folder), "asked": settings})
            for line in (info["provenance"] or {}).get("adjustments", []):
                print(f"{label}: {line}", file=sys.stderr)
            print(write_result(folder, video, info))
    return 0
