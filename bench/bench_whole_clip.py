#!/usr/bin/env python
"""Time the whole-clip camera reconstruction of one episode (docs/benchmarks.md, issues 26 and 54).

    python bench/bench_whole_clip.py [--frames 81] [--height 480 --width 832] [--trials N] [--timeout-s S]
        [--case half|same|yaw|noise] [--mapper M] [--max-width W]

Renders the sim frames along the walk-and-pan path of tests/comparison/scene.py and a rollout (`--case`:
at half the commanded translation, the default; the same path; the path with a yaw ramp added, 0 to 10
degrees over the clip, so RotErr sums to 10 x (frames) / 2 degrees; random noise) with
`tests.room_render` (deterministic), runs
`comparison.sfm_fidelity.evaluate_reconstruction` on them as `lingbot-isaac compare` does, and prints
the seconds of each stage (wall clock), the CPU seconds of COLMAP's process, and the numbers. The trial
count, time limit, mapper and SfM frame width default to `lingbot-isaac compare`'s (`ReconstructionConfig`);
issue 26's recipe is `--mapper incremental --max-width 832`.
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
from tests.comparison.scene import (  # noqa: E402
    INTRINSICS_480x832,
    camera_path,
    half_translation,
    render_frames,
    yaw_ramp,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=FIELD_BY_NAME["frame_num"].default)
    parser.add_argument("--height", type=int, default=MODEL_HEIGHT)
    parser.add_argument("--width", type=int, default=MODEL_WIDTH)
    defaults = ReconstructionConfig()
    parser.add_argument("--trials", type=int, default=defaults.trials)
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s)
    parser.add_argument("--case", choices=("half", "same", "yaw", "noise"), default="half")
    parser.add_argument("--mapper", default=defaults.mapper)
    parser.add_argument("--max-width", type=int, default=defaults.max_width)
    args = parser.parse_args()
    started = time.perf_counter()
    commanded = camera_path(args.frames)
    sim = render_frames(commanded, args.height, args.width)
    if args.case == "noise":
        rollout = np.random.default_rng(0).integers(0, 256, sim.shape, dtype=np.uint8)
    elif args.case == "same":
        rollout = sim.copy()
    else:
        rollout = render_frames(half_translation(commanded) if args.case == "half" else yaw_ramp(commanded, 10.0),
                                args.height, args.width)  # fmt: skip
    print(f"rendered 2 x {args.frames} frames {args.width}x{args.height} in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    config = ReconstructionConfig(
        trials=args.trials, timeout_s=args.timeout_s, mapper=args.mapper, max_width=args.max_width
    )
    intrinsics = np.tile(INTRINSICS_480x832, (args.frames, 1))
    # the poses as an episode stores them (poses.npy is float32)
    result = evaluate_reconstruction(sim, rollout, commanded.astype(np.float32), intrinsics, config)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"whole-clip reconstruction: {time.perf_counter() - started:.0f} s wall, "
          f"{usage.ru_utime + usage.ru_stime:.0f} s CPU in COLMAP's process")  # fmt: skip
    print("stages (s):", json.dumps({k: round(v, 1) for k, v in result["run"]["seconds"].items()}))
    print(f"case {args.case}, mapper {args.mapper}, SfM at most {args.max_width} px wide: "
          f"frames {result['run']['frame_size']}")  # fmt: skip
    print(f"trials finished: {result['run']['trials_finished']} of {args.trials}; notes: {result['notes']}")
    for name in ("control", "rollout"):
        section = result[name]
        numbers = {k: v and round(v["mean"], 4) for k, v in section["summary"].items()}
        print(f"{name}: {section['status']} {section['reason'] or ''} {json.dumps(numbers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
