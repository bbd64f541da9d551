"""Generate a LingBot-World video from a first image, a prompt and a camera trajectory (no server).

Examples:
  lingbot-isaac generate --image first.jpg --prompt "a warehouse aisle" --action-path episode/ -o out.mp4
  lingbot-isaac generate --ckpt-dir ~/models/lingbot-world-base-cam-nf4 --action-path episode/ \\
      --vram-budget 24 -o rollout.mp4

With no --ckpt-dir the built-in `tiny` model runs (random weights: its output is noise).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from contracts.engine_options import ATTENTION_HELP, ATTENTIONS, COMPUTE_CHOICES, DEVICE_HELP, FP8_HELP, MODELS
from contracts.episode import EpisodeError
from contracts.errors import CheckpointError
from contracts.provenance import sidecar_path, write_record
from contracts.settings import FIELD_BY_NAME, GenerationSettings, SettingsError, load_settings, parse_guide_scale
from worldgen.errors import InputError
from worldgen.quiet import VERBOSE_ENV

USER_ERRORS = (InputError, SettingsError, EpisodeError)


def _preset_default(name: str) -> str:
    """What a setting is when its flag is not given: the preset's value, else the one default of
    contracts/settings.py (stated there, printed here)."""
    value = FIELD_BY_NAME[name].default
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
    return f"(default: the --preset's, else {shown})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = __doc__.split("\n\n", 1)[1]
    src = parser.add_argument_group("inputs")
    src.add_argument(
        "--ckpt-dir",
        default="tiny",
        help="checkpoint folder: LingBot-World (original bf16 or NF4 release; its Fast DiT inside), or a LingBot-World "
        "2.0 download (lingbot-world-v2-14b-causal-fast, -1.3b-causal-fast, -14b-causal-pretrain); or 'tiny' / "
        "'tiny-nf4' / 'tiny-v2' for the built-in random-weights models (default: tiny)",
    )
    src.add_argument(
        "--assets-dir",
        help="LingBot-World 2.0 1.3B: the folder with umT5, VAE and tokenizer (the 14B causal-fast download; "
        "default: the download itself, else a sibling folder that has them)",
    )
    src.add_argument(
        "--action-path",
        type=Path,
        help="folder with poses.npy + intrinsics.npy (and image.jpg, prompt.txt when --image/"
        "--prompt are not given): a LingBot example folder or an episode folder",
    )
    src.add_argument("--image", type=Path, help="first frame (any image mode: grayscale, RGBA, 16-bit are converted)")
    src.add_argument("--prompt", help="scene description (default: prompt.txt of --action-path)")
    src.add_argument("--no-camera", action="store_true", help="ignore poses: image-to-video without camera control")
    gen = parser.add_argument_group("generation (defaults: config/generation.toml; [tiny] for the tiny model)")
    gen.add_argument(
        "--preset",
        help="a [table] of config/generation.toml, single flags below override it. default = the reference's "
        "own 70 steps, shift 10 (exact: what LingBot-World's generate.py does); fast40 = 40 steps, shift 5 "
        "(approximate: 0.57x the time, a different schedule than the reference's default); tiny = the tiny "
        "model's; v2-fast, v2-fast-long, v2-pretrain = LingBot-World 2.0's (default: tiny for the tiny models, "
        "the family's own for a 2.0 download, else default)",
    )
    gen.add_argument(
        "--model",
        choices=MODELS,
        help="base = LingBot-World's two experts with guidance; fast = a causal model chunk by chunk, 4 steps, no "
        "guidance (LingBot-World-Fast, its DiT in lingbot_world_fast/ inside --ckpt-dir, or a 2.0 causal-fast "
        "download); causal = LingBot-World 2.0 causal-pretrain (40 guided steps a chunk) " + _preset_default("model"),
    )
    gen.add_argument(
        "--kv-cache",
        choices=("auto", "full", "fp8", "rolling"),
        help="fast: KV cache kind: auto = whole video in bf16, else in FP8, else a rolling FP8 window, "
        "whichever fits --vram-budget " + _preset_default("kv_cache"),
    )
    gen.add_argument(
        "--attention-frames",
        type=int,
        help="fast: latent frames a chunk attends to at most (0: all) " + _preset_default("attention_frames"),
    )
    gen.add_argument(
        "--sink-frames",
        type=int,
        help="fast: frames a rolling KV cache never evicts " + _preset_default("sink_frames"),
    )
    gen.add_argument(
        "--size",
        help="max area as H*W, e.g. 480*832 or 720*1280; the aspect follows the image " + _preset_default("size"),
    )
    gen.add_argument(
        "--frame-num",
        type=int,
        help="frames, 4n+1 (rounded down), at most what the poses cover " + _preset_default("frame_num"),
    )
    gen.add_argument("--steps", type=int, help=FIELD_BY_NAME["steps"].help + " " + _preset_default("steps"))
    gen.add_argument("--shift", type=float, help="noise schedule shift " + _preset_default("shift"))
    gen.add_argument(
        "--guide-scale",
        help="classifier-free guidance: one value, or low,high per expert " + _preset_default("guide_scale"),
    )
    gen.add_argument("--seed", type=int, help=FIELD_BY_NAME["seed"].help + " " + _preset_default("seed"))
    gen.add_argument("--negative-prompt", help="negative prompt (default: the i2v-A14B one)")
    run = parser.add_argument_group("runtime")
    run.add_argument("--device", help=f"{DEVICE_HELP} (default: auto)")
    run.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="compute dtype of the DiT and T5 (default: bfloat16 on CUDA, float32 on CPU)",
    )
    run.add_argument(
        "--vram-budget",
        type=float,
        metavar="GB",
        help="cap this process's GPU memory (e.g. 24 to emulate a 24 GB card, or to leave room for Isaac Sim) "
        "(default: no cap, plan for the whole GPU)",
    )
    run.add_argument(
        "--ram-budget",
        type=float,
        metavar="GB",
        help="warn when the measured peak RSS exceeds this many GiB (default: no warning)",
    )
    run.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="auto",
        help=ATTENTION_HELP,
    )
    run.add_argument(
        "--compute",
        choices=COMPUTE_CHOICES,
        default="exact",
        help="how the DiT's matmuls run. exact (default; bf16 is its old name): the reference's numerics in "
        "--dtype (NF4 weights are dequantized to it). fp8: each large Linear as an FP8 GEMM (per-token and "
        "per-channel scales; weights stay NF4 in memory). int8: W8A8 GEMMs (int8 weights made once per load) "
        "and an 8-bit self-attention, for GPUs without FP8 (RTX 30xx, A100: compute capability 8.0+; approximate, "
        "tests/worldgen/test_int8.py bounds its distance). auto: fp8 where the GPU has FP8 tensor cores, int8 on "
        "8.0-8.8, exact elsewhere (the record says which and why). " + FP8_HELP,
    )
    run.add_argument(
        "--gpus",
        metavar="I,J",
        help="run one rollout on two GPUs, e.g. 0,1: the base model's conditional pass on the first, the "
        "unconditional one on the second at the same time; the causal models (fast, causal) split each chunk "
        "forward's attention heads and tokens over both (exact: the same output as one GPU). Each GPU "
        "holds its own copy of the experts under --vram-budget (default: one device, --device)",
    )
    run.add_argument(
        "--t5-on-cpu",
        action="store_true",
        help="run the umT5 text encoder on the CPU, streamed from disk one block at a time (slower; no GPU "
        "memory, ~1 GB of RAM); a cached prompt skips it either way",
    )
    run.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("out.mp4"),
        help="output mp4 (H.264); its provenance record goes beside it as .json (default: out.mp4)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument(
        "--verbose",
        action="store_true",
        help="also print the memory plan, the measured per-phase peaks and third-party notices hidden by default",
    )


def settings_from_args(args: argparse.Namespace, tiny: bool) -> GenerationSettings:
    from contracts.model_families import preset_for

    ckpt = getattr(args, "ckpt_dir", None)  # the folder's family's reference defaults (submit, replay: the server's)
    default = (
        "tiny"
        if tiny and ckpt is None
        else "default"
        if ckpt is None
        else preset_for(ckpt, getattr(args, "model", None))
    )
    base = load_settings(preset=getattr(args, "preset", None) or default)
    changes = {k: v for k, v in {
        "size": args.size, "frame_num": args.frame_num, "steps": args.steps, "shift": args.shift,
        "seed": args.seed, "negative_prompt": args.negative_prompt, "model": getattr(args, "model", None),
        "kv_cache": getattr(args, "kv_cache", None), "attention_frames": getattr(args, "attention_frames", None),
        "sink_frames": getattr(args, "sink_frames", None),
        "guide_scale": parse_guide_scale(args.guide_scale) if args.guide_scale else None,
    }.items() if v is not None}  # fmt: skip
    if ckpt is not None and not tiny or str(ckpt) == "tiny-v2":
        from contracts.checkpoint_layout import TINY_V2_CHECKPOINTS
        from contracts.model_families import V2_FAST, V2_PRETRAIN, family_for

        model = changes.get("model", base.model)
        if str(ckpt) in TINY_V2_CHECKPOINTS:
            family = V2_PRETRAIN if model == "causal" else V2_FAST
        else:
            try:
                family = family_for(ckpt, model)
            except CheckpointError:
                family = None  # the layout check, next, says what is wrong with the folder
        unused = None if family is None else family.unused_in(changes)
        if unused:
            raise SettingsError(unused)
    return base.replace(**changes)


class ProgressBars:
    """One tqdm bar per phase; the denoise bar counts steps."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.phase = None

    def __call__(self, phase: str, step: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            self.bar = tqdm(
                total=total,
                desc=f"{phase:<8}",
                unit="step" if phase == "denoise" else "phase",
                file=sys.stderr,
                leave=True,
            )
        self.bar.n = step
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run(args: argparse.Namespace) -> int:
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # third-party notices we hide by default (worldgen.quiet)
    say = print if args.verbose else (lambda *a, **k: None)

    # Every input is checked before anything heavy: a typo costs a second, not a model load.
    tiny = str(args.ckpt_dir).startswith("tiny")
    settings = settings_from_args(args, tiny)
    if args.action_path is None and args.image is None:
        raise InputError("give --image (and --prompt), or --action-path with image.jpg and prompt.txt")
    if args.action_path is not None and not args.action_path.is_dir():
        raise InputError(
            f"--action-path {args.action_path}: not a folder (poses.npy, intrinsics.npy, image.jpg, prompt.txt)"
        )
    from contracts import episode  # the one reader and validator of action folders (numpy only)
    from worldgen.pipelines.image_input import load_image
    from worldgen.pipelines.request import resolve_request

    image = load_image(image_path := args.image or episode.find_image(args.action_path))
    prompt = args.prompt or (episode.read_prompt(args.action_path) if args.action_path else None)
    if not prompt:
        raise InputError("no prompt: pass --prompt or put prompt.txt in --action-path")
    poses = intrinsics = None
    if args.action_path is not None and not args.no_camera:
        poses, intrinsics = episode.load_action(args.action_path, min_poses=episode.GENERATE_MIN_POSES)
    resolved = resolve_request(settings, (image.height, image.width), None if poses is None else len(poses))
    from contracts.checkpoint_layout import check_checkpoint  # the one check, as serve and demo run it

    # the layout (and the Fast folder, a 2.0 1.3B's assets), before any weight is read
    check_checkpoint(args.ckpt_dir, settings.model, args.assets_dir)
    for line in resolved.adjustments:
        print(f"note: {line}", file=sys.stderr)

    import time

    import torch

    from worldgen.pipelines.loader import load_pipeline
    from worldgen.rollout import generate_noting, mp4_only, rollout_record
    from worldgen.video_out import frames_shape, write_mp4

    started = time.perf_counter()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    from worldgen.pipelines.multi_gpu import devices_for_gpus

    devices = devices_for_gpus(getattr(args, "gpus", None))
    if devices and args.device:
        raise InputError("give --device or --gpus, not both")
    if devices and len(devices) == 2 and settings.gpus == 1:
        import dataclasses

        # the job's own setting says what ran (its provenance record): one rollout over two GPUs
        settings = dataclasses.replace(settings, gpus=2)
    pipe = load_pipeline(
        args.ckpt_dir,
        device=args.device,
        dtype=dtype,
        vram_budget_gb=args.vram_budget,
        ram_budget_gb=args.ram_budget,
        text_encoder_on_cpu=args.t5_on_cpu,
        attention=args.attention,
        model=settings.model,
        compute=getattr(args, "compute", None),
        devices=devices,
        assets_dir=args.assets_dir,
    )
    load_s = time.perf_counter() - started
    if pipe.compute == "fp8":
        from worldgen.kernels.cudnn_attention import attention_note

        print(f"note: {attention_note(pipe.device)}", file=sys.stderr)
    if pipe.is_random_weights:
        print("note: the tiny model has random weights: its output is noise, not a prediction", file=sys.stderr)
    identity = pipe.identity
    print(f"model: {pipe.name}; computing in {identity['dtype']} on {pipe.device}", file=sys.stderr)
    say(pipe.describe_plan(), file=sys.stderr)
    pipe.on_plan = lambda text: say(f"re-planned for this job's size:\n{text}", file=sys.stderr)
    bars = ProgressBars(not args.quiet)
    try:
        # a causal model keeps each chunk as the mp4's uint8 frames, not the float32 video (`mp4_only`)
        video, notes = generate_noting(
            pipe, image, prompt, poses, intrinsics, settings, progress=bars, **mp4_only(pipe)
        )
    finally:
        bars.close()
    for line in notes:  # what the engine changed on the way, one line each
        print(f"note: {line}", file=sys.stderr)
    with pipe.meter.phase("write"):
        record = rollout_record(
            pipe,
            settings,
            resolved,
            producer="generate",
            phases=pipe.meter.records,
            video_shape=frames_shape(video),
            notes=notes,
            inputs={
                "image": str(image_path),
                "image_size": [image.width, image.height],
                "poses": None if poses is None else len(poses),
                "prompt": prompt,
                "action_path": None if args.action_path is None else str(args.action_path),
            },
            timings={"load_s": round(load_s, 3), "generate_s": round(time.perf_counter() - started - load_s, 3)},
        )
        write_record(args.output, record)  # first: a video never sits without its record
        path = write_mp4(video, args.output, fps=settings.fps)
    say(pipe.meter.summary(), file=sys.stderr)
    peak_rss = max((r.peak_rss_gib or 0) for r in pipe.meter.records)
    if args.ram_budget and peak_rss > args.ram_budget:
        print(f"warning: peak RSS {peak_rss:.2f} GiB exceeded --ram-budget {args.ram_budget:g}", file=sys.stderr)
    frames, h, w = frames_shape(video)
    seconds = time.perf_counter() - started
    print(
        f"wrote {path} ({frames} frames, {w}x{h}, {settings.fps} fps, {seconds:.1f} s, peak RSS {peak_rss:.2f} GiB)"
        f" and its provenance record {sidecar_path(path)}"
    )
    return 0
