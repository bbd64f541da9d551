"""bench_fast.py's command line: its own module, so the bench reads as what it measures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from contracts.engine_options import ATTENTIONS
from contracts.model_frame import MODEL_SIZE
from contracts.settings import FIELD_BY_NAME


def fast_parser(description: str) -> argparse.ArgumentParser:
    """bench_fast.py's options (its docstring as the description)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default="tiny", help="checkpoint folder (base folder with the Fast DiT), or tiny")
    parser.add_argument("--build-synthetic", action="store_true", help="write a full-size synthetic one at --ckpt")
    parser.add_argument(
        "--action-path", type=Path, help="the episode: poses.npy, intrinsics.npy, image, prompt (needed with --frames)"
    )
    parser.add_argument("--vram-budget", type=float, help="GiB, as `generate --vram-budget`")
    parser.add_argument("--size", default=MODEL_SIZE, help="max area H*W")
    parser.add_argument(
        "--frames",
        default="81,161",
        help='comma-separated frame counts, one rollout each ("": none, with --golden: the parity alone), each '
        "the product's default path (chunk graphs as LINGBOT_ISAAC_CHUNK_GRAPHS says, the decode overlap as "
        "LINGBOT_ISAAC_DECODE_OVERLAP: on unless 0) unless "
        "letters follow the number: c reuses the prompt's embedding from the run before (as the server's prompt "
        "cache does), g captures chunk forwards as CUDA graphs, o decodes each chunk on a second stream beside "
        "the next chunk's forwards (81cgo), p profiles the rollout (with --profile-dir), h times one steady "
        "forward's blocks on the host and on the GPU (which one bounds it, bench/host_bound.py), b runs it as a "
        "batch job (no client takes chunks as they come: the plan may decode them after the loop), x runs every "
        "block eagerly (no block graphs: worldgen.models.block_graphs); 81eager / "
        "81serial: graphs and overlap asked for, less the graphs / less the overlap",
    )
    parser.add_argument("--golden", type=Path, help="golden/fast folder: parity in bf16 on this device first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--gpus",
        metavar="I,J",
        help="the rollouts split over GPUs I and J (issue 55: each chunk forward sequence-parallel), replacing --device",
    )
    parser.add_argument("--attention", choices=ATTENTIONS, default="auto", help="attention kernel (default: auto)")
    parser.add_argument(
        "--compute",
        default="exact",
        help="comma-separated computes (exact, fp8): the --frames list runs once per compute in the same pipeline; "
        "the last 81-frame rollout of each later compute is compared chunk by chunk with the first compute's",
    )
    parser.add_argument(
        "--attention-frames",
        type=int,
        default=FIELD_BY_NAME["attention_frames"].default,
        help="latent frames the DiT attends to (as `generate --attention-frames`): pins the KV window, so "
        "plans that leave the cache different room run the same attention",
    )
    parser.add_argument(
        "--vae-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the VAE's dtype for every rollout (auto: the engine's, float32 but bf16 under Fast fp8 on CUDA); "
        "float32 with --compute exact,fp8 gives both the same memory plan, so the per-chunk distance is fp8's alone",
    )
    parser.add_argument(
        "--fused-kernels",
        choices=("compile", "triton"),
        help="the DiT's fused groups: every one compiled by torch.compile, or hand-written Triton kernels where "
        "they take the call (default: the engine's, worldgen.kernels.fused.KERNELS)",
    )
    parser.add_argument(
        "--compile-ahead",
        choices=("load", "job", "off"),
        default="load",
        help="the Triton kernels and cuDNN graphs compiled ahead (worldgen.pipelines.fast_warm_up): at load for "
        "the default settings' shapes (the engine's way, the default), after load for the first --frames "
        "entry and the episode image's shapes (what a caller that knows its job can ask), or not at all",
    )
    parser.add_argument(
        "--first-use",
        choices=("load", "off"),
        default="load",
        help="umT5 and the VAE run once at load (FastPipeline.first_use_ahead: what a server does at its start, "
        "the default here) or not (a one-shot `generate`: its first rollout pays their first use)",
    )
    parser.add_argument(
        "--compile-options",
        type=json.loads,
        default=None,
        help="JSON of Inductor settings for the fused kernels, replacing worldgen.kernels.fused.COMPILE_OPTIONS "
        "(default: one Triton config a kernel, no autotuning); '{}' is Inductor's own defaults",
    )
    parser.add_argument(
        "--vae-check",
        action="store_true",
        help="after the rollouts, the last one's chunk latents decoded by a float32 VAE and by a bf16 one: "
        "seconds of each, and the bf16 video's distance from float32's (rel-L2, PSNR)",
    )
    parser.add_argument(
        "--graph-check",
        action="store_true",
        help="after the first compute's rollouts, the last --frames entry once more with every forward eager (no "
        "CUDA graphs): its chunks against that entry's. Under a budget its plan keeps no graph pool, so its KV "
        "window may be larger: chunks are comparable until the window rolls (identical expected there)",
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="FastPipeline.warm_up (what `[worker] warm_up = true` does at server start) before the rollouts, "
        "at the first --frames entry and the episode image's shape, under the first --compute; timed",
    )
    parser.add_argument(
        "--sdpa-first",
        choices=("cudnn", "flash", "efficient"),
        help="PyTorch SDPA kernel tried first (default: the engine's choice)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="a --frames entry with a trailing p (81p) runs under torch.profiler: kernel families, GPU idle time "
        "and the costliest kernels written here as profile-<compute>-<n>.txt (bench/kernel_profile.py; with --gpus, "
        "rank 1's as profile-<compute>-<n>-rank1.txt)",
    )
    parser.add_argument(
        "--chunk-files",
        type=Path,
        help="streamed rollouts write each chunk's mp4 and still here on the worker's background thread, as "
        "for a client that asks for chunks (a live job; worldgen.chunk_files): their cost to the chunk loop",
    )
    parser.add_argument("--json", type=Path, help="write all results here (rewritten after each step)")
    return parser
