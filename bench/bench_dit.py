"""Seconds and activation memory of one full-size DiT forward (480x832, 81 frames), bf16 vs NF4.

Builds the real-size expert (dim 5120, 40 layers, camera layers: 18.5 B parameters) directly on
the GPU with random weights, times forwards in bf16, then quantizes every Linear to NF4 (as the
community checkpoint stores it) and times again. Needs about 40 GiB of GPU memory.

Usage: python bench/bench_dit.py [--frames N] [--height H] [--width W] [--repeats 2] [--json OUT]
(default: the model frame and the default frame count, from contracts)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH  # noqa: E402
from contracts.settings import FIELD_BY_NAME  # noqa: E402
from worldgen.kernels.nf4 import NF4Linear, quantize_weight  # noqa: E402
from worldgen.models.dit import Linear, WanCameraDiT  # noqa: E402
from worldgen.models.dit_config import DiTConfig  # noqa: E402

GiB = 2**30


def random_model(cfg: DiTConfig, device: torch.device) -> WanCameraDiT:
    with torch.device("meta"):
        model = WanCameraDiT(cfg)
    model.to_empty(device=device)
    gen = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02 if p.ndim > 1 else 0.01, generator=gen)
    return model.to(torch.bfloat16).eval()


def to_nf4(model: WanCameraDiT) -> None:
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear):
            parent, _, child = name.rpartition(".")
            nf4 = NF4Linear(module.in_features, module.out_features, module.bias is not None, torch.bfloat16)
            parts = quantize_weight(module.weight.data)
            nf4.set_quant_state({k.removeprefix("weight.") if k != "weight" else k: v for k, v in parts.items()}, name)
            nf4.bias = module.bias
            setattr(model.get_submodule(parent) if parent else model, child, nf4)
            del module
    torch.cuda.empty_cache()


def time_forward(model, inputs, repeats: int) -> tuple[float, float]:
    """-> (seconds per forward, peak activation GiB above the resident weights)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        model(*inputs)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(repeats):
            model(*inputs)
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / repeats
    return seconds, (torch.cuda.max_memory_allocated() - base) / GiB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=FIELD_BY_NAME["frame_num"].default, help="video frames")
    parser.add_argument("--height", type=int, default=MODEL_HEIGHT, help="frame height in pixels")
    parser.add_argument("--width", type=int, default=MODEL_WIDTH, help="frame width in pixels")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--text-tokens", type=int, default=120, help="prompt length before padding to 512")
    parser.add_argument("--chunks", default="none,8192", help="feed-forward chunk sizes to time ('none': whole)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--attention", default="sdpa", help="sdpa, flash or sage (worldgen.kernels.attention)")
    parser.add_argument("--nf4-only", action="store_true", help="skip the bf16 timings")
    args = parser.parse_args()
    chunks = [None if c == "none" else int(c) for c in args.chunks.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    dev = torch.device("cuda")
    cfg = DiTConfig()
    lat_f, lat_h, lat_w = (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8
    tokens = lat_f * lat_h * lat_w // 4
    gen = torch.Generator(dev).manual_seed(1)
    x = torch.randn(1, 16, lat_f, lat_h, lat_w, device=dev, generator=gen)
    y = torch.randn(1, 20, lat_f, lat_h, lat_w, device=dev, generator=gen)
    ctx = [torch.randn(args.text_tokens, cfg.text_dim, device=dev, generator=gen)]
    cam = torch.randn(1, 384, lat_f, lat_h, lat_w, device=dev, generator=gen)
    t = torch.tensor([900.0], device=dev)
    model = random_model(cfg, dev)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {params / 1e9:.2f} B parameters; "
        f"{args.height}x{args.width}x{args.frames} -> {tokens} tokens"
    )
    results.update(tokens=tokens, parameters=params)

    def record(weights: str, chunk, batch: int, seconds: float, act: float) -> None:
        resident = torch.cuda.memory_allocated() / GiB
        results["runs"].append(dict(weights=weights, ffn_chunk=chunk, batch=batch, seconds=seconds,
                                    activations_gib=act, weights_gib=resident))  # fmt: skip
        per = "per 2 passes" if batch == 2 else "per forward"
        print(f"{weights:<5} batch={batch} ffn_chunk={chunk}: {seconds:.2f} s {per}, activations {act:.1f} GiB, "
              f"weights {resident:.1f} GiB", flush=True)  # fmt: skip

    model.set_attention_backend(args.attention)
    results["attention"] = args.attention
    for chunk in [] if args.nf4_only else chunks:
        model.set_ffn_chunk_tokens(chunk)
        record("bf16", chunk, 1, *time_forward(model, (x, t, ctx, y, cam), args.repeats))
    to_nf4(model)
    if args.attention != "sdpa":  # the optional kernel against SDPA on the same NF4 model and inputs
        with torch.no_grad():
            model.set_attention_backend("sdpa")
            reference = model(x, t, ctx, y, cam)[0].float()
            model.set_attention_backend(args.attention)
            out = model(x, t, ctx, y, cam)[0].float()
        results["rel_l2_vs_sdpa"] = ((out - reference).norm() / reference.norm()).item()
        print(f"{args.attention} vs sdpa, NF4 forward output rel-L2 {results['rel_l2_vs_sdpa']:.2e}", flush=True)
        model.set_ffn_chunk_tokens(None)
        model.set_attention_backend("sdpa")
        record("nf4 (sdpa)", None, 1, *time_forward(model, (x, t, ctx, y, cam), args.repeats))
        model.set_attention_backend(args.attention)
    for chunk in chunks:
        model.set_ffn_chunk_tokens(chunk)
        record("nf4", chunk, 1, *time_forward(model, (x, t, ctx, y, cam), args.repeats))
    model.set_ffn_chunk_tokens(8192)
    batched = (x.expand(2, -1, -1, -1, -1), t.expand(2), ctx * 2, y.expand(2, -1, -1, -1, -1), cam)
    record("nf4", 8192, 2, *time_forward(model, batched, 1))
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
