"""Golden parity on CUDA in bf16 (and float32): every reference case through the public API.

Usage: python bench/cuda_parity.py [--shared ../shared] [--dtype bfloat16] [--compute exact,fp8] [--eager]
Prints one line per case with the relative L2 error |a-b|/|b| against the CPU-float32 golden file.
`--compute fp8` also runs the golden DiT cases through the FP8 GEMMs (every Linear of the tiny
golden model, whatever its token count); `--eager` turns the fused elementwise CUDA kernels off (the old path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.engine_options import canonical_compute  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.kernels.attention import BACKENDS, resolve_backend  # noqa: E402
from worldgen.models.t5 import T5Config, UMT5Encoder, encode_prompts  # noqa: E402
from worldgen.models.vae import WanVAE  # noqa: E402
from worldgen.models.vae_config import VAEConfig  # noqa: E402
from worldgen.pipelines.base import Pipeline  # noqa: E402
from worldgen.pipelines.camera import camera_conditioning  # noqa: E402
from worldgen.pipelines.scheduler import FlowUniPCScheduler  # noqa: E402
from worldgen.runtime.checkpoint import load_expert  # noqa: E402
from worldgen.runtime.residency import ModelSlot  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float().cpu() - b.float()).norm() / b.float().norm()).item()


def loaded(module: torch.nn.Module, path: Path, device, dtype) -> torch.nn.Module:
    module.load_state_dict(torch.load(path, weights_only=True))
    return module.to(device, dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--compute", default="exact", help="comma-separated: exact (bf16: its old name), fp8 (DiT cases only)"
    )
    parser.add_argument("--eager", action="store_true", help="no fused elementwise kernels (the old path)")
    parser.add_argument(
        "--attention", choices=BACKENDS, default="sdpa", help="the DiT cases' attention kernel (default: sdpa)"
    )
    args = parser.parse_args()
    backend = resolve_backend(args.attention)
    if args.eager:
        from worldgen.kernels import fused

        fused.enable(False)
    computes = [canonical_compute(c) for c in args.compute.split(",")]
    if "fp8" in computes:
        from worldgen.kernels import fp8

        fp8.MIN_ROWS = 0  # the golden model has 72 tokens: send every Linear through FP8
    g = args.shared / "golden"
    dev = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    results = {}

    io = load_file(g / "dit/io.safetensors")
    nio = load_file(g / "dit/nf4_io.safetensors")
    for layout, ref in (("bf16_layout", io), ("nf4_layout", nio)):
        model = load_expert(g / "dit" / layout, dev, dtype)
        model.set_attention_backend(backend)
        for compute, t in ((c, t) for c in computes for t in (900, 250)):
            model.set_compute(compute)
            with torch.no_grad():
                out = model(
                    io["x"][None].to(dev),
                    torch.tensor([t], device=dev),
                    [io["context"].to(dev)],
                    io["y"][None].to(dev),
                    io["cam"].to(dev),
                )
            tag = "" if compute == "exact" else f" [{compute}]"
            results[f"dit {layout} cam t{t}{tag}"] = rel(out[0], ref[f"out_cam_t{t}"])
        del model

    tio = load_file(g / "t5/io.safetensors")
    t5 = loaded(UMT5Encoder(T5Config.from_json(g / "t5/config.json")), g / "t5/t5_encoder.pth", dev, dtype)
    with torch.no_grad():
        results["t5 hidden"] = rel(t5(tio["ids"].to(dev), tio["mask"].to(dev)), tio["hidden"])
        ctx = encode_prompts(t5, tio["ids"].to(dev), tio["mask"].to(dev))
    results["t5 context0"] = rel(ctx[0], tio["context0"])

    vio = load_file(g / "vae/io.safetensors")
    for vdtype in (torch.float32, dtype):
        vae = loaded(WanVAE(VAEConfig.from_json(g / "vae/config.json")), g / "vae/vae.pth", dev, vdtype)
        results[f"vae encode {vdtype}"] = rel(vae.encode(vio["video"][None].to(dev))[0], vio["latent"])
        results[f"vae decode {vdtype}"] = rel(vae.decode(vio["latent"][None].to(dev))[0], vio["decoded"])

    sio = load_file(g / "scheduler/io.safetensors")
    for case in json.loads((g / "scheduler/cases.json").read_text())["cases"]:
        tag = case["tag"]
        sched = FlowUniPCScheduler()
        sched.set_timesteps(case["steps"], shift=case["shift"])
        x = sio[f"{tag}_x_init"].to(dev)
        errs = []
        for i, t in enumerate(sched.timesteps):
            v = 0.8 * torch.sin(1.7 * x) + (t.item() / 1000) * torch.cos(0.5 * x) - 0.3 * x
            x = sched.step(v, t, x)
            errs.append(rel(x, sio[f"{tag}_trajectory"][i]))
        results[f"scheduler {tag} (max over steps)"] = max(errs)

    cio = load_file(g / "camera/io.safetensors")
    ex = args.shared / "reference/lingbot_examples"
    for case in json.loads((g / "camera/cases.json").read_text())["cases"]:
        tag = case["tag"]
        cond = camera_conditioning(
            np.load(ex / case["example"] / "poses.npy"),
            np.load(ex / case["example"] / "intrinsics.npy"),
            case["frame_num_requested"],
            case["height"],
            case["width"],
        )
        results[f"camera {tag} plucker"] = rel(cond.plucker, cio[f"{tag}_plucker"])

    pio = load_file(g / "pipeline/io.safetensors")
    spec = json.loads((g / "pipeline/case.json").read_text())
    pipe = Pipeline(
        tokenizer=None,
        text_encoder=ModelSlot("t5", lambda: t5),
        vae=ModelSlot(
            "vae",
            lambda: loaded(WanVAE(VAEConfig.from_json(g / "vae/config.json")), g / "vae/vae.pth", dev, torch.float32),
        ),
        experts={
            e: ModelSlot(e, lambda e=e: load_expert(g / "pipeline" / f"{e}_noise_model", dev, dtype))
            for e in ("high", "low")
        },
        device=dev,
        text_len=16,
        name="golden",
    )
    context, negative = pipe.encode_ids(pio["ids"], pio["mask"])
    settings = GenerationSettings(
        size=f"{spec['max_area'] // spec['width']}*{spec['width']}",  # the case's max area (64*112)
        frame_num=spec["frame_num"],
        steps=spec["steps"],
        shift=spec["shift"],
        guide_scale=tuple(spec["guide_scale_low_high"]),
    )

    def golden_rollout(compute: str) -> torch.Tensor:
        return pipe.generate(
            ex / "00/image.jpg",
            None,
            np.load(ex / "00/poses.npy"),
            np.load(ex / "00/intrinsics.npy"),
            settings.replace(compute=compute),  # per job, as a job's settings carry it
            noise=pio["noise"],
            context=context.to(dev),
            negative_context=negative.to(dev),
        )

    for compute in computes:
        video = golden_rollout(compute)
        tag = "" if compute == "exact" else f" [{compute}]"
        results[f"pipeline end-to-end video{tag}"] = rel(video, pio["video"])
    # the two-device path (--gpus), both "devices" on this GPU: the same output as one device
    one_device = golden_rollout("exact")
    pipe.second_device = second_device(g, dev, dtype)
    results["pipeline, two devices vs one (rel-L2 between them)"] = rel(golden_rollout("exact"), one_device)
    pipe.second_device = None

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} compute dtype {dtype}")
    for name, err in results.items():
        print(f"  {name:<45} rel-L2 {err:.3e}")


def second_device(g: Path, dev: torch.device, dtype: torch.dtype):
    """A `worldgen.pipelines.multi_gpu.SecondDevice` with its own copies of the golden experts on `dev`."""
    from worldgen.pipelines.multi_gpu import SecondDevice
    from worldgen.runtime.memory import MemoryPlan
    from worldgen.runtime.residency import ResidencyPolicy

    copies = {
        e: ModelSlot(e, lambda e=e: load_expert(g / "pipeline" / f"{e}_noise_model", dev, dtype))
        for e in ("high", "low")
    }
    return SecondDevice(dev, ResidencyPolicy(MemoryPlan.unlimited(dev), experts=copies))


if __name__ == "__main__":
    main()
