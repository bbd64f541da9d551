#!/usr/bin/env python
"""Record a camera in Isaac Sim (headless), write an episode, and generate its LingBot-World rollout.

Run with Isaac Sim's Python (it needs Kit), for example:

    ./python.sh scripts/isaac_record_and_generate.py --stage scene.usd --camera /World/Cam \
        --seconds 5 --prompt "A robot drives down a warehouse aisle." --out episodes/aisle

The stage plays for `--seconds` of sim time; every app update (one physics + render step) the
camera is sampled and, until the first image arrives, its render product is polled. Then the
episode is written (16 fps, 4n+1 frames) and, unless `--no-generate`, sent to the server; the
rollout lands in the episode folder as `rollout.mp4`. See docs/isaac-sim.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contracts.connection import DEFAULT_ENDPOINT  # noqa: E402
from contracts.engine_options import MODELS  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH  # noqa: E402
from lingbot_isaac import kit_adapter  # noqa: E402  (no omni import at module level)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", required=True, help="USD stage to open")
    parser.add_argument("--camera", required=True, help="camera prim path to record")
    parser.add_argument("--prompt", required=True, help="what the scene is and how the camera moves")
    parser.add_argument("--out", type=Path, required=True, help="episode folder to write")
    parser.add_argument("--seconds", type=float, default=5.0, help="sim time to record")
    parser.add_argument("--width", type=int, default=MODEL_WIDTH, help="render width in pixels")
    parser.add_argument("--height", type=int, default=MODEL_HEIGHT, help="render height in pixels")
    parser.add_argument("--keep-frames", action="store_true", help="also keep every frame (for comparison)")
    parser.add_argument("--warmup-updates", type=int, default=30, help="app updates before recording starts")
    parser.add_argument(
        "--server", default=DEFAULT_ENDPOINT, help=f"the generation server (default: {DEFAULT_ENDPOINT})"
    )
    parser.add_argument("--preset", help="send all settings of this [preset] of config/generation.toml")
    parser.add_argument("--frame-num", type=int)
    parser.add_argument(
        "--model",
        choices=MODELS,
        help="per job: base = the two experts with guidance; fast = LingBot-World-Fast (chunk by chunk) "
        "(default: the server's preset)",
    )
    parser.add_argument(
        "--first-frame",
        type=Path,
        metavar="PHOTO",
        help="start the rollout from this photo (the real camera at the start pose) instead of the render",
    )
    parser.add_argument(
        "--photo-intrinsics", metavar="FX,FY,CX,CY", help="the photo's intrinsics in its pixels (default: the sim's)"
    )
    parser.add_argument("--no-generate", action="store_true", help="only write the episode")
    parser.add_argument("--overwrite", action="store_true")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.out.exists() and not args.overwrite:
        print(f"error: {args.out} already exists; pass --overwrite", file=sys.stderr)
        return 2
    simulation_app = kit_adapter.simulation_app_class()({"headless": True, "width": args.width, "height": args.height})
    try:
        return record_and_generate(simulation_app, args)
    finally:
        simulation_app.close()


def record_and_generate(simulation_app, args: argparse.Namespace) -> int:
    import omni.usd  # only importable once SimulationApp runs

    from lingbot_isaac.recorder import Recorder

    context = omni.usd.get_context()
    if not context.open_stage(str(args.stage)):
        print(f"error: could not open {args.stage}", file=sys.stderr)
        return 2
    while context.get_stage_loading_status()[2] > 0:  # wait for payloads and textures
        simulation_app.update()
    stage = kit_adapter.get_stage()
    print(f"Isaac Sim {kit_adapter.isaac_sim_version() or '(unknown version)'}; recording {args.camera}")

    capture = kit_adapter.RgbCapture(args.camera, args.width, args.height)
    recorder = Recorder(
        stage, args.camera, (args.height, args.width), capture=capture.read, keep_frames=args.keep_frames
    )
    timeline = kit_adapter.timeline()
    try:
        for _ in range(args.warmup_updates):  # let the renderer produce frames before time 0
            simulation_app.update()
        timeline.play()
        recorder.start()
        updates = 0
        max_updates = int(args.seconds * 240) + 1000  # a bound even if the timeline does not advance
        while recorder.recording and recorder.seconds < args.seconds and updates < max_updates:
            simulation_app.update()
            recorder.sample(*kit_adapter.current_time())
            updates += 1
        timeline.pause()
        settings = {"frame_num": args.frame_num} if args.frame_num else {}
        episode = recorder.write_episode(
            args.out,
            args.prompt,
            generation=settings or None,
            scene_id=Path(args.stage).stem,
            overwrite=args.overwrite,
        )
    finally:
        capture.close()
    if args.first_frame is not None:
        from lingbot_isaac.first_frame import parse_intrinsics, with_photo

        with_photo(episode, args.first_frame, episode, parse_intrinsics(args.photo_intrinsics))
        print(f"first frame: {args.first_frame} (fitted to the episode's frame)")
    print(f"episode: {episode} ({recorder.sample_count} sim steps)")
    if args.no_generate:
        return 0
    return generate(episode, args)


def generate(episode: Path, args: argparse.Namespace) -> int:
    from bridge.client.client import Client
    from contracts.episode import read_episode, write_rollout
    from contracts.settings import job_settings
    from lingbot_isaac.first_frame import first_frame_record
    from lingbot_isaac.replay import generate as send
    from lingbot_isaac.replay import settings_overrides

    overrides = settings_overrides(
        argparse.Namespace(
            preset=args.preset,
            frame_num=args.frame_num,
            steps=None,
            seed=None,
            size=None,
            shift=None,
            guide_scale=None,
            model=args.model,
        )
    )
    meta = read_episode(episode).meta
    settings = job_settings(meta.generation if meta else None, overrides)
    with Client(args.server, timeout=30.0) as client:
        client.health()
        video, info = send(client, episode, settings, episode.name, progress=True, job_timeout=None)
    first = first_frame_record(read_episode(episode))
    info.update({"server": args.server, "episode": str(episode), "settings": settings, "first_frame": first})
    print(f"rollout: {write_rollout(episode, video, info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
