"""The streamed VAE of the Fast loop: memory and time per chunk for each spatial tiling.

Usage:
  python bench/bench_vae_stream.py [--size 464x832] [--chunks 7] [--tiles none,222720,148480,58496]
      [--dtype float32|bfloat16] [--time-taps on,off] [--fewer-passes on,off] [--json OUT]

A full-size Wan2.1 VAE (random weights, float32, as the pipeline runs it) decodes `--chunks` chunks of
3 latent frames with `StreamingDecoder` and encodes the matching conditioning frames (9, then 12 at a
time) with `StreamingEncoder`, once per tile setting (`none` = whole frames, else the largest tile
area in pixels). Per setting it prints: seconds per chunk, the causal caches kept between chunks
(GiB), and the peak memory a push needs above what was allocated before it (caches included), which
is what the Fast memory plan (`worldgen.pipelines.fast_plan.stream_vae_cuts`) must leave room for beside the DiT and
the KV cache. `--time-taps on,off` runs each setting with the causal convolutions as three 2-D time taps
(`worldgen.models.vae._time_taps`, what a float32 VAE on CUDA runs) and as cuDNN's 3-D convolutions: whether the
taps win on a card, and what they add to a push's peak (Session 31, H200: float32 decode 0.39 -> 0.32 s a 16-frame
chunk at 464x832, peak +2.6%; encode 0.059 -> 0.048 s a 4-frame push, peak +14%). `--fewer-passes on,off` runs
them with and without the norm written into the next convolution's input and the taps summed by their reader
(`vae.JOIN_IN_PLACE`, `vae.SUM_TAPS_IN_READER`; Session 32, by arithmetic: 145 GB less a float32 decode of 16
frames, 93 GB less their encode, `bench/vae_pass_bytes.py`; Session 33, H200: float32 decode 0.24 -> 0.21 s a
chunk, encode 0.165 -> 0.148 s, the peaks at or below the old path's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from worldgen.models import vae as vae_module  # noqa: E402
from worldgen.models.vae import WanVAE  # noqa: E402
from worldgen.models.vae_config import WAN21_VAE  # noqa: E402
from worldgen.models.vae_tiling import StreamingDecoder, StreamingEncoder  # noqa: E402

GiB = 2**30


def measure(stream, pieces, device) -> dict:
    base = torch.cuda.memory_allocated(device)
    seconds, peaks, tops = [], [], []
    for piece in pieces:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = stream.push(piece.to(device))
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
        peaks.append((torch.cuda.max_memory_allocated(device) - before) / GiB)
        tops.append((torch.cuda.max_memory_allocated(device) - base) / GiB)
        del out
    return {
        "seconds_per_chunk": [round(s, 3) for s in seconds],
        "seconds_total": round(sum(seconds), 2),
        "cache_gib": round(stream.cache_bytes() / GiB, 3),
        "peak_above_before_push_gib": round(max(peaks), 3),
        "peak_above_start_gib": round(max(tops), 3),  # caches of earlier chunks + this push
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="464x832", help="frame HxW in pixels (multiples of 16)")
    parser.add_argument("--chunks", type=int, default=7, help="chunks of 3 latent frames")
    parser.add_argument("--tiles", default="none,222720,148480,58496", help="tile areas in pixels; none = whole frames")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the VAE's dtype")
    parser.add_argument(
        "--time-taps", default="on", help="on, off or on,off: causal convolutions as three 2-D time taps or 3-D ones"
    )
    parser.add_argument(
        "--fewer-passes",
        default="on",
        help="on, off or on,off: the norm into the next input, the taps' sum in the reader",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    for flag, value in (("--time-taps", args.time_taps), ("--fewer-passes", args.fewer_passes)):
        if set(value.split(",")) - {"on", "off"}:
            parser.error(f"{flag} takes on, off or on,off; got {value!r}")
    device = torch.device("cuda")
    height, width = (int(v) for v in args.size.split("x"))
    dtype = getattr(torch, args.dtype)
    vae = WanVAE(WAN21_VAE).to(device, dtype).eval()
    weights = sum(p.numel() * p.element_size() for p in vae.parameters()) / GiB
    latents = [torch.randn(1, 16, 3, height // 8, width // 8) for _ in range(args.chunks)]
    video = torch.rand(1, 3, 1 + 12 * args.chunks - 3, height, width) * 2 - 1
    frames = [video[:, :, :9]] + [video[:, :, 9 + 12 * i : 21 + 12 * i] for i in range(args.chunks - 1)]
    results = {
        "device": torch.cuda.get_device_name(device),
        "size": args.size,
        "dtype": args.dtype,
        "vae_weights_gib": round(weights, 3),
    }
    runs = [(taps, fewer) for taps in args.time_taps.split(",") for fewer in args.fewer_passes.split(",")]
    for taps, fewer in runs:
        vae_module.TIME_TAPS_DTYPES = {dtype} if taps == "on" else set()
        vae_module.JOIN_IN_PLACE = vae_module.SUM_TAPS_IN_READER = fewer == "on"
        for tiles in args.tiles.split(","):
            tile = None if tiles == "none" else int(tiles)
            for name, cls, pieces in (("decode", StreamingDecoder, latents), ("encode", StreamingEncoder, frames)):
                torch.cuda.empty_cache()
                try:
                    result = measure(cls(vae, tile), pieces, device)
                except torch.OutOfMemoryError as exc:
                    result = {"error": str(exc)[:300]}
                key = f"{name} tiles={tiles} time-taps={taps} fewer-passes={fewer}"
                results[key] = result
                print(f"{key}: {result}", flush=True)
                torch.cuda.empty_cache()
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
