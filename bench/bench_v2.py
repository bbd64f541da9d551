"""LingBot-World 2.0 on one GPU: whole rollouts of a causal-fast (14B or 1.3B) or causal-pretrain download,
per chunk, per compute, beside the floor of bench/fast_chunk_floor.py (shared/).

Usage:
  python bench/bench_v2.py --ckpt DIR [--assets-dir DIR] --action-path EXAMPLE [--model fast|causal]
      [--size 480*832] [--frames 81,81,361] [--compute exact,fp8] [--attention-frames 18 --sink-frames 6]
      [--vram-budget 24] [--steps 40] [--json OUT.json]

One pipeline per compute (`load_pipeline`, as `generate` loads it); each --frames entry is one rollout of the
example (seed 42) through `generate` with every chunk handed out as it is decoded (a streamed job, as a live
view takes it). Per rollout it prints: the plan's KV cache and why, seconds to the first chunk (the first
rollout after the load is a fresh process's), every chunk's seconds (wall between chunks handed out) and the
DiT's part (`pipe.chunk_timings`), the steady chunk (median of chunks 2..), the whole rollout, peak VRAM
allocated / reserved and peak RSS; per compute after the first, the rel-L2 of its video from the first
compute's video (the same seed: decoded frames, float32 in [-1, 1]).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import episode  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.pipelines.loader import load_pipeline  # noqa: E402
from worldgen.runtime.metering import peak_rss_gib  # noqa: E402

GiB = 2**30


def rollout(pipe, example: Path, settings: GenerationSettings) -> tuple[dict, torch.Tensor]:
    image = episode.find_image(example)
    poses, intrinsics = episode.load_action(example)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    marks: list[float] = []
    start = time.perf_counter()
    video = pipe.generate(
        image, episode.read_prompt(example), poses, intrinsics, settings,
        on_chunk=lambda i, n, frames: marks.append(time.perf_counter()),
    )  # fmt: skip
    whole = time.perf_counter() - start
    chunks = [b - a for a, b in zip([start, *marks], marks, strict=False)]
    dit = [round(t.get("dit", 0.0), 3) for t in pipe.chunk_timings]
    result = {
        "frames": int(video.shape[1]),
        "kv_cache": pipe.cache_spec.describe() if pipe.cache_spec else None,
        "kv_reason": pipe.cache_reason,
        "first_chunk_s": round(chunks[0], 3),
        "chunk_s": [round(c, 3) for c in chunks],
        "dit_s": dit,
        "steady_chunk_s": round(statistics.median(chunks[1:]), 3) if len(chunks) > 1 else None,
        "steady_dit_s": round(statistics.median(dit[1:]), 3) if len(dit) > 1 else None,
        "whole_s": round(whole, 2),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GiB, 2) if torch.cuda.is_available() else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GiB, 2) if torch.cuda.is_available() else None,
        "peak_rss_gib": round(peak_rss_gib() or 0.0, 2),
    }
    return result, video


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="a LingBot-World 2.0 download (or tiny-v2)")
    parser.add_argument("--assets-dir", help="the 1.3B's umT5, VAE and tokenizer (default: beside it or a sibling)")
    parser.add_argument(
        "--action-path", type=Path, required=True, help="example folder: image, poses, intrinsics, prompt"
    )
    parser.add_argument("--model", default="fast", choices=("fast", "causal"))
    parser.add_argument("--size", default="480*832")
    parser.add_argument("--frames", default="81,81", help="comma-separated: one rollout each")
    parser.add_argument("--compute", default="exact,fp8", help="comma-separated: one pipeline each")
    parser.add_argument("--attention-frames", type=int, default=18, help="the KV window (0: the whole video)")
    parser.add_argument("--sink-frames", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40, help="--model causal: UniPC steps a chunk")
    parser.add_argument("--vram-budget", type=float)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="write every result here (rewritten after each rollout)")
    args = parser.parse_args()
    results: list[dict] = []
    first_video: torch.Tensor | None = None
    for compute in args.compute.split(","):
        started = time.perf_counter()
        pipe = load_pipeline(
            args.ckpt, device=args.device, vram_budget_gb=args.vram_budget, model=args.model, compute=compute,
            assets_dir=args.assets_dir,
        )  # fmt: skip
        load_s = time.perf_counter() - started
        print(f"[{compute}] {pipe.name}: loaded in {load_s:.1f} s", flush=True)
        for i, frames in enumerate(int(f) for f in args.frames.split(",")):
            extra = {"steps": args.steps, "guide_scale": 5.0} if args.model == "causal" else {}
            settings = GenerationSettings(
                model=args.model, size=args.size, frame_num=frames, seed=42, attention_frames=args.attention_frames,
                sink_frames=args.sink_frames, **extra,
            )  # fmt: skip
            result, video = rollout(pipe, args.action_path, settings)
            result.update(compute=compute, rollout=i, requested_frames=frames, load_s=round(load_s, 1))
            if compute != args.compute.split(",")[0] and first_video is not None and first_video.shape == video.shape:
                result["video_rel_l2_from_first_compute"] = float((video - first_video).norm() / first_video.norm())
            if i == 0 and compute == args.compute.split(",")[0]:
                first_video = video
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
        del pipe
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
