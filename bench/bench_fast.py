"""LingBot-World-Fast on one GPU: golden parity in bf16, then whole rollouts under a VRAM budget.

Usage:
  python bench/bench_fast.py --ckpt /tmp/fast-synth --build-synthetic --action-path EXAMPLE_DIR \\
      --vram-budget 24 --size 480*832 --frames 81,81,161 [--golden GOLDEN_FAST_DIR] [--json OUT.json]

--build-synthetic writes a full-size synthetic checkpoint first (bench/synthetic_checkpoint.py: the
Fast DiT in NF4 with real shapes and key names, umT5-XXL, Wan2.1 VAE; random weights) unless CKPT
already holds one. --golden runs every golden/fast case on this device in bf16 and prints its
relative L2 error against the CPU float32 reference. Each --frames entry is one whole rollout
(text, encode, the chunk loop with each chunk decoded as soon as it is made) in one pipeline, so
a repeated entry shows the warm (models resident) figures. Per rollout it prints: the plan's KV
cache, seconds to the first decoded chunk and to the whole video, the DiT loop's seconds (forwards
only) and the decode's, peak VRAM (allocated and reserved) and peak RSS; per chunk: DiT, encode, decode,
overlap and seconds against 0.75 s (12 frames of real time at 16 fps); which forwards replayed a CUDA
graph. --compute exact,fp8 runs the list once per compute and prints each chunk's latent distance from
the first compute's (same seed). Targets (issue 21) at 480x832, 81 frames, 24 GiB: exact DiT loop <= 10 s,
whole <= 16 s; fp8 <= 1.0 s per chunk over chunks 1..6, whole <= 10 s, first chunk <= 2 s. --gpus 0,1: the
rollouts split over two GPUs (issue 55), each rollout's JSON with the link's MB a chunk and rank 1's peak, retries
and milliseconds a forward (`bench.two_gpu_link`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fast_args import fast_parser  # noqa: E402
from bench.host_bound import blocks_timed  # noqa: E402
from bench.kernel_profile import profiled_ranks  # noqa: E402
from bench.two_gpu_link import LinkMeter  # noqa: E402
from bench.two_gpu_link import describe as describe_link  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.errors import InputError  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.chunk_files import chunk_reporter  # noqa: E402
from worldgen.kernels.attention import resolve_backend  # noqa: E402
from worldgen.models.chunk_graph import enabled_by_environment  # noqa: E402
from worldgen.models.kv_cache import CacheSpec, KVCache  # noqa: E402
from worldgen.models.vae_tiling import StreamingDecoder  # noqa: E402
from worldgen.pipelines import decode_overlap  # noqa: E402
from worldgen.pipelines.camera import load_action  # noqa: E402
from worldgen.pipelines.fast import FastPipeline  # noqa: E402
from worldgen.pipelines.fast_plan import FastOptions  # noqa: E402
from worldgen.pipelines.loader import load_pipeline  # noqa: E402
from worldgen.pipelines.multi_gpu import devices_for_gpus  # noqa: E402
from worldgen.rollout import find_image, read_prompt  # noqa: E402
from worldgen.runtime.checkpoint import FAST_DIR, FAST_NF4_DIR, load_expert  # noqa: E402
from worldgen.runtime.cuda_memory import free_device_memory  # noqa: E402
from worldgen.runtime.metering import peak_rss_gib  # noqa: E402
from worldgen.runtime.residency import ModelSlot  # noqa: E402

GiB = 2**30
# issue 21, warm pipeline, 81 frames at 480x832 under --vram-budget 24 (per_chunk: chunks 1..6, seconds each)
HOST_FORWARD = 18  # the one an 'h' entry times: chunk 3's third step, the KV window full at 24 GiB
TARGETS = {"exact": {"dit": 10.0, "total": 16.0}, "fp8": {"per_chunk": 1.0, "total": 10.0, "first_chunk": 2.0}}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return ((a - b).norm() / b.norm()).item()


def golden_parity(
    root: Path, device: torch.device, dtype: torch.dtype, attention: str = "sdpa", compute: str = "exact"
) -> dict[str, float]:
    """Every golden/fast case with the DiT in `dtype` on `device` -> relative L2 errors."""
    dit = load_expert(root / "lingbot-world-base-cam" / FAST_DIR, device, dtype)
    dit.set_attention_backend(attention)
    dit.set_compute(compute)
    io = {k: v.to(device) for k, v in load_file(root / "dit_chunks" / "io.safetensors").items()}
    errors = {}

    def call(cache, c, x="x", t=None):
        f = slice(3 * c, 3 * c + 3)
        t = io["t_a"] if t is None else t
        out = dit(io[x][:, f][None], t, [io["context"]], io["y"][:, f][None], io["cam"][:, :, f], cache, 30 * c)
        return out[0]

    def cache(spec):
        return KVCache(spec, dit.cfg.num_layers, dit.cfg.num_heads, dit.cfg.head_dim, dtype, device)

    def stacked(c, which):
        return torch.stack([getattr(layer, which)[0] for layer in c.layers])

    c = cache(CacheSpec(60, 10))
    errors["a_out_chunk0"] = rel(call(c, 0), io["a_out_chunk0"])
    errors["a_out_chunk1"] = rel(call(c, 1, t=io["t_b"]), io["a_out_chunk1"])
    errors["a_cache_k_final"] = rel(stacked(c, "k"), io["a_cache_k_final"])
    errors["a_cache_v_final"] = rel(stacked(c, "v"), io["a_cache_v_final"])
    c = cache(CacheSpec(60, 10, max_attention_tokens=40))
    call(c, 0)
    errors["a_out_chunk1_window"] = rel(call(c, 1, t=io["t_b"]), io["a_out_chunk1_window"])
    c = cache(CacheSpec(60, 10, rolling=True, sink_frames=1))
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    for k in range(3):
        errors[f"d_out_chunk{k}_noisy"] = rel(call(c, k), io[f"d_out_chunk{k}_noisy"])
        errors[f"d_out_chunk{k}_t0"] = rel(call(c, k, "x_clean", zero), io[f"d_out_chunk{k}_t0"])
    errors["d_cache_k_final"] = rel(stacked(c, "k"), io["d_cache_k_final"])
    errors["d_cache_v_final"] = rel(stacked(c, "v"), io["d_cache_v_final"])

    loop = load_file(root / "loop" / "io.safetensors")
    pipe = FastPipeline(
        dit=ModelSlot("fast", lambda: dit), dit_config=dit.cfg, dtype=dtype, tokenizer=None, text_encoder=None,
        vae=None, device=device, text_len=dit.cfg.text_len, name="golden",
    )  # fmt: skip
    for name, options, key in (
        ("loop_latent_final", FastOptions(), "latent_final"),
        ("loop_window_latent_final", FastOptions(max_attention_tokens=40, sink_frames=1), "window_latent_final"),
    ):
        chunks = pipe.rollout_chunks(
            loop["noise"], loop["y"], loop["context"], loop["plucker"], options, renoise_draws=loop["renoise"]
        )
        errors[name] = rel(torch.cat([x.cpu() for x in chunks], dim=1), loop[key])
    return errors


def ensure_synthetic(ckpt: Path) -> None:
    if (ckpt / FAST_NF4_DIR / "model.safetensors").exists():
        return
    start = time.perf_counter()
    script = Path(__file__).with_name("synthetic_checkpoint.py")
    subprocess.run(
        [sys.executable, str(script), str(ckpt), "--layout", "nf4", "--experts", "none", "--fast"], check=True
    )
    print(f"synthetic Fast checkpoint built in {time.perf_counter() - start:.0f} s", flush=True)


@torch.no_grad()
def vae_check(pipe: FastPipeline, latents: list[torch.Tensor]) -> dict:
    """The last rollout's chunk latents decoded chunk by chunk by a float32 VAE and by a bf16 one (what
    `--compute fp8` decodes with): GPU seconds of each, and the bf16 video's distance from float32's."""
    keep, videos, seconds = pipe.vae_dtype, {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        pipe.vae.unload()
        pipe.vae_dtype = dtype
        decoder = StreamingDecoder(pipe.vae.get(), pipe.decode_tile_pixels)
        device = next(decoder.vae.parameters()).device
        decoder.push(latents[0][None].to(device))  # the first push allocates; time a fresh decoder after it
        decoder = StreamingDecoder(decoder.vae, pipe.decode_tile_pixels)
        sync(device)
        start = time.perf_counter()
        pieces = [decoder.push(latent[None].to(device))[0] for latent in latents]
        sync(device)
        seconds[str(dtype).removeprefix("torch.")] = round(time.perf_counter() - start, 3)
        videos[dtype] = torch.cat(pieces, dim=1).float().cpu()
        del decoder, pieces
    pipe.vae.unload()
    pipe.vae_dtype = keep
    exact, half = videos[torch.float32], videos[torch.bfloat16]
    mse = float((exact - half).pow(2).mean())
    return {
        "decode_seconds": seconds,
        "chunks": len(latents),
        "rel_l2_bf16_vs_float32": rel(half, exact),
        "psnr_db_bf16_vs_float32": round(10 * np.log10(4.0 / max(mse, 1e-20)), 2),  # video in [-1, 1]: peak 2
        "max_abs_diff": float((exact - half).abs().max()),
    }


def compiled_graphs() -> int | None:
    """How many graphs dynamo has compiled in this process so far (None where this PyTorch does not say)."""
    if "torch._dynamo" not in sys.modules:  # not even imported: none (and no import for the asking)
        return 0
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])


def triton_variants() -> int:
    """Variants of the hand-written Triton kernels compiled (or loaded from the disk cache) in this process."""
    from worldgen.kernels import fp8, fused_triton, nf4

    names = [(m, n) for m in (fused_triton, fp8, nf4) for n in dir(m) if n.startswith("_") and n.endswith("_kernel")]
    return sum(len(c[0]) for m, n in names for c in getattr(getattr(m, n), "device_caches", {}).values())


def dynamo_compile_times() -> str:
    """Dynamo's and Inductor's seconds per compiled function and phase, so far in this process (a table)."""
    try:
        from torch._dynamo.utils import compile_times

        return compile_times(repr="str", aggregate=True)
    except Exception as exc:  # noqa: BLE001  (a private API: say so instead of failing the bench)
        return f"compile times not available ({exc})"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rollout(
    pipe: FastPipeline, args, image, prompt, poses, intrinsics, frames: int, context=None, stream: bool = True
) -> dict:
    settings = GenerationSettings(size=args.size, frame_num=frames, seed=42, attention_frames=args.attention_frames)
    if pipe.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(pipe.device)
        retries_before = torch.cuda.memory_stats(pipe.device).get("num_alloc_retries", 0)
    first_records = len(pipe.meter.records)
    chunks = []
    link = LinkMeter(pipe)  # two GPUs: the link's bytes and rank 1's peak
    start = time.perf_counter()
    trace = []  # (phase, step, seconds, allocated GiB): where the memory goes, at each progress event

    def progress(phase: str, done: int, total: int) -> None:
        if pipe.device.type == "cuda" and (phase != "denoise" or done <= 6):
            trace.append((phase, done, round(time.perf_counter() - start, 2),
                          round(torch.cuda.memory_allocated(pipe.device) / GiB, 2)))  # fmt: skip

    written = []  # with --chunk-files: (index, the chunk's mp4), as the worker reports them to its client
    files = args.chunk_files / f"rollout-{frames}.mp4" if args.chunk_files and stream else None
    if files is not None:
        files.parent.mkdir(parents=True, exist_ok=True)
    as_fast = dataclasses.replace(settings, model="fast")  # the worker's settings of a Fast job
    with (
        chunk_reporter(as_fast, files, progress, lambda i, n, path, f, still: written.append((i, path)))
        if files
        else (contextlib.nullcontext()) as write_chunk
    ):

        def on_chunk(i: int, n: int, f: torch.Tensor) -> None:
            chunks.append((i, n, time.perf_counter() - start, tuple(f.shape)))
            link.mark()
            if write_chunk is not None:
                write_chunk(i, n, f)

        video = pipe.generate(
            image, prompt, poses, intrinsics, settings, context=context, progress=progress, on_chunk=on_chunk,
            stream=stream,
        )  # fmt: skip
    wall = time.perf_counter() - start
    records = pipe.meter.records[first_records:]
    result = {
        "frames_asked": frames,
        "prompt": "cached (umT5 skipped, as on a prompt-cache hit)" if context is not None else "new (umT5 runs)",
        "frames": int(video.shape[1]),
        "size": f"{video.shape[2]}x{video.shape[3]}",
        "kv_cache": pipe.cache_spec.describe() if pipe.cache_spec else None,
        "kv_cache_why": pipe.cache_reason,
        "seconds": {k: round(v, 2) for k, v in pipe.timings.items()},
        "wall_seconds": round(wall, 2),
        "first_chunk_callback_seconds": round(chunks[0][2], 2),
        "chunks": len(chunks),
        "chunk_files_written": len(written) if files else None,
        # the loop's forwards: 4 steps a chunk and a cache refresh between chunks
        "dit_seconds_per_forward": round(pipe.timings["dit"] / (5 * len(chunks) - 1), 3),
        "peak_rss_gib": round(max((r.peak_rss_gib or 0) for r in records), 2),
        # frame by frame: torch.isfinite of a float tensor makes a float copy (0.7 GiB at 161 frames: it was
        # this process's peak RSS, not the rollout's)
        "finite": all(bool(torch.isfinite(video[:, i]).all()) for i in range(video.shape[1])),
        # the video's bytes, to tell whether two rollouts (streamed and batch) made the same one
        "video_sha1": hashlib.sha1(video.contiguous().numpy()).hexdigest(),
        # the chunks' final latents' bytes: whether a difference between two videos comes from the DiT
        "latent_sha1": hashlib.sha1(torch.cat(pipe.last_latents, dim=1).contiguous().numpy()).hexdigest(),
        "memory_trace": trace,
        "loads": {name: round(slot.load_seconds, 2) for name, slot in (("dit", pipe.dit), ("vae", pipe.vae))},
    }
    graphs = pipe.chunk_graphs
    result["chunk_graphs"] = {
        "allowed": bool(graphs and graphs.allowed),
        "captures": graphs.captures if graphs else 0,
        "decisions": graphs.decisions if graphs else [],
    }
    blocks = pipe.block_graphs
    result["block_graphs"] = {
        "allowed": bool(blocks and blocks.allowed),
        "captures": blocks.captures if blocks else 0,
        "decisions": blocks.decisions if blocks else [],
        "reserved_gib": round(blocks.reserved_bytes / 2**30, 3) if blocks else 0.0,
    }
    result["per_chunk"] = [{k: round(v, 3) for k, v in t.items()} for t in pipe.chunk_timings]
    result["graphs_compiled_in_process"] = compiled_graphs()
    result["compute"] = pipe.compute
    result.update(link.figures())
    if pipe.device.type == "cuda":
        result["peak_vram_allocated_gib"] = round(torch.cuda.max_memory_allocated(pipe.device) / GiB, 2)
        # allocations that failed at the cap and were retried after freeing the allocator's cached blocks
        # (each a device synchronisation; near the cap, kernels may also choose smaller workspaces)
        result["alloc_retries"] = torch.cuda.memory_stats(pipe.device).get("num_alloc_retries", 0) - retries_before
        result["peak_vram_reserved_gib"] = round(torch.cuda.max_memory_reserved(pipe.device) / GiB, 2)
    return result


@dataclasses.dataclass(frozen=True)
class Entry:
    """One --frames entry: a rollout's length and how it runs."""

    frames: int
    cached: bool  # the prompt's embedding from the run before
    graphs: bool  # chunk forwards captured as CUDA graphs
    overlap: bool  # chunk decodes on a second stream
    profile: bool
    eager: bool = False  # 'eager': graphs asked for, then taken away (the --graph-check rollout)
    serial: bool = False
    host: bool = False  # one steady forward's blocks timed on the host and the GPU (bench.host_bound)
    batch: bool = False  # no client takes the chunks as they come (the worker's job without want_chunks)
    blocks_eager: bool = False  # 'x': no block graphs (worldgen.models.block_graphs), every block eager


def parse_entry(text: str) -> Entry:
    """'81', '81c', '81go', '81cgop', '81eager', '81serial', '81h', '81b', '81x' (see --frames)."""
    match = re.fullmatch(r"(\d+)(c?)(g?)(o?)(eager|serial)?(p?)(h?)(b?)(x?)", text)
    if match is None:
        raise SystemExit(
            f"--frames entry {text!r}: a frame count with optional letters c, g, o, eager|serial, p, h, b, x"
        )
    count, cached, graphs, overlap, less, profile, host, batch, blocks_eager = match.groups()
    if less:  # the old spellings: both asked for, less one
        graphs_on, overlap_on = less != "eager", less != "serial"
    elif graphs or overlap:
        graphs_on, overlap_on = bool(graphs), bool(overlap)
    else:  # the product's default
        # the product's defaults: graphs as LINGBOT_ISAAC_CHUNK_GRAPHS says, the overlap as LINGBOT_ISAAC_DECODE_OVERLAP
        graphs_on, overlap_on = enabled_by_environment(), decode_overlap.enabled_by_environment()
    return Entry(
        int(count), bool(cached), graphs_on, overlap_on, bool(profile), less == "eager", less == "serial", bool(host),
        bool(batch), bool(blocks_eager),
    )  # fmt: skip


def main() -> None:
    parser = fast_parser(__doc__)
    args = parser.parse_args()
    if args.frames and args.action_path is None:
        parser.error("--action-path is needed for the rollouts of --frames (--frames '' runs the golden parity alone)")
    from worldgen.kernels import fused as fused_kernels

    fused_kernels.KERNELS = args.fused_kernels = args.fused_kernels or fused_kernels.KERNELS
    if args.compile_ahead != "load":
        from worldgen.pipelines import fast_warm_up

        fast_warm_up.COMPILE_AHEAD = False
    if args.compile_options is not None:
        import torch._inductor.config as inductor_config

        from worldgen.kernels import fused

        unknown = sorted(set(args.compile_options) - set(inductor_config.get_config_copy()))
        if unknown:
            parser.error(f"--compile-options: this PyTorch's Inductor has no setting {', '.join(unknown)}")
        fused.COMPILE_OPTIONS.clear()
        fused.COMPILE_OPTIONS.update(args.compile_options)
    if args.sdpa_first:
        from worldgen.kernels import attention

        attention.SDPA_FIRST = args.sdpa_first
    try:  # two GPUs: rank 0 on the first (the figures' device), rank 1 beside it
        devices = devices_for_gpus(args.gpus)
    except InputError as exc:
        parser.error(str(exc))
    device = torch.device(devices[0] if devices else args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    results["fused_kernels"] = args.fused_kernels

    def save() -> None:
        if args.json:
            atomic.write_json(args.json, results, indent=1)

    if args.golden:
        try:
            errors = golden_parity(args.golden, device, dtype, resolve_backend(args.attention))
        except Exception:  # report and go on to the rollouts: one run of the device is precious
            traceback.print_exc()
            errors = {}
        results["golden_parity"] = {"dtype": str(dtype), "rel_l2": errors}
        for name, err in errors.items():
            print(f"golden {name:<28} rel L2 {err:.2e} ({dtype})", flush=True)
        if "fp8" in args.compute.split(",") and device.type == "cuda":
            # the golden chunks have 30 tokens, under the FP8 path's MIN_ROWS: lowered for this run only,
            # so the tiny model's Linears and self-attention really take the FP8 kernels
            from worldgen.kernels import fp8

            rows, fp8.MIN_ROWS = fp8.MIN_ROWS, 1
            try:
                errors = golden_parity(args.golden, device, dtype, resolve_backend(args.attention), "fp8")
            except Exception:
                traceback.print_exc()
                errors = {}
            finally:
                fp8.MIN_ROWS = rows
            results["golden_parity_fp8"] = {"dtype": str(dtype), "min_rows": 1, "rel_l2": errors}
            for name, err in errors.items():
                print(f"golden fp8 {name:<24} rel L2 {err:.2e} (fp8, MIN_ROWS 1)", flush=True)
        save()
        free_device_memory(device)
    if not args.frames:  # --frames "": the golden parity alone
        return
    if args.build_synthetic:
        ensure_synthetic(Path(args.ckpt))
    poses, intrinsics = load_action(args.action_path)
    image, prompt = find_image(args.action_path), read_prompt(args.action_path)
    start = time.perf_counter()
    # no prompt cache: every rollout pays for umT5, as a new prompt would
    pipe = load_pipeline(
        args.ckpt,
        device=None if devices else device,
        devices=devices,
        vram_budget_gb=args.vram_budget,
        model="fast",
        use_text_cache=False,
        attention=args.attention,
        compute=args.compute.split(",")[0],  # what the load compiles ahead for
        first_use_ahead=args.first_use == "load",
    )
    results["attention"] = pipe.engine.get("attention")
    results["pipeline_seconds"] = round(time.perf_counter() - start, 2)
    results["compile_ahead_seconds"] = pipe.engine.get("compile_ahead_s")
    results["first_use_ahead_seconds"] = pipe.engine.get("first_use_ahead_s")
    if args.compile_ahead == "job":
        from PIL import Image

        first = int(re.match(r"\d+", args.frames).group())
        with Image.open(image) as img:
            size = (img.height, img.width)
        job = GenerationSettings(model="fast", size=args.size, frame_num=first)
        results["compile_ahead_seconds"] = round(pipe.compile_ahead(job, size), 2)
    print(f"pipeline loaded in {results['pipeline_seconds']} s (compile ahead, {args.compile_ahead}: "
          f"{results['compile_ahead_seconds']} s; text and VAE ahead, {args.first_use}: "
          f"{results['first_use_ahead_seconds']} s; graphs compiled so far: {compiled_graphs()}; Triton variants: "
          f"{triton_variants()})", flush=True)  # fmt: skip
    from worldgen.kernels.cudnn_attention import attention_note

    # which attention kernels the rollouts run: a figure means little without it (session 21's fp8 rollouts
    # ran without the cuDNN frontend, so with bf16 attention, and nothing said so)
    results["attention_note"] = attention_note(device) if "fp8" in args.compute else None
    print(f"attention: --attention {args.attention} -> {results['attention']}"
          + (f"; {results['attention_note']}" if results["attention_note"] else ""), flush=True)  # fmt: skip
    plans = []
    pipe.on_plan = plans.append
    results["rollouts"] = []
    results["chunk_distance"] = {}
    computes = args.compute.split(",")
    if args.warm_up:
        pipe.residency.use("fast").set_compute(computes[0])
        pipe.compute = computes[0]
        first = int(re.match(r"\d+", args.frames).group())
        shape = find_image(args.action_path)
        from PIL import Image

        with Image.open(shape) as img:
            size = (img.height, img.width)
        results["warm_up_seconds"] = round(
            pipe.warm_up(GenerationSettings(model="fast", size=args.size, frame_num=first), size), 2
        )
        print(f"warm-up ({computes[0]}, {first} frames, image {size[0]}x{size[1]}): {results['warm_up_seconds']} s",
              flush=True)  # fmt: skip
    context = None
    latents: dict[str, list[torch.Tensor]] = {}  # compute -> the last 81-frame rollout's chunks
    videos: dict[tuple[str, int, bool], str] = {}  # (compute, frames, batch) -> the last such rollout's video_sha1
    sticky_off = False  # set when a rollout failed: graphs and overlap off from then on
    listed = [parse_entry(text) for text in args.frames.split(",")]
    entries = [(compute, entry) for compute in computes for entry in listed]
    if args.graph_check:  # the first entry again, every forward eager
        entries.insert(
            len(listed), (computes[0], dataclasses.replace(listed[0], graphs=False, eager=True, profile=False))
        )
    for compute, entry in entries:
        if compute != pipe.compute:
            pipe.set_compute(compute)  # the DiT's compute, and the VAE's dtype with it
        if args.vae_dtype != "auto" and str(pipe.vae_dtype) != f"torch.{args.vae_dtype}":
            pipe.vae.unload()  # reloads in the dtype asked for
            pipe.vae_dtype = getattr(torch, args.vae_dtype)
        profiling, eager, serial, frames, cached = entry.profile, entry.eager, entry.serial, entry.frames, entry.cached
        pipe.use_chunk_graphs = entry.graphs and not sticky_off
        pipe.overlap_decode = entry.overlap and not sticky_off
        pipe.use_block_graphs = not entry.blocks_eager and not sticky_off
        if cached and context is None:
            (context,) = pipe.encode_text([prompt])
        region = contextlib.nullcontext()
        if profiling and args.profile_dir:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            n = len(results["rollouts"])
            region = profiled_ranks(
                pipe, args.profile_dir / f"profile-{compute}-{n}.txt", f"{compute} rollout {n}, {frames} frames"
            )
        timed = blocks_timed(HOST_FORWARD) if entry.host else contextlib.nullcontext()
        try:
            with region, timed as host_times:
                result = rollout(
                    pipe, args, image, prompt, poses, intrinsics, frames, context if cached else None, not entry.batch
                )
        except Exception as exc:
            traceback.print_exc()
            results["rollouts"].append({"frames_asked": frames, "compute": compute, "error": repr(exc)[:2000]})
            if pipe.overlap_decode or pipe.use_chunk_graphs or pipe.block_graph_room:  # one device run is precious
                print("  the remaining rollouts run without CUDA graphs and without the decode overlap", flush=True)
                sticky_off = True
            save()
            free_device_memory(device)
            continue
        result["eager_only"] = eager
        if host_times is not None:
            result["host_bound"] = host_times.as_dict()
            print(f"  {host_times.summary()}", flush=True)
        if len(results["rollouts"]) == 0:  # where a fresh process's first rollout spends its compile time
            result["dynamo_compile_times"] = dynamo_compile_times()
            print(result["dynamo_compile_times"], flush=True)
        result["chunk_graphs_asked"], result["vae_dtype"] = entry.graphs, str(pipe.vae_dtype).removeprefix("torch.")
        result["chunk_graphs_allowed"] = bool(pipe.use_chunk_graphs and pipe.graph_room)  # the plan's say
        result["decode_overlap"] = bool(pipe.overlap_decode and pipe.graph_room and device.type == "cuda")
        result["batch"], result["decoded_after_loop"] = entry.batch, pipe.decode_after_loop
        if frames == 81 and not eager:
            latents[compute] = list(pipe.last_latents)
        videos[(compute, frames, entry.batch)] = result["video_sha1"]
        other = videos.get((compute, frames, not entry.batch))
        if other is not None:  # a batch job's plan must not change the video
            result["same_video_as_" + ("streamed" if entry.batch else "batch")] = same = other == result["video_sha1"]
            print(f"  the batch and the streamed rollout's videos: {'the same bytes' if same else 'DIFFERENT'}",
                  flush=True)  # fmt: skip
        if frames == 81 and (eager or compute != computes[0]) and computes[0] in latents:
            name = f"{compute}{' eager' if eager else ''} vs {computes[0]}{' graphed' if eager else ''}"
            dist = [rel(a, b) for a, b in zip(pipe.last_latents, latents[computes[0]], strict=True)]
            results["chunk_distance"][name] = dist
            print(f"per-chunk rel-L2 of the latent, {name} (same seed): " + ", ".join(f"{d:.3e}" for d in dist),
                  flush=True)  # fmt: skip
        graphs = result["chunk_graphs"]
        calls = " ".join(d[0] for d in graphs["decisions"])
        if graphs["allowed"]:
            print(
                f"  chunk graphs: {graphs['captures']} captures; calls {calls} (e eager, c capture, r replay)",
                flush=True,
            )
        else:  # every forward ran eagerly: the letters are what the graphs would have done
            print(f"  chunk graphs off (every forward eager); with them the calls would be {calls}", flush=True)
        blocks = result["block_graphs"]
        calls = " ".join(d[0] for d in blocks["decisions"])
        if blocks["allowed"]:
            print(f"  block graphs: {blocks['captures']} captures, {blocks['reserved_gib']} GiB reserved; calls {calls}",
                  flush=True)  # fmt: skip
        else:
            print("  block graphs off (the plan's say, or x): every block eager", flush=True)
        print("  chunk  DiT s  encode s  decode s  overlap s  s/chunk  vs 0.75 s (16 fps)", flush=True)
        for i, t in enumerate(result["per_chunk"]):
            print(f"  {i:>5}  {t['dit']:5.2f}  {t['encode']:8.2f}  {t['decode']:8.2f}  {t['overlap']:9.2f}  "
                  f"{t['wall']:7.2f}  {t['wall'] / 0.75:.2f}x real time", flush=True)  # fmt: skip
        result["plan"] = plans[-1] if plans else pipe.describe_plan()
        result["notes_after_the_job"] = list(pipe.plan.notes)  # a decode fallback is noted during the job
        print(f"  memory trace (phase, step, s, GiB allocated): {result['memory_trace']}", flush=True)
        for note in pipe.plan.notes:
            print(f"  note after the job: {note}", flush=True)
        results["rollouts"].append(result)
        save()
        print(result["plan"], flush=True)
        s = result["seconds"]
        print(
            f"rollout {frames} frames, {compute}, VAE {result['vae_dtype']}{', graphs' if entry.graphs and pipe.graph_room else ''}{', overlap' if result['decode_overlap'] else ''}{' (eager)' if eager else ''}{' (serial decode)' if serial else ''}{', batch: chunks decoded after the loop' if pipe.decode_after_loop else ''} ({result['prompt']}) -> {result['frames']} at {result['size']}: first chunk {s['first_chunk']:.2f} s, "
            f"whole video {s['total']:.2f} s (text {s['text']:.2f}, encode {s['encode']:.2f}, DiT loop {s['dit']:.2f}, "
            f"decode {s['decode']:.2f}; {result['dit_seconds_per_forward']:.3f} s per DiT forward); peak VRAM {result.get('peak_vram_reserved_gib', '-')} GiB reserved "
            f"({result.get('peak_vram_allocated_gib', '-')} allocated), peak RSS {result['peak_rss_gib']} GiB; "
            f"DiT load {result['loads']['dit']:.1f} s (cumulative)",
            flush=True,
        )
        print(f"  allocation retries at the cap: {result.get('alloc_retries')}", flush=True)
        if "devices" in result:
            print(f"  {describe_link(result)}", flush=True)
        print(f"  graphs compiled in this process so far: {result['graphs_compiled_in_process']}; Triton variants of "
              f"the hand-written kernels: {triton_variants()}", flush=True)  # fmt: skip
        later = [t["wall"] for t in result["per_chunk"][1:]]
        result["seconds_per_chunk_1_on"] = round(sum(later) / len(later), 3) if later else None
        figures = {**s, "per_chunk": result["seconds_per_chunk_1_on"]}
        if pipe.decode_after_loop:  # a batch job's chunks come at the end: only its whole-video figures count
            figures = {k: v for k, v in figures.items() if k not in ("per_chunk", "first_chunk")}
        if result["frames"] <= 81 and not eager:
            for key, limit in TARGETS[compute].items():
                value = figures.get(key)
                if value is None:
                    continue
                verdict = "met" if value <= limit else f"MISSED by {value - limit:.2f} s"
                print(f"  target ({compute}) {key} <= {limit:g} s: {value:.2f} s, {verdict}", flush=True)
    if args.vae_check and results["rollouts"] and hasattr(pipe, "last_latents"):
        results["vae_check"] = check = vae_check(pipe, pipe.last_latents)
        print(f"VAE check, {check['chunks']} chunks decoded one by one: {check['decode_seconds']} s; bf16 vs float32 "
              f"rel-L2 {check['rel_l2_bf16_vs_float32']:.3e}, PSNR {check['psnr_db_bf16_vs_float32']} dB, "
              f"max |diff| {check['max_abs_diff']:.3f}", flush=True)  # fmt: skip
        save()
    rss = peak_rss_gib()
    results["process_peak_rss_gib"] = None if rss is None else round(rss, 2)
    save()
    print(np.round(rss or 0, 2), "GiB peak RSS for the whole process")


if __name__ == "__main__":
    main()
