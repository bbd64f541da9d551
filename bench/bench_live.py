"""Live mode at real-time pace: a live job (model fast) fed 16 poses a second, as a simulation would.

Usage:
  CPU, tiny model (runs anywhere; its figures only show the machinery):
    python bench/bench_live.py --frame-num 33
  The lent H100: synthetic full-size Fast (bench/synthetic_checkpoint.py), 480x832, a 24 GiB budget:
    python bench/bench_live.py --ckpt /tmp/fast-synth --build-synthetic --device cuda --vram-budget 24 \\
        --size 480*832 --frame-num 81 --startup-timeout 1800 --json out/bench_live.json
  Two GPUs, one live view (issue 55): --gpus 0,1 in place of --device (the worker splits each chunk forward
  over both; the live job asks gpus = 2); --gpus cpu,cpu: the same over two CPU ranks with the tiny model.

A real `lingbot-isaac serve` subprocess ([worker] model fast, warm: one batch job of the live job's
frames first, so the Fast DiT, umT5 and the VAE are resident and every chunk's kernels and cuDNN graphs
made before the clock starts; --warm-frames 9 leaves the chunks after the first to the live job). The client opens a live job with the episode's
first frame (default data/sample_room; its path is continued at its last velocity when --frame-num asks
for more poses) and sends one pose every 1/16 s times 1/--pace (each pose in its own batch, as a
simulation step would). Per chunk it prints the pose-to-pixels latency (the server's: from the chunk's
last pose arriving to its `chunk` message leaving; and the client's: from sending that pose to holding
the chunk) and how far behind the model was. The server keeps up when it makes chunks at least as fast
as the poses complete them (16 / 12 = 1.33 chunks a second at pace 1 for v1 Fast's 12-frame chunks, 1.0 for
LingBot-World 2.0's 16-frame ones) and the lag does not grow.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import server_process  # noqa: E402
from bridge.client.client import Client  # noqa: E402
from bridge.client.episode_payload import EpisodePayload  # noqa: E402
from bridge.client.job_events import Result  # noqa: E402
from bridge.client.live_client import LiveChunks, LiveJob  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.engine_options import COMPUTES  # noqa: E402
from contracts.model_frame import MODEL_SIZE  # noqa: E402
from contracts.settings import FIELD_BY_NAME  # noqa: E402

POSE_FPS = 16.0  # the model's frame rate: one pose per video frame


def ensure_synthetic(ckpt: Path) -> None:
    from worldgen.runtime.checkpoint import FAST_NF4_DIR  # torch: only for the GPU run

    if (ckpt / FAST_NF4_DIR / "model.safetensors").exists():
        return
    script = Path(__file__).with_name("synthetic_checkpoint.py")
    subprocess.run([sys.executable, str(script), str(ckpt), "--layout", "nf4", "--experts", "none", "--fast"],
                   check=True)  # fmt: skip


def start_server(workdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    if args.gpus == "cpu,cpu":  # two CPU ranks (gloo): the two-GPU path's check on the tiny model
        where = 'device = ["cpu", "cpu"]'
    else:  # one worker on two GPUs: each chunk forward split over both (worldgen.pipelines.two_gpu)
        where = f'gpus = "{args.gpus}"' if args.gpus else f'device = "{args.device}"'
    worker = [f'ckpt = "{args.ckpt}"', 'model = "fast"', where,
              f"startup_timeout_s = {args.startup_timeout}", "stall_timeout_s = 900.0"]  # fmt: skip
    if args.compute:
        worker.append(f'compute = "{args.compute}"')
    if args.vram_budget:
        worker.append(f"vram_budget_gb = {args.vram_budget}")
    if args.warm_up:
        worker.append("warm_up = true")
    preset = f'generation_preset = "{args.preset}"\n' if args.preset else ""
    (workdir / "server.toml").write_text(
        "[server]\n"
        'bind = "tcp://127.0.0.1:*"\n'
        f'spool_dir = "{workdir / "spool"}"\n'
        "live_ahead_chunks = 1000\n"  # never refuse: the bench measures whether the model keeps up
        f"{preset}"
        "[limits]\nmax_frame_num = 1001\n"
        "[worker]\n" + "\n".join(worker) + "\n"
    )
    return server_process.start(workdir / "server.toml")


def extend_path(poses: np.ndarray, count: int) -> np.ndarray:
    """`count` poses: the episode's, then on at its last step's velocity (translation only)."""
    if len(poses) >= count:
        return poses[:count]
    step = poses[-1, :3, 3] - poses[-2, :3, 3]
    more = np.repeat(poses[-1:], count - len(poses), axis=0)
    more[:, :3, 3] += step * np.arange(1, count - len(poses) + 1)[:, None]
    return np.concatenate([poses, more]).astype(np.float32)


def run_live(client: Client, payload: EpisodePayload, settings: dict, poses: np.ndarray, pace: float) -> dict:
    chunks = LiveChunks()
    live = LiveJob.open(client, payload.image, payload.prompt, payload.intrinsics[:1], settings, on_event=chunks)
    sent_at: list[float] = []
    ack_s: list[float] = []  # each batch's round trip: a stalled server or client shows here, not in the worker
    started = time.monotonic()

    def feed() -> None:
        for i, pose in enumerate(poses):
            if pace > 0:
                time.sleep(max(0.0, started + i / (POSE_FPS * pace) - time.monotonic()))
            asked = time.monotonic()
            live.send_poses(pose[None], end=i == len(poses) - 1, timeout=3600)
            sent_at.append(time.monotonic())
            ack_s.append(sent_at[-1] - asked)

    sender = threading.Thread(target=feed, daemon=True)
    sender.start()
    outcome = live.job.wait(timeout=None)
    sender.join(timeout=10)
    if not isinstance(outcome, Result):
        raise SystemExit(f"the live job failed: {outcome}")
    rows = []
    for chunk in chunks.in_order():
        timing = chunk.live or {}
        last_pose = timing.get("poses", 0) - 1
        client_lag = chunks.arrived_at[chunk.index] - sent_at[last_pose] if 0 <= last_pose < len(sent_at) else None
        rows.append({"index": chunk.index, "poses": timing.get("poses"), "lag_s": timing.get("lag_s"),
                     "client_lag_s": None if client_lag is None else round(client_lag, 3),
                     "started_s": timing.get("started_s"), "sent_s": timing.get("sent_s"),
                     "behind": timing.get("behind")})  # fmt: skip
    slowest = int(np.argmax(ack_s)) if ack_s else None
    acks = {"median_s": round(float(np.median(ack_s)), 4), "max_s": round(max(ack_s), 3), "max_at_pose": slowest,
            "max_at_s": round(sent_at[slowest] - started, 3)} if ack_s else None  # fmt: skip
    return {
        "chunks": rows,
        "seconds": round(time.monotonic() - started, 3),
        "pose_acks": acks,
        "provenance": outcome.provenance,
    }


def verdict(rows: list[dict], pace: float) -> dict:
    """Chunks a second after the first (sent times) against the rate the poses complete them."""
    sent = [r["sent_s"] for r in rows if r["sent_s"] is not None]
    lags = [r["lag_s"] for r in rows if r["lag_s"] is not None]
    counts = [r["poses"] for r in rows if r["poses"]]
    # poses a chunk completes: 12 for v1 Fast's 3-frame chunks, 16 for LingBot-World 2.0's 4-frame ones
    per_chunk = float(np.median(np.diff(counts))) if len(counts) > 2 else 12.0
    needed = POSE_FPS * pace / per_chunk if pace > 0 else None
    rate = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else None
    keeps_up = (
        None if needed is None or rate is None else rate >= 0.95 * needed and lags[-1] <= 2 * max(lags[1:2] or lags)
    )
    return {"chunk_rate_per_s": None if rate is None else round(rate, 3),
            "pose_chunk_rate_per_s": None if needed is None else round(needed, 3),
            "lag_first_s": lags[0] if lags else None, "lag_median_s": float(np.median(lags)) if lags else None,
            "lag_last_s": lags[-1] if lags else None, "keeps_up": keeps_up}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default="tiny", help="checkpoint folder (with the Fast DiT), or tiny")
    parser.add_argument("--build-synthetic", action="store_true", help="write a full-size synthetic one at --ckpt")
    parser.add_argument("--device", default="cpu", help="the worker's device: cpu, cuda, cuda:N")
    parser.add_argument(
        "--gpus",
        metavar="I,J",
        help='the worker on two GPUs ([worker] gpus = "I,J", replacing --device): each chunk forward split '
        "over both, the live job asks gpus = 2; cpu,cpu: the same over two CPU ranks",
    )
    parser.add_argument("--vram-budget", type=float, help="GiB, as `serve`'s [worker] vram_budget_gb")
    parser.add_argument("--size", help=f"max area H*W (default: the tiny preset's on the CPU, else {MODEL_SIZE})")
    parser.add_argument(
        "--frame-num", type=int, default=FIELD_BY_NAME["frame_num"].default, help="the live job's planned frames"
    )
    parser.add_argument(
        "--warm-frames",
        type=int,
        help="frames of the batch job run before the clock (default: --frame-num, so every chunk's shapes and "
        "kernels are the warm process's; 9: one chunk, the process's first use of the others in the live job; "
        "0: none, the server's own start is all the warming (with --warm-up: its warm-up for --preset's jobs))",
    )
    parser.add_argument("--warm-up", action="store_true", help="the server's [worker] warm_up = true")
    parser.add_argument("--preset", help="the server's generation_preset (config/generation.toml), e.g. live")
    parser.add_argument(
        "--attention-frames",
        type=int,
        help=f"the live job's attention_frames ({FIELD_BY_NAME['attention_frames'].help}; default: the preset's)",
    )
    parser.add_argument("--pace", type=float, default=1.0, help="poses at 16/s times this (0: as fast as taken)")
    parser.add_argument("--episode", type=Path, default=REPO / "data" / "sample_room", help="first frame, prompt, path")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for the worker to load")
    parser.add_argument("--compute", choices=COMPUTES, help="the worker's compute (default: the engine's, exact)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.build_synthetic:
        ensure_synthetic(Path(args.ckpt))
    payload = EpisodePayload.from_dir(args.episode)
    poses = extend_path(payload.poses.astype(np.float32), args.frame_num)
    size = args.size or ("48*80" if args.ckpt == "tiny" else MODEL_SIZE)
    settings = {"model": "fast", "size": size, "frame_num": args.frame_num, "seed": 0}
    if args.gpus:
        settings["gpus"] = 2
    if args.attention_frames is not None:
        settings["attention_frames"] = args.attention_frames
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        proc, endpoint = start_server(Path(tmp), args)
        try:
            with Client(endpoint, timeout=60, give_up_s=args.startup_timeout + 3600) as client:
                deadline = time.monotonic() + args.startup_timeout
                while not client.health()["ok"]:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the worker is not ready after {args.startup_timeout} s")
                    time.sleep(0.5)
                reported = client.health()["worker"].get("reported") or {}
                ahead = reported.get("pipeline", {})
                print(f"worker ready: loaded in {reported.get('load_s')} s (kernels compiled ahead "
                      f"{ahead.get('compile_ahead_s')} s, text and VAE run ahead {ahead.get('first_use_ahead_s')} s, "
                      f"warm-up {reported.get('warm_up_s')} s)",
                      flush=True)  # fmt: skip
                # models resident and this job's shapes met once, then the clock
                # (on the live job's path, extended as far: the sample episode alone has 3 chunks' poses)
                count = args.frame_num if args.warm_frames is None else args.warm_frames
                warm = None
                if count:
                    warm_payload = dataclasses.replace(
                        payload, poses=extend_path(payload.poses.astype(np.float32), count),
                        intrinsics=np.repeat(payload.intrinsics[:1], count, axis=0),
                    )  # fmt: skip
                    warm = client.submit(warm_payload, {**settings, "frame_num": count}).wait()
                    if not isinstance(warm, Result):
                        raise SystemExit(f"the warm-up job failed: {warm}")
                figures = run_live(client, payload, settings, poses, args.pace)
                figures["warm_provenance"] = warm.provenance if warm is not None else None
        except BaseException:
            print((Path(tmp) / "server.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            server_process.stop(proc)
    rows = figures["chunks"]
    summary = verdict(rows, args.pace)
    print(f"live job: {args.frame_num} frames at {size}, poses at {POSE_FPS * args.pace:g}/s "
          f"({args.ckpt}, {args.device})")  # fmt: skip
    # the worker's own seconds per chunk (the rollout's record): where a chunk's time went on its side
    # beside them the warm-up job's, the same chunks in the same process with every pose there from the start
    worker, warm = (
        ((figures[key] or {}).get("timings") or {}).get("chunks") or [] for key in ("provenance", "warm_provenance")
    )
    print(" chunk  poses  started_s  sent_s  pose-to-pixels_s  client_s  behind  worker: DiT_s  decode_s  poses_s"
          "  wall_s  warm-up job: DiT_s")  # fmt: skip
    for r in rows:
        w = worker[r["index"]] if r["index"] < len(worker) else {}
        b = warm[r["index"]] if r["index"] < len(warm) else {}
        print(f" {r['index']:5d}  {r['poses']:5d}  {r['started_s']:9.2f}  {r['sent_s']:6.2f}  {r['lag_s']:16.2f}"
              f"  {r['client_lag_s'] if r['client_lag_s'] is not None else float('nan'):8.2f}  {r['behind']:6d}"
              f"  {w.get('dit', float('nan')):13.2f}  {w.get('decode', float('nan')):8.2f}"
              f"  {w.get('poses', float('nan')):7.2f}  {w.get('wall', float('nan')):6.2f}"
              f"  {b.get('dit', float('nan')):18.2f}")  # fmt: skip
    for key, name in (("provenance", "live job"), ("warm_provenance", "warm-up job")):
        record = figures[key] or {}
        peak = (record.get("timings") or {}).get("peak_vram_gib")
        plan = [line.strip() for line in str(record.get("memory_plan", "")).splitlines()]
        denoise = next((line for line in plan if line.startswith("denoise")), "no plan recorded")
        compute = record.get("compute") or {}
        # whether its chunks decoded beside the next chunk's forwards (LINGBOT_ISAAC_DECODE_OVERLAP=0: never)
        overlap = {True: "ran", False: "off", None: "not recorded"}[compute.get("decode_overlap")]
        print(f"{name}: peak VRAM {peak} GiB; decode overlap {overlap}, VAE {compute.get('vae_dtype')}; {denoise}")
    print(f"pose batches' round trips: {figures['pose_acks']}")
    print(f"chunks/s {summary['chunk_rate_per_s']} (the poses complete {summary['pose_chunk_rate_per_s']}/s): "
          f"keeps up: {summary['keeps_up']}; lag first {summary['lag_first_s']} s, median {summary['lag_median_s']} s, "
          f"last {summary['lag_last_s']} s")  # fmt: skip
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "settings": settings, "summary": summary,
                  "chunks": rows, "seconds": figures["seconds"], "pose_acks": figures["pose_acks"],
                  "what_ran": {k: (figures["provenance"] or {}).get(k) for k in ("output", "compute", "timings")}}  # fmt: skip
        atomic.write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
