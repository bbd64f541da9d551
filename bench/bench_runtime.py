"""The runtime benchmark in one run: DiT forward (NF4 and bf16), a full rollout under a VRAM budget
with peak VRAM and RSS per phase, and expert load throughput next to raw read throughput.

Usage (on the GPU machine):
  python bench/bench_runtime.py --ckpt /tmp/ckpt --action-path EXAMPLE_DIR [--vram-budget 24] [--steps N]
      [--write-synthetic] [--out bench-results.json]

--write-synthetic first writes a synthetic full-size NF4 checkpoint to --ckpt when it is not there
(bench/synthetic_checkpoint.py). Each part runs in its own process (the VRAM budget is a
per-process limit, and the DiT benchmark needs ~40 GiB unbudgeted); the summary at the end
compares every figure with the targets of the runtime issue.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from contracts import atomic  # noqa: E402

BF16_REFERENCE_SECONDS = 4.57  # the reference bf16 DiT forward at 480x832x81 on the lent H100


def run_part(script: str, args: list[str], json_path: Path) -> dict:
    command = [sys.executable, str(BENCH / script), *args, "--json", str(json_path)]
    print(f"$ {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)
    return json.loads(json_path.read_text())


def summarize(dit: dict, rollout: dict, budget: float) -> list[str]:
    def best(weights: str) -> dict:
        runs = [r for r in dit["runs"] if r["weights"] == weights and r["batch"] == 1]
        return min(runs, key=lambda r: r["seconds"])

    nf4, bf16 = best("nf4"), best("bf16")
    load = rollout["load_throughput"]
    phases = rollout["phases"]
    loads = rollout["expert_loads"]
    lines = [
        f"GPU: {dit['device']}, torch {dit['torch']}; {dit['tokens']} tokens per forward",
        f"DiT forward NF4 {nf4['seconds']:.2f} s (activations {nf4['activations_gib']:.1f} GiB), bf16 "
        f"{bf16['seconds']:.2f} s; NF4 / reference bf16 ({BF16_REFERENCE_SECONDS} s) = "
        f"{nf4['seconds'] / BF16_REFERENCE_SECONDS:.2f} (target <= 0.90)",
        f"expert load {load['load_gbps']:.2f} GB/s vs raw read {load['raw_gbps']:.2f} GB/s = "
        f"{load['load_gbps'] / load['raw_gbps']:.0%} (target >= 70%; page cache "
        f"{'dropped' if load['cold'] else 'NOT dropped'})",
        f"rollout under --vram-budget {budget:g}: {rollout['total_seconds']:.0f} s, video {rollout['video_shape']}, "
        f"finite={rollout['finite']}",
    ]
    for p in phases:
        lines.append(
            f"  {p['name']:<8} {p['seconds']:7.1f} s   peak RSS {p['peak_rss_gib']:.2f} GiB   "
            f"peak VRAM {p['peak_vram_gib']:.2f} GiB"
        )
    lines += [
        f"peak VRAM {rollout['peak_vram_gib']:.2f} GiB (target <= {budget:g}), "
        f"peak RSS {rollout['peak_rss_gib']:.2f} GiB (target <= 8)",
        "expert loads: "
        + ", ".join(f"{k} x{v['loads']}" for k, v in loads.items())
        + (" (both resident: no reload at the boundary)" if all(v["loads"] == 1 for v in loads.values()) else ""),
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="NF4 checkpoint folder (synthetic or real)")
    parser.add_argument("--action-path", type=Path, required=True, help="a LingBot example folder")
    parser.add_argument("--vram-budget", type=float, default=24)
    parser.add_argument("--steps", type=int, help="denoising steps (default: bench_rollout.py's preset's)")
    parser.add_argument("--size", help="max area H*W (default: bench_rollout.py's preset's, the model frame)")
    parser.add_argument("--write-synthetic", action="store_true")
    parser.add_argument("--dit-repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-runtime.json"))
    args = parser.parse_args()
    if args.write_synthetic and not (args.ckpt / "high_noise_model_bnb_nf4").exists():
        subprocess.run([sys.executable, str(BENCH / "synthetic_checkpoint.py"), str(args.ckpt)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        dit = run_part("bench_dit.py", ["--repeats", str(args.dit_repeats)], Path(tmp) / "dit.json")
        rollout = run_part(
            "bench_rollout.py",
            [
                str(args.ckpt),
                "--action-path",
                str(args.action_path),
                "--vram-budget",
                str(args.vram_budget),
                *(["--steps", str(args.steps)] if args.steps else []),
                *(["--size", args.size] if args.size else []),
                "--load-throughput",
            ],  # fmt: skip
            Path(tmp) / "rollout.json",
        )
    lines = summarize(dit, rollout, args.vram_budget)
    print("\n== runtime benchmark ==\n" + "\n".join(lines))
    atomic.write_json(args.out, {"dit": dit, "rollout": rollout, "summary": lines}, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
