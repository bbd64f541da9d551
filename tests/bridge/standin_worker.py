"""A stand-in generation engine served by the REAL worker loop (`worldgen.worker.serve`).

Only the engine is replaced: the pipe protocol, the reader thread, cancellation through the
progress callback, health and shutdown are `worldgen.worker`'s own code. The stand-in sleeps
`--step-s` per denoising step (so tests can SIGKILL or cancel a job mid-way at a known pace) and
writes a small file that records what it was asked to do (so tests can check that the episode
and settings went through the server and the spool unchanged). The acceptance tests that need
real generation use `python -m worldgen.worker` with [worker] ckpt = "tiny" instead.

The file is a real (if unplayable) mp4 container: `ftyp`, a `moov` whose sample table holds the
frame count the engine would write, and an `mdat` holding the record, so the server's check of
every result (bridge.server.mp4) runs on it. `--truncate` leaves out the `moov` (a write cut short by a
full disk); `--result-mb N` pads the `mdat` to N MiB.

A two-GPU job (`gpus = 2` in a pool) runs as the real engine's does, minus the tensors: the job's
worker connects to its peer's Unix socket (`guide`), proves the token, and waits for the peer's
answer at every denoising step, so killing either worker mid-job breaks the job as it would.

Prompts containing "[bad-input]" raise worldgen's InputError; "[explode]" raises RuntimeError.
`--fail-load` makes loading fail with worldgen's CheckpointError, as a missing checkpoint would.
`--hold-until FILE` holds every job before its first step until FILE exists, so a test can keep the
worker busy until it has seen what it waits for (a client told `busy`), on a fast machine or a slow one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np

from contracts.engine_options import EngineOptions
from contracts.provenance import make_record, sidecar_path, to_json
from contracts.settings import GenerationSettings
from worldgen.errors import CheckpointError, InputError
from worldgen.worker import serve

MAGIC = b"STANDIN-VIDEO\n"


def box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", 8 + len(body)) + kind + body


def mp4_bytes(frames: int, payload: bytes, truncate: bool = False) -> bytes:
    """ftyp + moov (one track whose stsz counts `frames` samples) + mdat(payload)."""
    stsz = box(b"stsz", struct.pack(">III", 0, 1, frames))  # version+flags, one size for all, count
    moov = box(b"moov", box(b"trak", box(b"mdia", box(b"minf", box(b"stbl", stsz)))))
    ftyp = box(b"ftyp", b"isom\0\0\0\0isom")
    mdat = box(b"mdat", payload)
    return ftyp + mdat if truncate else ftyp + moov + mdat


class StandinEngine:
    def __init__(
        self,
        step_s: float,
        options: EngineOptions,
        truncate: bool = False,
        result_mb: float = 0.0,
        hold_until: Path | None = None,
    ) -> None:
        self.step_s, self.truncate, self.result_bytes = step_s, truncate, int(result_mb * (1 << 20))
        self.options, self.hold_until = options, hold_until

    def expected_frames(self, episode_dir: Path, settings: GenerationSettings) -> int:
        """The stand-in's own rule (no torch import): one frame per pose, at most frame_num."""
        poses = np.load(episode_dir / "poses.npy", mmap_mode="r", allow_pickle=False)
        return min(settings.frame_num, len(poses))

    def describe(self) -> dict:
        return {"model": "standin", "device": "cpu", "dtype": "none", "options": self.options.to_dict()}

    def probe(self) -> dict:
        return {"gpu": None}

    def after_failure(self) -> None:
        pass

    def guide(self, address: str, token: str, on_step, stop=None) -> int:
        """The second worker of a two-GPU job: answer one byte per step until the job's worker closes."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(1)
        listener.settimeout(0.25)
        deadline = time.monotonic() + 60
        while True:
            if (stop and stop()) or time.monotonic() > deadline:
                raise RuntimeError("the job's worker never connected")
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            if conn.recv(len(token)) == token.encode():
                break
            conn.close()
        listener.close()
        steps = 0
        with conn:
            conn.sendall(b"k")
            while conn.recv(1):
                conn.sendall(b"k")
                steps += 1
                on_step(steps)
        return steps

    def generate(
        self, episode_dir: Path, settings: GenerationSettings, output: Path, progress, on_chunk=None, peer=None
    ) -> Path:
        # the Engine interface (worldgen.worker): on_chunk is for model fast; the stand-in makes no chunks
        conn = None
        if peer is not None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            for _ in range(600):
                try:
                    conn.connect(peer["address"])
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    time.sleep(0.05)
            conn.sendall(peer["token"].encode())
            if conn.recv(1) != b"k":
                raise RuntimeError(f"the second worker ({peer['name']}) did not answer")
        try:
            return self._generate(episode_dir, settings, output, progress, conn, peer)
        finally:
            if conn is not None:
                conn.close()

    def _generate(self, episode_dir: Path, settings: GenerationSettings, output: Path, progress, conn, peer) -> Path:
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
        while self.hold_until is not None and not self.hold_until.exists():
            progress("denoise", 0, settings.steps)  # a cancel reaches the job here too
            time.sleep(0.05)
        for step in range(settings.steps):
            progress("denoise", step, settings.steps)
            time.sleep(self.step_s)
            if conn is not None:  # the unconditional pass, on the peer
                conn.sendall(b"s")
                if conn.recv(1) != b"k":
                    raise RuntimeError(f"the second worker of this two-GPU job ({peer['name']}) is gone")
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
            "peer": None if peer is None else peer["name"],
        }
        frames = self.expected_frames(episode_dir, settings)
        padding = b"\0" * max(0, self.result_bytes)
        # like the real worker: the provenance record first, beside the video (contracts.provenance)
        sidecar_path(output).write_bytes(
            to_json(
                make_record(  # no fsync: the stand-in's jobs stay ~ms
                    producer="worker",
                    model={
                        "family": "stand-in",
                        "variant": settings.to_dict().get("model", "base"),
                        "weights": "none",
                        "random_weights": False,
                        "name": "stand-in engine (tests)",
                    },
                    checkpoint={"path": None, "layout": None, "fingerprint": None},
                    compute={"device": "cpu"},
                    settings={**settings.to_dict(), "frame_num": frames},
                    output={"frames": frames, "height": None, "width": None, "fps": settings.fps},
                    timings={"denoise_s": round(self.step_s * settings.steps, 3)},
                )
            )
        )
        output.write_bytes(mp4_bytes(frames, padding + MAGIC + json.dumps(record).encode(), self.truncate))
        return output


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--fail-load", action="store_true")
    parser.add_argument("--truncate", action="store_true", help="write mp4s without their moov atom")
    parser.add_argument("--result-mb", type=float, default=0.0, help="pad each result to this size")
    parser.add_argument("--hold-until", type=Path, help="hold each job before its first step until this file exists")
    args = parser.parse_args()

    def load(options: EngineOptions) -> StandinEngine:
        if args.fail_load:
            raise CheckpointError("/nowhere: not a checkpoint folder (stand-in)")
        return StandinEngine(args.step_s, options, args.truncate, args.result_mb, args.hold_until)

    return serve(load)


if __name__ == "__main__":
    sys.exit(main())
