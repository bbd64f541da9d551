"""A stand-in generation engine served by the REAL worker loop (`worldgen.worker.serve`).

Only the engine is replaced: the pipe protocol, the reader thread, cancellation through the
progress callback, health and shutdown are `worldgen.worker`'s own code. The stand-in sleeps
`--step-s` per denoising step (so tests can SIGKILL or cancel a job mid-way at a known pace) and
writes a small file that records what it was asked to do (so tests can check that the episode
and settings went through the server and the spool unchanged). The acceptance tests that need
real generation use `python -m worldgen.worker --ckpt tiny` instead.

Prompts containing "[bad-input]" raise worldgen's InputError; "[explode]" raises RuntimeError.
`--fail-load` makes loading fail with worldgen's CheckpointError, as a missing checkpoint would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from contracts.settings import GenerationSettings
from worldgen.errors import CheckpointError, InputError
from worldgen.worker import serve

MAGIC = b"STANDIN-VIDEO\n"


class StandinEngine:
    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def describe(self) -> dict:
        return {"model": "standin", "device": "cpu", "dtype": "none"}

    def probe(self) -> dict:
        return {"gpu": None}

    def after_failure(self) -> None:
        pass

    def generate(self, episode_dir: Path, settings: GenerationSettings, output: Path, progress) -> Path:
        prompt = (episode_dir / "prompt.txt").read_text(encoding="utf-8")
        if "[bad-input]" in prompt:
            raise InputError(f"{episode_dir / 'prompt.txt'}: the stand-in refuses this prompt")
        if "[explode]" in prompt:
            raise RuntimeError("stand-in engine exploded")
        poses = np.load(episode_dir / "poses.npy", allow_pickle=False)
        intrinsics = np.load(episode_dir / "intrinsics.npy", allow_pickle=False)
        image = next(p for p in episode_dir.iterdir() if p.name.startswith("image."))
        for phase in ("text", "encode"):
            progress(phase, 0, 1)
            progress(phase, 1, 1)
        for step in range(settings.steps):
            progress("denoise", step, settings.steps)
            time.sleep(self.step_s)
        progress("denoise", settings.steps, settings.steps)
        progress("decode", 1, 1)
        progress("write", 1, 1)
        record = {
            "prompt": prompt,
            "poses_sha256": hashlib.sha256(poses.tobytes()).hexdigest(),
            "poses_dtype": str(poses.dtype),
            "intrinsics_sha256": hashlib.sha256(intrinsics.tobytes()).hexdigest(),
            "image_name": image.name,
            "image_sha256": hashlib.sha256(image.read_bytes()).hexdigest(),
            "settings": settings.to_dict(),
        }
        output.write_bytes(MAGIC + json.dumps(record).encode())
        return output


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--fail-load", action="store_true")
    args = parser.parse_args()

    def load() -> StandinEngine:
        if args.fail_load:
            raise CheckpointError("/nowhere: not a checkpoint folder (stand-in)")
        return StandinEngine(args.step_s)

    return serve(load)


if __name__ == "__main__":
    sys.exit(main())
