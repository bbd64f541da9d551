"""The VAE decoder's own kernels at 464x832 against their memory floor, and a decode push's GPU time by kernel.

Usage:
  python bench/bench_vae_kernels.py [--dtype bfloat16] [--reps 20] [--json OUT]

Channels-last, random data: per decoder level, the fused channel norm + SiLU with a convolution's bias
(`worldgen.kernels.channel_norm`) and the residual add (`worldgen.kernels.conv_bias`), each against a copy of the
same tensor (one read and one write: the floor a pass over it has). Then a randomly initialised Wan2.1 VAE
decodes latent frames one push at a time (cuDNN timing its convolutions, as a server's bf16 VAE does), and one
steady push (every cache full) is profiled: GPU milliseconds by kernel name. Session 39 (H200): the norm took 5.7x
a copy's time at 96 channels, bound by its arithmetic, and 23% of a push; rewritten, 1.4x, and a push went from 41.2
to 31.7 GPU ms (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing import seconds_per_call  # noqa: E402
from contracts import atomic  # noqa: E402
from worldgen.kernels import channel_norm, conv_bias  # noqa: E402
from worldgen.models.vae import WanVAE  # noqa: E402

# (channels, frames, height, width): a residual block's activation at each decoder level, one latent frame's push
SHAPES = [(384, 1, 58, 104), (384, 2, 116, 208), (192, 4, 232, 416), (96, 4, 464, 832)]


def one_shape(shape: tuple[int, ...], dtype: torch.dtype, reps: int) -> dict:
    channels, frames, height, width = shape
    g = torch.Generator("cuda").manual_seed(0)
    x, h = (
        (torch.randn(1, channels, frames, height, width, generator=g, device="cuda") * 3)
        .to(dtype)
        .contiguous(memory_format=torch.channels_last_3d)
        for _ in "xh"
    )
    gamma = (1 + 0.2 * torch.randn(channels, 1, 1, 1, generator=g, device="cuda")).to(dtype)
    bias = (0.1 * torch.randn(channels, generator=g, device="cuda")).to(dtype)
    out = torch.empty_like(x)
    ms = {
        "copy_ms": seconds_per_call(lambda: out.copy_(x), reps),
        "norm_silu_ms": seconds_per_call(
            lambda: channel_norm.rms_norm_silu(x, gamma, channels**0.5, bias=bias, out=out), reps
        ),
        "residual_add_ms": seconds_per_call(lambda: conv_bias.residual_add(x, bias, h), reps),
    }
    return {"shape": list(shape), **{k: round(1e3 * v, 4) for k, v in ms.items()}}


def push_kernels(dtype: torch.dtype, top: int) -> dict:
    """GPU milliseconds by kernel name of one steady decode push (its caches full) at 464x832."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    vae = WanVAE().to("cuda", dtype).eval()
    vae.timed_conv = True
    latent = torch.randn(1, 16, 5, 58, 104, device="cuda")
    cache: dict = {}
    with torch.no_grad():
        for t in range(4):  # frame 0, then pushes until every cache holds its two frames (and cuDNN has timed)
            vae.decode_chunk(latent[:, :, t : t + 1], cache)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            vae.decode_chunk(latent[:, :, 4:5], cache)
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        if "cuda" not in str(getattr(event, "device_type", "cuda")).lower():
            continue
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total > 0:
            rows.append({"kernel": event.key[:100], "calls": event.count, "ms": round(total / 1e3, 3)})
    rows.sort(key=lambda row: -row["ms"])
    return {"total_ms": round(sum(row["ms"] for row in rows), 2), "kernels": rows[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--reps", type=int, default=20, help="timed calls a measurement, after one warm call")
    parser.add_argument("--top", type=int, default=12, help="kernels listed for the push")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the kernels and cuDNN's convolutions are what it measures)")
    dtype = getattr(torch, args.dtype)
    results = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": []}
    for shape in SHAPES:
        row = one_shape(shape, dtype, args.reps)
        results["rows"].append(row)
        c, t, h, w = shape
        print(
            f"{c:3d} channels x{t} {h}x{w}: copy {row['copy_ms']:.3f} ms, norm + SiLU {row['norm_silu_ms']:.3f} ms "
            f"({row['norm_silu_ms'] / row['copy_ms']:.1f}x), residual add {row['residual_add_ms']:.3f} ms",
            flush=True,
        )
    results["push"] = push_kernels(dtype, args.top)
    print(f"a steady decode push: {results['push']['total_ms']} GPU ms")
    for row in results["push"]["kernels"]:
        print(f"  {row['ms']:7.2f} ms x{row['calls']:3d}  {row['kernel']}")
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
