"""LingBot-World 2.0's golden cases (shared/golden/v2) on CUDA: causal-fast with the whole-video and the
rolling cache, the 1.3B-shaped DiT, causal-pretrain with guidance, each rollout through the engine's own
chunk loop in bf16 (the release's dtype) and float32, as relative L2 |a-b|/|b| of the final latents (and
the first chunk's) against the CPU float32 reference.

Usage: python bench/cuda_parity_v2.py [--shared ../shared] [--dtypes bfloat16,float32] [--compute exact,fp8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.model_families import V2_FAST, V2_PRETRAIN  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.pipelines.causal_pretrain import CausalPretrainPipeline  # noqa: E402
from worldgen.pipelines.fast import FastPipeline  # noqa: E402
from worldgen.pipelines.fast_plan import FastOptions  # noqa: E402
from worldgen.runtime.checkpoint import load_expert  # noqa: E402
from worldgen.runtime.residency import ModelSlot  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float().cpu() - b.float()).norm() / b.float().norm()).item()


def pipeline(kind, folder: Path, family, device: torch.device, dtype: torch.dtype, compute: str):
    dit = load_expert(folder, device, dtype)
    dit.set_compute(compute)
    return kind(
        dit=ModelSlot("fast", lambda: dit), dit_config=dit.cfg, tokenizer=None, text_encoder=None, vae=None,
        device=device, text_len=dit.cfg.text_len, name="golden v2", family=family, dtype=dtype,
    )  # fmt: skip


def fast_cases(g: Path, device, dtype, compute) -> dict[str, float]:
    spec = json.loads((g / "fast" / "case.json").read_text())
    io = load_file(g / "fast" / "inputs.safetensors")
    results = {}
    for name, run in spec["cases"].items():
        out = load_file(g / "fast" / f"{name}.safetensors")
        pipe = pipeline(FastPipeline, g / "fast" / run["checkpoint"], V2_FAST, device, dtype, compute)
        settings = GenerationSettings(
            model="fast",
            shift=spec["shift"],
            attention_frames=max(run["local_attn_size"], 0),
            sink_frames=run["sink_size"],
        )
        options = FastOptions.from_settings(settings, spec["frame_seqlen"], V2_FAST)
        chunks = list(pipe.rollout_chunks(io["noise"], io["y"], io["context"], io["plucker"], options,
                                          renoise_draws=io["renoise"]))  # fmt: skip
        latent = torch.cat(chunks, dim=1)
        results[f"fast/{name} latent_final"] = rel(latent, out["latent_final"])
        results[f"fast/{name} chunk 0"] = rel(chunks[0], out["latent_final"][:, : spec["chunk_size"]])
    return results


def pretrain_case(g: Path, device, dtype, compute) -> dict[str, float]:
    spec = json.loads((g / "causal_pretrain" / "case.json").read_text())
    io = load_file(g / "causal_pretrain" / "io.safetensors")
    pipe = pipeline(
        CausalPretrainPipeline, g / "causal_pretrain" / spec["checkpoint"], V2_PRETRAIN, device, dtype, compute
    )
    pipe.steps, pipe.guide_scale = spec["sampling_steps"], spec["guide_scale"]
    options = FastOptions(shift=spec["shift"], chunk_frames=spec["chunk_size"])
    chunks = list(pipe.rollout_chunks(io["noise"], io["y"], io["context"], io["plucker"], options,
                                      negative_context=io["context_null"]))  # fmt: skip
    return {
        "causal_pretrain latent_final": rel(torch.cat(chunks, dim=1), io["latent_final"]),
        "causal_pretrain chunk 0": rel(chunks[0], io["latent_final"][:, : spec["chunk_size"]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--compute", default="exact", help="comma-separated: exact, fp8 (bfloat16 only)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    g, device = args.shared / "golden" / "v2", torch.device(args.device)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for compute in args.compute.split(","):
            if compute == "fp8" and dtype != torch.bfloat16:
                continue
            with torch.no_grad():
                results = {**fast_cases(g, device, dtype, compute), **pretrain_case(g, device, dtype, compute)}
            for case, error in results.items():
                print(f"{dtype_name:<9} {compute:<6} {case:<34} rel-L2 {error:.2e}", flush=True)


if __name__ == "__main__":
    main()
