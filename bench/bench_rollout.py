"""A full rollout under a VRAM budget, with peak VRAM and RSS per phase, and expert load throughput.

Usage:
  python bench/bench_rollout.py CKPT_DIR --action-path EXAMPLE_DIR --vram-budget 16 [--preset fast40]
      [--steps N] [--size H*W] [--frame-num N] [--load-throughput] [--json OUT] [--device cpu]

CKPT_DIR is a real or synthetic checkpoint (bench/synthetic_checkpoint.py). Prints the memory plan,
the measured per-phase table, expert loads, and (with --load-throughput) cold-cache throughput of
loading one NF4 expert next to a raw sequential read of the same file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from contracts.engine_options import ATTENTIONS, COMPUTE_CHOICES  # noqa: E402
from contracts.settings import load_settings  # noqa: E402
from worldgen.kernels import attention  # noqa: E402
from worldgen.pipelines.camera import load_action  # noqa: E402
from worldgen.pipelines.loader import load_pipeline  # noqa: E402
from worldgen.rollout import (  # noqa: E402
    find_image,
    fp8_self_attention,  # noqa: E402
    read_prompt,
)
from worldgen.runtime.checkpoint import find_checkpoint, load_expert  # noqa: E402

BENCH_PRESET = "fast40"  # what docs/benchmarks.md's rollout figures were timed with (40 steps, shift 5)

GiB = 2**30


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        return True
    except OSError:
        return False


def raw_read_gbps(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 * 2**20)
        while f.readinto(buf):
            pass
    return path.stat().st_size / (time.perf_counter() - start) / 1e9


def load_throughput(ckpt: Path) -> dict:
    layout = find_checkpoint(ckpt)
    folder = layout.experts["high"]
    files = [p for p in folder.iterdir() if p.suffix in (".safetensors", ".pt")]
    size = sum(p.stat().st_size for p in files)
    cold = drop_page_cache()
    raw = sum(p.stat().st_size for p in files) / sum(p.stat().st_size / raw_read_gbps(p) for p in files)
    drop_page_cache()
    start = time.perf_counter()
    model = load_expert(folder, "cuda", torch.bfloat16)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(
        f"load throughput ({'cold page cache' if cold else 'page cache NOT dropped'}): raw read {raw:.2f} GB/s; "
        f"load_expert {size / seconds / 1e9:.2f} GB/s ({size / 1e9:.1f} GB in {seconds:.1f} s) "
        f"= {size / seconds / 1e9 / raw:.0%} of raw"
    )
    del model
    torch.cuda.empty_cache()
    return {"cold": cold, "raw_gbps": raw, "load_gbps": size / seconds / 1e9, "bytes": size, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt", type=Path)
    parser.add_argument("--action-path", type=Path, required=True)
    parser.add_argument("--vram-budget", type=float)
    parser.add_argument(
        "--preset",
        default=BENCH_PRESET,
        help="settings preset of config/generation.toml to time (the documented figures: fast40)",
    )
    parser.add_argument("--steps", type=int, help="denoising steps (default: the preset's)")
    parser.add_argument("--size", help="max area as H*W (default: the preset's)")
    parser.add_argument("--frame-num", type=int, help="video frames (default: the preset's)")
    parser.add_argument("--load-throughput", action="store_true")
    parser.add_argument("--t5-on-cpu", action="store_true")
    parser.add_argument("--compute", choices=COMPUTE_CHOICES, default="exact", help="as generate (default: exact)")
    parser.add_argument("--attention", choices=ATTENTIONS, default="auto", help="as generate (default: auto)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (tiny checkpoint)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.load_throughput:
        results["load_throughput"] = load_throughput(args.ckpt)
    pipe = load_pipeline(
        args.ckpt,
        device=args.device,
        vram_budget_gb=args.vram_budget,
        use_text_cache=False,
        text_encoder_on_cpu=args.t5_on_cpu,
        compute=args.compute,
        attention=args.attention,
    )
    print(f"engine: {pipe.engine}")
    print(pipe.plan.describe())
    plans = [pipe.plan.describe()]
    pipe.on_plan = lambda text: (plans.append(text), print(f"re-planned for this job:\n{text}"))
    poses, intrinsics = load_action(args.action_path)
    given = {"size": args.size, "frame_num": args.frame_num, "steps": args.steps}
    settings = load_settings(preset=args.preset).replace(**{k: v for k, v in given.items() if v is not None})
    last = [time.perf_counter()]

    def progress(phase: str, step: int, total: int) -> None:
        if phase == "denoise" and step:
            now = time.perf_counter()
            print(f"  step {step}/{total}: {now - last[0]:.1f} s", flush=True)
            last[0] = now

    start = time.perf_counter()
    video = pipe.generate(
        find_image(args.action_path), read_prompt(args.action_path), poses, intrinsics, settings, progress=progress
    )
    total = time.perf_counter() - start
    print(pipe.meter.summary())
    split = {k: tuple(round(x, 2) for x in v) for k, v in pipe.meter.rss_split.items()}
    print("RSS at phase end (anonymous, file-backed GiB):", split)
    loads = {k: {"loads": s.loads, "seconds": s.load_seconds} for k, s in pipe.experts.items()}
    print(
        f"video {tuple(video.shape)}, finite={bool(torch.isfinite(video).all())}; total {total:.0f} s; "
        f"expert loads: " + ", ".join(f"{k}={v['loads']} ({v['seconds']:.0f} s)" for k, v in loads.items())
    )
    if pipe.compute == "fp8":  # what the run's self-attention really did, shape by shape
        ran = {str(tuple(key[1])): used for key, used in attention._fp8_usable.items() if len(key) > 1}
        print(f"self-attention: {fp8_self_attention(pipe.device)}; FP8 attention per q shape: {ran}")
        results["fp8_attention_shapes"] = ran
    peak_vram = max(r.peak_vram_gib or 0 for r in pipe.meter.records)
    peak_rss = max(r.peak_rss_gib or 0 for r in pipe.meter.records)
    print(f"PEAK: VRAM {peak_vram:.2f} GiB (budget {args.vram_budget}), RSS {peak_rss:.2f} GiB")
    results.update(
        plans=plans,
        phases=pipe.meter.as_dict(),
        rss_split_at_phase_end=split,
        expert_loads=loads,
        video_shape=list(video.shape),
        finite=bool(torch.isfinite(video).all()),
        total_seconds=total,
        peak_vram_gib=peak_vram,
        peak_rss_gib=peak_rss,
    )
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
