"""Time and peak RSS of quantizing one full-size original-release expert to the NF4 layout.

Usage: python bench/bench_quantize.py SOURCE_EXPERT TARGET_EXPERT [--device cuda] [--json OUT]

SOURCE_EXPERT is a bf16 expert folder (bench/synthetic_checkpoint.py --layout bf16 --experts high).
Runs `worldgen.runtime.quantize.quantize_expert` (what `lingbot-isaac quantize` runs per expert), then
checks the output: bitsandbytes' own `QuantState.from_dict` on a few layers against the source
weights, and our `load_expert` onto the device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from worldgen.kernels.nf4 import QUANT_SUFFIXES  # noqa: E402
from worldgen.runtime.checkpoint import load_expert, stream_bf16_expert  # noqa: E402
from worldgen.runtime.metering import peak_rss_gib  # noqa: E402
from worldgen.runtime.quantize import quantize_expert  # noqa: E402

CHECKED_LAYERS = ("blocks.0.self_attn.q", "blocks.20.ffn.0", "blocks.39.cam_injector_layer1", "head.head")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    stats = quantize_expert(args.source, args.target, device, show_progress=False)
    rss = peak_rss_gib()
    print(
        f"quantized {stats['quantized_layers']} layers: {stats['source_bytes'] / 2**30:.2f} GiB -> "
        f"{stats['target_bytes'] / 2**30:.2f} GiB in {stats['seconds']:.0f} s "
        f"({stats['source_bytes'] / stats['seconds'] / 1e9:.2f} GB/s of source); peak RSS {rss:.2f} GiB",
        flush=True,
    )
    from bitsandbytes.functional import QuantState, dequantize_4bit
    from safetensors import safe_open

    with safe_open(args.target / "model.safetensors", "pt") as f:
        names = f.keys()  # safe_open is not iterable: keys() is its listing
        quantized = sorted(k.removesuffix(".weight.quant_state.bitsandbytes__nf4") for k in names if k.endswith("nf4"))
    layers = [n for n in CHECKED_LAYERS if n in quantized] or quantized[:3]  # full size, or a small smoke test
    wanted = {f"{name}.weight" for name in layers}
    source = {k: v for k, v in stream_bf16_expert(args.source, device, None, None) if k in wanted}
    errors = {}
    with safe_open(args.target / "model.safetensors", "pt", device=str(device)) as f:
        for name in layers:
            parts = {s.removeprefix("weight."): f.get_tensor(f"{name}.{s}") for s in QUANT_SUFFIXES}
            state = QuantState.from_dict(parts, device=device)
            dense = dequantize_4bit(f.get_tensor(f"{name}.weight"), state).float()
            weight = source[f"{name}.weight"].float()
            errors[name] = ((dense - weight).norm() / weight.norm()).item()
    print("QuantState.from_dict + dequantize_4bit vs source, rel-L2:", {k: round(v, 4) for k, v in errors.items()})
    start = time.perf_counter()
    model = load_expert(args.target, device, torch.bfloat16)
    seconds = time.perf_counter() - start
    print(
        f"load_expert of the output: {seconds:.1f} s, {sum(b.numel() for b in model.buffers()) / 1e9:.2f} G buffer elements"
    )
    if args.json:
        atomic.write_json(
            args.json,
            {**stats, "peak_rss_gib": rss, "from_dict_rel_l2": errors, "load_seconds": seconds},
            indent=1,
        )


if __name__ == "__main__":
    main()
