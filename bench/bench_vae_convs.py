"""One causal 3x3x3 convolution of the Wan2.1 VAE's decoder at each of its shapes: cuDNN's 3-D convolution against
three 2-D convolutions over the frames, summed (`worldgen.models.vae._time_taps`, what a float32 VAE on CUDA runs).

Usage:
  python bench/bench_vae_convs.py [--dtypes float32,bfloat16] [--reps 10] [--json OUT]

Channels-last, random weights, one latent frame's push at 464x832 (then 4 latent frames decoded in one call, the
last rows). Per shape and dtype: milliseconds, TF/s, and the taps' distance from the 3-D result (rel-L2). Session
31 (H200): in float32 (TF32) the taps were 1.1-1.6x faster at every level but the smallest; in bf16 cuDNN's 3-D
kernels were level or faster but at 96 channels, and the taps' three roundings added 3.3e-3 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing import seconds_per_call  # noqa: E402
from contracts import atomic  # noqa: E402
from worldgen.models import vae as vae_module  # noqa: E402

# (channels in, out, frames out, height, width): the decoder's 3x3x3 convolutions for a push of one latent frame
# at 464x832 (the middle, then each level after its upsampling), then for four latent frames in one call
SHAPES = [
    (384, 384, 1, 58, 104),
    (384, 384, 2, 116, 208),
    (192, 384, 2, 116, 208),
    (192, 192, 4, 232, 416),
    (96, 96, 4, 464, 832),
    (384, 384, 8, 116, 208),
    (192, 192, 16, 232, 416),
    (96, 96, 16, 464, 832),
]


def one_shape(shape: tuple[int, ...], dtype: torch.dtype, reps: int) -> dict:
    cin, cout, frames, height, width = shape
    layout = torch.channels_last_3d
    x = torch.randn(1, cin, frames + 2, height, width, device="cuda", dtype=dtype).contiguous(memory_format=layout)
    weight = (torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=dtype) * 0.02).contiguous(memory_format=layout)
    bias = torch.zeros(cout, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = F.conv3d(x, weight, bias, padding=(0, 1, 1)).float()
        got = vae_module._time_taps(x, weight, bias, (1, 1)).float()
        timings = [
            1e3 * seconds_per_call(lambda: F.conv3d(x, weight, bias, padding=(0, 1, 1)), reps),
            1e3 * seconds_per_call(lambda: vae_module._time_taps(x, weight, bias, (1, 1)), reps),
        ]
    flops = 2 * frames * height * width * cin * cout * 27
    return {
        "shape": list(shape),
        "conv3d_ms": round(timings[0], 3),
        "taps_ms": round(timings[1], 3),
        "conv3d_tflops": round(flops / timings[0] / 1e9),
        "taps_tflops": round(flops / timings[1] / 1e9),
        "taps_rel_l2": float((got - want).norm() / want.norm()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--reps", type=int, default=10, help="timed calls a measurement, after one warm call")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    if set(dtypes) - {"float32", "bfloat16"}:
        parser.error(f"--dtypes takes float32 and/or bfloat16; got {args.dtypes!r}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (cuDNN's convolutions are what it measures)")
    results = {"device": torch.cuda.get_device_name(), "rows": []}
    for name in dtypes:
        for shape in SHAPES:
            row = {"dtype": name, **one_shape(shape, getattr(torch, name), args.reps)}
            results["rows"].append(row)
            cin, cout, frames, height, width = shape
            print(
                f"{name:8} {cin:3d}->{cout:3d} x{frames:2d} {height}x{width}: conv3d {row['conv3d_ms']:7.2f} ms "
                f"({row['conv3d_tflops']:4d} TF/s)  taps {row['taps_ms']:7.2f} ms ({row['taps_tflops']:4d} TF/s, "
                f"rel-L2 {row['taps_rel_l2']:.1e})",
                flush=True,
            )
            torch.cuda.empty_cache()
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
