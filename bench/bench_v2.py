"""LingBot-World 2.0 (causal-fast 14B / 1.3B, causal-pretrain 14B) on one GPU: whole rollouts, timed per chunk.

Usage:
  python bench/bench_v2.py --ckpt CKPT_DIR --example EXAMPLE_DIR [--model fast|causal] [--compute exact,fp8]
      [--frames 81,81,361] [--size 480*832] [--attention-frames 18] [--sink-frames 6] [--seed 42]
      [--steps 40] [--vram-budget GIB] [--assets-dir DIR] [--first-use-ahead] [--decode-overlap on|off]
      [--sink none|mp4|count] [--gpus 0,1] [--profile DIR] [--json OUT.json]

CKPT_DIR is a 2.0 download (real, or bench/synthetic_checkpoint.py --v2 ...); EXAMPLE_DIR holds image.jpg,
poses.npy, intrinsics.npy and prompt.txt. One pipeline is loaded per --compute entry (`load_pipeline`, which
compiles the job's kernels ahead); each --frames entry is one rollout through `pipe.generate` with every chunk
streamed out (`on_chunk`), so the first rollout after a load is a fresh process's first job and a repeated
entry shows the warm figures. Per rollout it prints and writes (--json, rewritten after each rollout): seconds
to the first chunk, each chunk's seconds (between `on_chunk` calls, and `pipe.chunk_timings`' DiT/encode/decode),
the steady chunk (median of the chunks after the first), the whole rollout, the load, peak CUDA memory
allocated / reserved (reset per rollout; `resident_gib`: allocated when the rollout started), the process's peak
RSS, the KV cache plan, and for every compute after the first the relative L2 distance of its final latents
(`pipe.last_latents`, all chunks) from the first compute's same rollout (same seed, same inputs; relative to
the exact one's norm whichever ran first).
--model causal runs the causal-pretrain loop (`--steps` guided steps a chunk, guidance 5.0);
--frames 17 is one chunk (13 frames, 4 latent frames).
Each rollout keeps its chunks as the mp4's uint8 frames, as `lingbot-isaac generate` and a worker do
(`worldgen.rollout.mp4_only`: the peak RSS is theirs), and says whether its chunks decoded beside the next
chunk's forwards (`decode_overlap`, on by default where the plan has room: `--decode-overlap off` turns it
off, as LINGBOT_ISAAC_DECODE_OVERLAP=0 does), the VAE's dtype and cut (`vae`: its tiles, parked in host
memory under a tight budget). `--first-use-ahead` loads as a server does (umT5 and the VAE run once at the
job's shapes in the load: `FastPipeline.first_use_ahead`), so the first chunk is a server's first job's;
without it, a one-shot `generate`'s.
--gpus 0,1: each compute runs on the first GPU alone, then split over both (`load_pipeline(devices=...)`,
`worldgen.pipelines.two_gpu`: each chunk forward sequence-parallel); a two-GPU rollout adds the rel-L2 of its
final latents from the one-GPU rollout of the same compute and seed (`rel_l2_vs_one_gpu`), rank 1's peak CUDA
memory (`peer_max_allocated_gib`, asked from its own process) and what the link moved per chunk, both
directions (`link_mb_per_chunk`: between `on_chunk` calls, so a chunk's cache refresh counts in the next), and
rank 1's milliseconds a forward (`peer_forward_ms`: waiting for its inputs, its host launching, its GPU span) and
allocation retries (`bench.two_gpu_link`).
--profile DIR: each compute's second rollout (a warm one) runs under `bench.kernel_profile.profiled`, its summary
in DIR/profile-<compute>[-2gpu]-<n>.txt (n: the rollout's index); a two-GPU rollout's rank 1 writes its own beside it,
profile-<compute>-2gpu-<n>-rank1.txt (`kernel_profile.profiled_ranks`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernel_profile import profiled_ranks  # noqa: E402
from bench.rss_sampler import RssSampler  # noqa: E402
from bench.two_gpu_link import LinkMeter  # noqa: E402
from bench.two_gpu_link import describe as describe_link  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.model_families import V2_PRETRAIN  # noqa: E402
from contracts.settings import GenerationSettings, load_settings  # noqa: E402
from contracts.video import Mp4Stream  # noqa: E402
from worldgen.pipelines.camera import load_action  # noqa: E402
from worldgen.pipelines.loader import load_pipeline  # noqa: E402
from worldgen.pipelines.multi_gpu import devices_for_gpus  # noqa: E402
from worldgen.rollout import find_image, mp4_only, read_prompt  # noqa: E402
from worldgen.runtime.metering import peak_rss_gib  # noqa: E402

GiB = 2**30


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def extend_poses(poses: np.ndarray, intrinsics: np.ndarray, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """At least `frames` poses: the path is repeated from its last pose, each step the same relative motion
    (c2w_{i+1} = c2w_i @ inv(c2w_j) @ c2w_{j+1}, j cycling over the recorded path)."""
    poses = [p for p in poses.astype(np.float64)]
    steps = [np.linalg.inv(poses[j]) @ poses[j + 1] for j in range(len(poses) - 1)]
    while len(poses) < frames:
        poses.append(poses[-1] @ steps[(len(poses) - 1) % len(steps)])
    if len(intrinsics) > 1:
        intrinsics = np.concatenate([intrinsics, np.repeat(intrinsics[-1:], frames - len(intrinsics), 0)])
    return np.stack(poses).astype(np.float32), intrinsics


def settings_for(args: argparse.Namespace, frames: int) -> GenerationSettings:
    given = dict(model=args.model, size=args.size, frame_num=frames, seed=args.seed)
    given.update(attention_frames=args.attention_frames, sink_frames=args.sink_frames)
    if args.model == "causal":
        given.update(steps=args.steps, guide_scale=5.0)
    return GenerationSettings.from_dict(given)


def one_rollout(pipe, args, example, frames: int, rss: RssSampler | None = None) -> dict:
    """One `pipe.generate` with every chunk streamed out: its figures (and its latents, under "_latents"); `rss`
    labelled with the chunks as they come out."""
    image, prompt, poses, intrinsics = example
    if len(poses) < frames:
        poses, intrinsics = extend_poses(poses, intrinsics, frames)
    settings = settings_for(args, frames)
    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize(pipe.device)
        torch.cuda.reset_peak_memory_stats(pipe.device)
    resident = torch.cuda.memory_allocated(pipe.device) / GiB if cuda else 0.0
    link = LinkMeter(pipe)  # a two-GPU pipeline's rank 1 and link
    stamps: list[float] = []

    phase = "" if rss is None else rss.label

    def on_chunk(*_) -> None:
        stamps.append(time.perf_counter())
        link.mark()
        if rss is not None:
            rss.label = f"{phase}, after chunk {len(stamps)}"

    start = time.perf_counter()
    out, sunk = None, []
    if args.sink == "mp4":  # the product's way (`worldgen.rollout.generate_episode`): each chunk to the mp4 as it comes
        out = Mp4Stream(Path(tempfile.mkdtemp()) / "rollout.mp4", fps=settings.fps)
    elif args.sink == "count":  # the same, no encoder here: each chunk counted and dropped
        out = SimpleNamespace(append=lambda piece: sunk.append(piece.shape[0]))
    video = pipe.generate(image, prompt, poses, intrinsics, settings, on_chunk=on_chunk, **mp4_only(pipe, out))
    if args.sink == "mp4":
        out.commit()
    whole = time.perf_counter() - start
    gaps = [b - a for a, b in zip([start, *stamps], stamps, strict=False)]  # chunk 0: from the start of the rollout
    dit = [round(t.get("dit", 0.0), 3) for t in pipe.chunk_timings]
    spec = pipe.cache_spec
    return {
        "frames_asked": frames,
        "frames": int(video.shape[0]) or (out.frames if args.sink == "mp4" else sum(sunk)),  # [F, H, W, 3] uint8
        "chunks": len(stamps),
        "first_chunk_s": round(gaps[0], 3),
        "text_s": round(pipe.timings.get("text", 0.0), 3),
        "chunk_s": [round(g, 3) for g in gaps],
        "steady_chunk_s": round(statistics.median(gaps[1:]), 3) if len(gaps) > 1 else None,
        "chunk_dit_s": dit,
        "steady_dit_s": round(statistics.median(dit[1:]), 3) if len(dit) > 1 else None,
        "chunk_decode_s": [round(t.get("decode", 0.0), 3) for t in pipe.chunk_timings],
        "chunk_encode_s": [round(t.get("encode", 0.0), 3) for t in pipe.chunk_timings],
        "whole_s": round(whole, 3),
        "timings": {k: round(v, 3) for k, v in pipe.timings.items()},
        "resident_gib": round(resident, 2),
        "max_allocated_gib": round(torch.cuda.max_memory_allocated(pipe.device) / GiB, 2) if cuda else None,
        "max_reserved_gib": round(torch.cuda.max_memory_reserved(pipe.device) / GiB, 2) if cuda else None,
        # the allocator at its cap: cudaMalloc failed, every cached block freed, tried again (slow)
        "alloc_retries": torch.cuda.memory_stats(pipe.device).get("num_alloc_retries") if cuda else None,
        "peak_rss_gib": round(peak_rss_gib() or 0.0, 2),
        "decode_overlap": bool(pipe.decode_overlapped),
        "chunk_overlap_s": [round(t.get("overlap", 0.0), 3) for t in pipe.chunk_timings],
        "vae": vae_cut(pipe),
        "kv_cache": spec.describe() if spec is not None else None,
        "cache_reason": pipe.cache_reason,
        **link.figures(),
        "_latents": torch.cat(pipe.last_latents, dim=1),
    }


def vae_cut(pipe) -> str:
    """The VAE's dtype and cut for the rollout just made (what the plan chose)."""
    cut = getattr(pipe, "vae_cut", None)
    tiles = "whole frames" if cut is None or cut.tiles == 1 else f"{cut.tiles} tiles"
    parked = f", caches parked in host memory ({cut.host_gib:.2f} GiB)" if cut is not None and cut.parked else ""
    if cut is not None and cut.bf16 and not cut.parked:  # the plan's bf16 cut with every tile's caches on the GPU
        parked = f", caches on the device ({cut.decode_cache_gib:.1f} GiB), none parked"
    return f"{str(pipe.vae_dtype).removeprefix('torch.')}, {tiles}{parked}"


def summary(r: dict) -> str:
    chunks = " ".join(f"{g:.2f}" for g in r["chunk_s"])
    return (
        f"  {r['frames']} frames ({r['chunks']} chunks): first chunk {r['first_chunk_s']:.2f} s (text "
        f"{r['text_s']:.2f}, encode {r['timings'].get('encode', 0.0):.2f}), steady chunk {r['steady_chunk_s']} s (DiT {r['steady_dit_s']}), whole "
        f"{r['whole_s']:.2f} s; allocated {r['max_allocated_gib']} GiB (resident at start {r['resident_gib']}), "
        f"reserved {r['max_reserved_gib']} GiB ({r['alloc_retries']} allocation retries), peak RSS {r['peak_rss_gib']} GiB"
        + (f"; vs the first compute: rel-L2 {r['rel_l2_vs_first']:.4f}" if "rel_l2_vs_first" in r else "")
        + (f"; vs one GPU: rel-L2 {r['rel_l2_vs_one_gpu']:.2e}" if "rel_l2_vs_one_gpu" in r else "")
        + (f"\n    {describe_link(r)}" if "devices" in r else "")
        + f"\n    chunks: {chunks}\n    DiT: {r['chunk_dit_s']}\n    decode: {r['chunk_decode_s']}"
        f"\n    decode overlap: {'ran' if r['decode_overlap'] else 'off'} (hidden {r['chunk_overlap_s']}); VAE {r['vae']}"
        f"\n    KV cache: {r['kv_cache']} -- {r['cache_reason']}"
    )


def run_compute(
    args, compute: str, example, frames_list, reference: dict, report: dict, devices=None, one_gpu=None
) -> None:
    """Load a pipeline in `compute` (split over `devices`, two), run every rollout, compare with `reference`
    (index -> latents) or fill it; a two-GPU rollout also with `one_gpu` (index -> the one-GPU latents)."""
    entry = {"compute": compute, "devices": devices, "rollouts": []}
    report["computes"].append(entry)
    rss = RssSampler().start()  # what the peak RSS held, and when (the load or a rollout)
    rss.label = "the load"
    start = time.perf_counter()
    pipe = load_pipeline(
        args.ckpt,
        device=None if devices else args.device,
        devices=devices,
        vram_budget_gb=args.vram_budget,
        model=args.model,
        compute=compute,
        assets_dir=args.assets_dir,
        ahead_settings=settings_for(args, frames_list[0]),
        first_use_ahead=args.first_use_ahead,
    )
    pipe.overlap_decode = args.decode_overlap == "on"
    entry["load_s"] = round(time.perf_counter() - start, 2)
    entry["engine"] = {k: v for k, v in pipe.engine.items() if isinstance(v, (str, int, float, bool, type(None)))}
    entry["name"] = pipe.name
    print(f"[{compute}] {pipe.name}: loaded in {entry['load_s']} s ({entry['engine']})", flush=True)
    for i, frames in enumerate(frames_list):
        rss.label = f"rollout {i + 1}"
        region = contextlib.nullcontext()
        if args.profile and i == 1:  # the second rollout: warm
            args.profile.mkdir(parents=True, exist_ok=True)
            tag = f"{compute}{'-2gpu' if devices else ''}"
            title = f"{compute} rollout {i}, {frames} frames{' on ' + ','.join(devices) if devices else ''}"
            region = profiled_ranks(pipe, args.profile / f"profile-{tag}-{i}.txt", title)
        try:
            with region:
                r = one_rollout(pipe, args, example, frames, rss)
        except Exception as exc:  # noqa: BLE001  (report it, go on with the next compute)
            entry["rollouts"].append({"frames_asked": frames, "error": traceback.format_exc()[-3000:]})
            print(f"[{compute}] {frames} frames FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            atomic.write_json(args.json, report, indent=1) if args.json else None
            break
        latents = r.pop("_latents")
        if devices:  # against the one-GPU rollout of this compute (same seed), not the first compute's
            if i in one_gpu and one_gpu[i].shape == latents.shape:
                r["rel_l2_vs_one_gpu"] = round(rel_l2(latents, one_gpu[i]), 6)
        else:
            if one_gpu is not None:
                one_gpu[i] = latents
            if i in reference and reference[i].shape == latents.shape:
                # relative to exact's latents, whichever compute ran first
                ref, new = (latents, reference[i]) if compute == "exact" else (reference[i], latents)
                r["rel_l2_vs_first"] = round(rel_l2(new, ref), 5)
                r["rel_l2_last_chunk"] = round(rel_l2(new[:, -4:], ref[:, -4:]), 5)
            else:
                reference.setdefault(i, latents)
        if i == 0:
            entry["plan"] = pipe.describe_plan()
            print(entry["plan"], flush=True)
        entry["rollouts"].append(r)
        print(f"[{compute}] rollout {i + 1}:\n{summary(r)}", flush=True)
        if args.json:
            atomic.write_json(args.json, report, indent=1)
    rss.stop()
    entry["rss_peak"] = rss.figures()
    print(f"[{compute}] {rss.describe()}", flush=True)
    if torch.cuda.is_available():  # PyTorch's pinned host blocks: in use and cached (part of the RSS's shared share)
        host = torch.cuda.memory.host_memory_stats()
        entry["pinned_host"] = {
            k: v for k, v in host.items() if k.startswith(("allocated_bytes", "active_bytes", "num_host"))
        }
        print(f"[{compute}] pinned host blocks: {entry['pinned_host']}", flush=True)
    if pipe.scale_out is not None:  # one two-device pipeline a process: rank 1 and the group go now
        pipe.scale_out.close()
    del pipe
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument(
        "--example", "--action-path", type=Path, required=True, help="image, prompt.txt, poses.npy, intrinsics.npy"
    )
    parser.add_argument("--model", choices=("fast", "causal"), default="fast")
    parser.add_argument("--compute", default="exact,fp8")
    parser.add_argument("--frames", default="81,81,361", help="one rollout each")
    long = load_settings(preset="v2-fast-long")  # the reference's long-video setting: its size, window and sink
    parser.add_argument("--size", default=long.size)
    parser.add_argument("--attention-frames", type=int, default=long.attention_frames)
    parser.add_argument("--sink-frames", type=int, default=long.sink_frames)
    parser.add_argument("--seed", type=int, default=long.seed)
    parser.add_argument(
        "--steps", type=int, default=V2_PRETRAIN.guidance_steps, help="--model causal: guided steps a chunk"
    )
    parser.add_argument("--vram-budget", type=float, default=None, help="GiB (default: no budget)")
    parser.add_argument("--assets-dir", type=Path, default=None)
    parser.add_argument("--first-use-ahead", action="store_true", help="load as a server does (see above)")
    parser.add_argument("--decode-overlap", choices=("on", "off"), default="on", help="where the plan has room")
    parser.add_argument(
        "--sink",
        choices=("none", "mp4", "count"),
        default="none",
        help="each chunk to an mp4 as it comes, held nowhere (the product's rollouts), or counted and dropped "
        "(no encoder here); none: the video held, as before",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpus", metavar="I,J", default=None, help="each compute on GPU I, then split over I and J")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR", help="profile each compute's 2nd rollout")
    parser.add_argument("--int8-gemm", choices=("int_mm", "triton"), default=None, help="int8.GEMM (issue 56)")
    args = parser.parse_args()
    if args.int8_gemm:  # --compute int8's GEMM: cuBLASLt + the Triton epilogue, or the whole GEMM in Triton
        from worldgen.kernels import int8

        int8.GEMM = args.int8_gemm
    poses, intrinsics = load_action(args.example)
    example = (find_image(args.example), read_prompt(args.example), poses, intrinsics)
    frames_list = [int(f) for f in args.frames.split(",")]
    report = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "poses": len(poses),
        "computes": [],
    }
    print(f"torch {torch.__version__} on {report['device']}; {len(poses)} poses in {args.example}", flush=True)
    reference: dict[int, torch.Tensor] = {}
    devices = devices_for_gpus(args.gpus)
    if devices:
        args.device = devices[0]
    for compute in args.compute.split(","):
        try:
            one_gpu: dict[int, torch.Tensor] | None = {} if devices else None
            run_compute(args, compute, example, frames_list, reference, report, one_gpu=one_gpu)
            if devices:
                run_compute(args, compute, example, frames_list, reference, report, devices, one_gpu)
        except Exception as exc:  # noqa: BLE001  (a failed load: report it, try the next compute)
            report["computes"].append({"compute": compute, "error": traceback.format_exc()[-3000:]})
            print(f"[{compute}] FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            gc.collect()
            torch.cuda.empty_cache()
        if args.json:
            atomic.write_json(args.json, report, indent=1)


if __name__ == "__main__":
    main()
