"""Write a synthetic full-size checkpoint in the community NF4 layout (and optionally the bf16 one).

Real shapes and key names (two 18.5 B-parameter experts, umT5-XXL, Wan2.1 VAE), random weights:
what we can measure memory, speed and load throughput on without downloading the real release.
The tokenizer is our tiny character tokenizer (ids fit the real vocabulary).

Usage: python bench/synthetic_checkpoint.py OUT_DIR [--layout nf4|bf16] [--device cuda] [--experts high,low]
       [--no-shared] [--fast] [--v2 14b-fast|1.3b-fast|14b-pretrain]
  --experts high --no-shared: one expert only, e.g. to benchmark quantize; --experts none: the shared parts only;
  --fast: also the LingBot-World-Fast DiT, lingbot_world_fast[_bnb_nf4]/ (--experts none --fast: it and the shared parts);
  --v2: a LingBot-World 2.0 download instead of the experts: 14b-fast (transformers[_bnb_nf4]/, WanModelFast, the
  default 14B DiTConfig), 14b-pretrain (transformer_causal[_bnb_nf4]/, WanModelCausal), both with the shared parts
  unless --no-shared; 1.3b-fast (transformers/, Wan2.1-1.3B's shape) is its DiT alone in the bf16 layout, as
  released: its umT5, VAE and tokenizer come from a 14B download beside it (or --assets-dir). E.g.
    python bench/synthetic_checkpoint.py /tmp/v2/14b-fast --v2 14b-fast
    python bench/synthetic_checkpoint.py /tmp/v2/1.3b-fast --v2 1.3b-fast
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from worldgen.kernels.nf4 import quantize_weight  # noqa: E402
from worldgen.models.dit import Linear, WanCameraDiT  # noqa: E402
from worldgen.models.dit_config import DiTConfig  # noqa: E402
from worldgen.models.t5 import UMT5_XXL, UMT5Encoder  # noqa: E402
from worldgen.models.tokenizer import build_tiny_tokenizer  # noqa: E402
from worldgen.models.vae import WanVAE  # noqa: E402
from worldgen.models.vae_config import WAN21_VAE  # noqa: E402
from worldgen.runtime.checkpoint import FAST_DIR, FAST_NF4_DIR, INDEX_FILE, T5_FILE, VAE_FILE  # noqa: E402
from worldgen.runtime.safetensors_writer import save_file  # noqa: E402  (not safetensors': it makes 0600 files)


def meta_shapes(module: torch.nn.Module) -> dict[str, tuple[torch.Size, bool]]:
    return {k: v.shape for k, v in module.state_dict().items()}


def random_tensor(shape, name: str, device, gen) -> torch.Tensor:
    if "norm" in name:
        return torch.ones(shape, device=device, dtype=torch.bfloat16)
    return (torch.randn(shape, device=device, generator=gen) * 0.02).to(torch.bfloat16)


# LingBot-World 2.0 downloads (--v2): the DiT's folder (bf16 layout, then NF4), its class and its shape
V2_DITS = {
    "14b-fast": (("transformers", "transformers_bnb_nf4"), "WanModelFast", DiTConfig()),
    "1.3b-fast": (
        ("transformers", "transformers_bnb_nf4"),
        "WanModelFast",
        DiTConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30),  # Wan2.1-1.3B: its config.json
    ),
    "14b-pretrain": (("transformer_causal", "transformer_causal_bnb_nf4"), "WanModelCausal", DiTConfig()),
}
V2_DIT_ONLY = ("1.3b-fast",)  # downloads that hold their DiT alone (contracts.checkpoint_layout.find_v2_checkpoint)


def write_expert(
    folder: Path,
    layout: str,
    device: torch.device,
    seed: int,
    class_name: str = "WanModel",
    cfg: DiTConfig | None = None,
) -> None:
    cfg = cfg or DiTConfig()
    with torch.device("meta"):
        model = WanCameraDiT(cfg)
    linears = {n for n, m in model.named_modules() if isinstance(m, Linear)}
    gen = torch.Generator(device).manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    atomic.write_json(folder / "config.json", {"_class_name": class_name, **dataclasses.asdict(cfg)}, indent=1)
    shapes = meta_shapes(model)
    if layout == "nf4":
        meta = {"quant": {"format": "bnb_nf4", "quant_type": "nf4", "double_quant": True,
                          "compute_dtype": "bfloat16", "blocksize": 64}}  # fmt: skip
        atomic.write_json(folder / "quantization_meta.json", meta)
        out = {}
        for key, shape in shapes.items():
            value = random_tensor(shape, key, device, gen)
            owner = key.rpartition(".")[0]
            if owner in linears and key.endswith(".weight"):
                out.update({f"{owner}.{k}": v.cpu() for k, v in quantize_weight(value).items()})
            else:
                out[key] = value.cpu()
        save_file(out, folder / "model.safetensors")
        return
    keys = list(shapes)
    shard_size = 5 * 2**30
    shard, shards, size = {}, [], 0
    for key in keys:
        shard[key] = random_tensor(shapes[key], key, device, gen).cpu()
        size += shard[key].numel() * 2
        if size >= shard_size or key == keys[-1]:
            shards.append(shard)
            shard, size = {}, 0
    weight_map = {}
    for i, part in enumerate(shards, start=1):
        name = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, folder / name)
        weight_map.update({k: name for k in part})
    atomic.write_json(folder / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--layout", choices=("nf4", "bf16"), help="default nf4 (bf16 for --v2 1.3b-fast)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--experts", default="high,low", help="which experts to write")
    parser.add_argument("--no-shared", action="store_true", help="skip umT5, VAE and tokenizer")
    parser.add_argument("--fast", action="store_true", help="also write the LingBot-World-Fast DiT")
    parser.add_argument(
        "--v2",
        choices=sorted(V2_DITS),
        help="a LingBot-World 2.0 download instead: its DiT (and shared parts unless --no-shared)",
    )
    args = parser.parse_args()
    if args.v2 in V2_DIT_ONLY:  # as released: the DiT alone, bf16 (the shared parts are the 14B's)
        if args.layout == "nf4":
            parser.error(f"--v2 {args.v2} is released in the bf16 layout only")
        args.layout, args.no_shared = "bf16", True
    args.layout = args.layout or "nf4"
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)  # also when only the shared parts are written
    start = time.perf_counter()
    suffix = "_bnb_nf4" if args.layout == "nf4" else ""
    if args.v2:
        (bf16_dir, nf4_dir), class_name, cfg = V2_DITS[args.v2]
        write_expert(
            args.out / (nf4_dir if args.layout == "nf4" else bf16_dir), args.layout, device, 3, class_name, cfg
        )
        print(f"2.0 {args.v2} DiT written ({time.perf_counter() - start:.0f} s)", flush=True)
        args.experts = ""
    for seed, expert in enumerate(("high", "low")):
        if expert not in args.experts.split(","):
            continue
        write_expert(args.out / f"{expert}_noise_model{suffix}", args.layout, device, seed)
        print(f"{expert} expert written ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.fast:
        folder = FAST_NF4_DIR if args.layout == "nf4" else FAST_DIR
        write_expert(args.out / folder, args.layout, device, 2, class_name="WanModelFast")
        print(f"Fast DiT written ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.no_shared:
        return
    with torch.device("meta"):
        t5 = UMT5Encoder(UMT5_XXL)
    gen = torch.Generator(device).manual_seed(7)
    state = {k: random_tensor(s, k, device, gen).cpu() for k, s in meta_shapes(t5).items()}
    torch.save(state, args.out / T5_FILE)
    del state
    with torch.device("meta"):
        vae = WanVAE(WAN21_VAE)
    state = {k: random_tensor(s, k, device, gen).float().cpu() for k, s in meta_shapes(vae).items()}
    torch.save(state, args.out / VAE_FILE)
    tok_dir = args.out / ("tokenizer" if args.layout == "nf4" else "google/umt5-xxl")
    tok_dir.mkdir(parents=True, exist_ok=True)
    build_tiny_tokenizer(100).save(str(tok_dir / "tokenizer.json"))
    print(f"synthetic {args.layout} checkpoint at {args.out} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
