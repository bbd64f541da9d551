#!/usr/bin/env python
"""Time the whole-clip camera reconstruction of one episode (docs/benchmarks.md, issue 26).

    python bench/bench_whole_clip.py [--frames 81] [--height 480 --width 832] [--trials N] [--timeout-s S]

Renders the sim frames along the walk-and-pan path of tests/comparison/scene.py and a rollout at half
the commanded translation (`tests.room_render`, deterministic), runs
`comparison.sfm_fidelity.evaluate_reconstruction` on them as `lingbot-isaac compare` does, and prints
the seconds of each stage (wall clock), the CPU seconds of COLMAP's process, and the numbers. The trial
count and the time limit default to `lingbot-isaac compare`'s (`ReconstructionConfig`).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from comparison.reconstruction import ReconstructionConfig  # noqa: E402
from comparison.sfm_fidelity import evaluate_reconstruction  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH  # noqa: E402
from contracts.settings import FIELD_BY_NAME  # noqa: E402
from tests.comparison.scene import INTRINSICS_480x832, camera_path, render_frames  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=FIELD_BY_NAME["frame_num"].default)
    parser.add_argument("--height", type=int, default=MODEL_HEIGHT)
    parser.add_argument("--width", type=int, default=MODEL_WIDTH)
    defaults = ReconstructionConfig()
    parser.add_argument("--trials", type=int, default=defaults.trials)
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s)
    args = parser.parse_args()
    started = time.perf_counter()
    commanded = camera_path(args.frames)
    half = commanded.copy()
    half[:, :3, 3] = commanded[0, :3, 3] + 0.5 * (commanded[:, :3, 3] - commanded[0, :3, 3])
    sim = render_frames(commanded, args.height, args.width)
    rollout = render_frames(half, args.height, args.width)
    print(f"rendered 2 x {args.frames} frames {args.width}x{args.height} in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    config = ReconstructionConfig(trials=args.trials, timeout_s=args.timeout_s)
    intrinsics = np.tile(INTRINSICS_480x832, (args.frames, 1))
    result = evaluate_reconstruction(sim, rollout, commanded, intrinsics, config)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"whole-clip reconstruction: {time.perf_counter() - started:.0f} s wall, "
          f"{usage.ru_utime + usage.ru_stime:.0f} s CPU in COLMAP's process")  # fmt: skip
    print("stages (s):", json.dumps({k: round(v, 1) for k, v in result["run"]["seconds"].items()}))
    print(f"trials finished: {result['run']['trials_finished']} of {args.trials}; notes: {result['notes']}")
    for name in ("control", "rollout"):
        section = result[name]
        numbers = {k: v and round(v["mean"], 4) for k, v in section["summary"].items()}
        print(f"{name}: {section['status']} {section['reason'] or ''} {json.dumps(numbers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
