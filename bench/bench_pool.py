"""Throughput of a worker pool: N jobs through one server with one worker, then with a pool.

Usage:
  CPU, tiny model (the acceptance figure of the scale-out issue: 2 workers <= 0.6x the time of 1):
    python bench/bench_pool.py --jobs 8
  Two GPUs with a real or synthetic checkpoint (bench/synthetic_checkpoint.py):
    python bench/bench_pool.py --jobs 8 --ckpt /tmp/ckpt --devices cuda:0,cuda:1 --baseline-devices cuda:0 \
        --preset fast40 --startup-timeout 1800

  One rollout on two GPUs of a pool (setting gpus = 2) vs the same rollout on one GPU:
    python bench/bench_pool.py --jobs 1 --job-gpus 2 --ckpt /tmp/ckpt --devices cuda:0,cuda:1 \
        --baseline-devices cuda:0 --preset default --steps 10 --warmup --startup-timeout 1800

Each configuration runs a real `lingbot-isaac serve` subprocess (its workers loaded and warm
before the clock starts: `health` ok for every worker), one client submits all N jobs at once,
and the time from the first submit to the last result is measured. Prints the figures and
writes them as JSON (--out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import server_process  # noqa: E402
from bridge.client.client import Client  # noqa: E402
from bridge.client.episode_payload import EpisodePayload  # noqa: E402
from bridge.client.job_events import Result  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.settings import load_settings  # noqa: E402

# Warm-up steps: with the presets' shifts (5, 10) a 4-step schedule crosses the boundary, so both
# experts (high noise, then low) run once and stay resident.
WARMUP_STEPS = 4


def start_server(
    workdir: Path, devices: list[str], args: argparse.Namespace, threads: int | None
) -> tuple[subprocess.Popen, str]:
    config = workdir / "server.toml"
    device_list = ", ".join(f'"{d}"' for d in devices)
    config.write_text(
        "[server]\n"
        'bind = "tcp://127.0.0.1:*"\n'
        f'spool_dir = "{workdir / "spool"}"\n'
        f"max_queue = {max(32, args.jobs)}\nmax_queue_per_client = {max(16, args.jobs)}\n"
        "[worker]\n"
        f'ckpt = "{args.ckpt}"\n'
        f"devices = [{device_list}]\n"
        f"startup_timeout_s = {args.startup_timeout}\n"
    )
    env = dict(os.environ)
    if threads:  # the workers inherit it (a CPU pool of several sets its own share per worker)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return server_process.start(config, env)


def job_settings(args: argparse.Namespace) -> dict:
    """Every setting of the preset (over the defaults of contracts.settings), the flags given on top: sent
    whole, so the server's own `generation_preset` (tiny by default) never decides a job's size."""
    preset = load_settings(preset=args.preset).to_dict()  # an unknown preset: an error naming generation.toml
    given = {"size": args.size, "frame_num": args.frame_num, "steps": args.steps}
    return {**preset, **{k: v for k, v in given.items() if v is not None}}


def measure(
    devices: list[str], args: argparse.Namespace, payload: EpisodePayload, threads: int | None, gpus: int = 1
) -> dict:
    settings = {**job_settings(args), "gpus": gpus}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        load_before = os.getloadavg()[0]
        proc, endpoint = start_server(Path(tmp), devices, args, threads)
        try:
            with Client(endpoint, timeout=30, give_up_s=args.startup_timeout + 3600) as client:
                deadline = time.monotonic() + args.startup_timeout
                while not client.health()["ok"]:  # every worker loaded: the clock starts warm
                    if time.monotonic() > deadline:
                        raise SystemExit(f"workers not ready after {args.startup_timeout} s")
                    time.sleep(0.5)
                if args.warmup:  # every worker loads its experts (they load on first use) before the clock
                    warm = [client.submit(payload, {**settings, "steps": WARMUP_STEPS, "seed": 10_000 + i})
                            for i in range(max(1, len(devices) // gpus))]  # fmt: skip
                    if not all(isinstance(job.wait(), Result) for job in warm):
                        raise SystemExit("a warm-up job failed; see the server log")
                started = time.monotonic()
                jobs = [client.submit(payload, {**settings, "seed": i}) for i in range(args.jobs)]
                outcomes = [job.wait() for job in jobs]
                seconds = time.monotonic() - started
        finally:
            server_process.stop(proc)
            if args.out:  # the server's log beside the figures: what the workers did, and why a job was short
                tag = "_".join(d.replace(":", "") for d in devices)
                log_copy = args.out.with_name(f"{args.out.stem}.{tag}.gpus{gpus}.server.log")
                log_copy.parent.mkdir(parents=True, exist_ok=True)
                log_copy.write_bytes((Path(tmp) / "server.log").read_bytes())
    failed = [o for o in outcomes if not isinstance(o, Result)]
    if failed:
        raise SystemExit(f"{len(failed)} job(s) failed: {failed[0]}")
    per_job = sorted(o.seconds for o in outcomes)
    ran = (outcomes[0].provenance or {}) if outcomes else {}
    print(f"  what ran (first job): {ran.get('output')} {ran.get('adjustments')} {ran.get('timings')}", flush=True)
    return {"what_ran": {key: ran.get(key) for key in ("output", "settings", "timings", "model", "compute", "adjustments")},
            "devices": devices, "job_gpus": gpus, "jobs": args.jobs, "seconds": round(seconds, 2), "threads": threads,
            "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2),
            "jobs_per_minute": round(60 * args.jobs / seconds, 2), "job_seconds_median": per_job[len(per_job) // 2]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs submitted at once")
    parser.add_argument("--devices", default="cpu,cpu", help="the pool's devices, comma-separated")
    parser.add_argument("--baseline-devices", default="cpu", help="the baseline's devices (one worker)")
    parser.add_argument("--ckpt", default="tiny", help="checkpoint folder or 'tiny'")
    parser.add_argument(
        "--episode", type=Path, default=REPO / "data" / "sample_room", help="episode folder sent N times"
    )
    parser.add_argument(
        "--preset", default="tiny", help="settings preset of config/generation.toml each job sends (tiny: CPU-sized)"
    )
    parser.add_argument("--size", help="max area H*W of each job (default: the preset's)")
    parser.add_argument("--frame-num", type=int, help="frames per job, 4n+1 (default: the preset's)")
    parser.add_argument("--steps", type=int, help="denoising steps per job (default: the preset's)")
    parser.add_argument(
        "--baseline-threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of the baseline worker (default: torch's own choice, all cores)",
    )
    parser.add_argument(
        "--job-gpus",
        type=int,
        choices=(1, 2),
        default=1,
        help="the pool's jobs ask for this many GPUs (setting gpus; 2: each job on two workers at once); "
        "the baseline's jobs always ask for 1",
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help=f"before the clock starts, run one {WARMUP_STEPS}-step job per worker (a two-GPU job per pair), so "
        "both experts, which load on first use, are resident in every worker",
    )
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for the workers to load")
    parser.add_argument(
        "--only",
        choices=("baseline", "pool"),
        help="measure one configuration only (a run split over two commands); no ratio is printed",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    payload = EpisodePayload.from_dir(args.episode)
    results = {}
    for label, devices, threads in (("baseline", args.baseline_devices, args.baseline_threads),
                                    ("pool", args.devices, None)):  # fmt: skip
        if args.only and label != args.only:
            continue
        device_list = [d.strip() for d in devices.split(",") if d.strip()]
        print(f"{label}: {len(device_list)} worker(s) on {device_list}, {args.jobs} jobs ...", flush=True)
        results[label] = measure(device_list, args, payload, threads, args.job_gpus if label == "pool" else 1)
        print(f"  {results[label]['seconds']:.1f} s, {results[label]['jobs_per_minute']:.2f} jobs/min", flush=True)
    if args.only:
        if args.out:
            atomic.write_json(args.out, {**results, "settings": job_settings(args)}, indent=1)
        return 0
    ratio = results["pool"]["seconds"] / results["baseline"]["seconds"]
    results.update(ratio=round(ratio, 3), cpu_count=os.cpu_count(), settings={
        "ckpt": args.ckpt, "preset": args.preset, **job_settings(args), "job_gpus": args.job_gpus})  # fmt: skip
    target = "issue 10's two-GPU target: <= 0.55" if args.job_gpus == 2 else "the issue's CPU target: <= 0.60"
    print(f"pool / baseline time: {ratio:.2f} ({target})")
    if args.out:
        atomic.write_json(args.out, results, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
