"""Load a pipeline: the checkpoint's layout picks the base model (two experts) or LingBot-World-Fast
(one causal DiT), the memory plan decides what stays resident, and the weights stream in.

Its own module so that neither pipeline imports the other's loader (the base pipeline and
`pipelines.fast`, which builds on it, stay one-way).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from contracts.checkpoint_layout import TINY_CHECKPOINTS, TINY_V2_CHECKPOINTS, find_model
from contracts.engine_options import (
    AUTO_COMPUTE,
    AUTO_DEVICE,
    DEVICE_HELP,
    MODELS,
    TORCH_DTYPE_NAMES,
    EngineOptions,
    canonical_compute,
)
from contracts.model_families import V1_BASE, V1_FAST, ModelFamily, dit_size
from contracts.settings import GenerationSettings
from worldgen.errors import InputError
from worldgen.models.dit_config import DiTConfig
from worldgen.models.tokenizer import PromptTokenizer
from worldgen.pipelines.base import Pipeline
from worldgen.pipelines.text_cache import TextCache
from worldgen.runtime import host_heap
from worldgen.runtime.memory import GiB, MemoryPlan
from worldgen.runtime.residency import ModelSlot, ResidencyPolicy


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """None or "auto": CUDA where there is a GPU, else the CPU; a CUDA device this machine (or this
    PyTorch build) does not have is an InputError of one line, before anything touches CUDA."""
    if device is None or str(device) == AUTO_DEVICE:
        return default_device()
    try:
        device = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"device {device!r}: use one of {DEVICE_HELP}") from None
    if device.type == "cuda":
        from worldgen.pipelines.multi_gpu import check_devices

        check_devices([str(device)])
    elif device.type != "cpu":
        raise InputError(f"device {str(device)!r}: use one of {DEVICE_HELP}")
    return device


def resolve_checkpoint(ckpt: str | Path) -> tuple[Path, bool]:
    """'tiny' / 'tiny-nf4' -> the built-in checkpoint (made on first use); else the folder. -> (path, is_tiny)."""
    if str(ckpt) in TINY_CHECKPOINTS:
        from worldgen.runtime.tiny import ensure_tiny_checkpoint

        if str(ckpt) in TINY_V2_CHECKPOINTS:
            from worldgen.runtime.tiny import ensure_tiny_v2

            return ensure_tiny_v2(), True
        return ensure_tiny_checkpoint("nf4" if str(ckpt) == "tiny-nf4" else "bf16"), True
    return Path(ckpt).expanduser(), False


def load_pipeline(
    ckpt: str | Path = "tiny",
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    vram_budget_gb: float | None = None,
    ram_budget_gb: float | None = None,
    text_cache_dir: Path | None = None,
    use_text_cache: bool = True,
    text_encoder_on_cpu: bool = False,
    attention: str = "auto",
    model: str = "base",
    compute: str | None = "exact",
    devices: list[str] | tuple[str, ...] | None = None,
    first_use_ahead: bool = False,
    ahead_settings: GenerationSettings | None = None,
    assets_dir: str | Path | None = None,
) -> Pipeline:
    """Recognise the checkpoint, make the memory plan and return a pipeline whose models load lazily.

    `dtype` is the DiT/T5 compute dtype: bfloat16 on CUDA, float32 on the CPU by default. The VAE
    runs in float32 as in the reference, except under the Fast model's fp8 and int8 (`vae_dtype`). `attention` picks the DiT's attention kernel
    (`worldgen.kernels.attention`: auto, sdpa, flash, sage). `model`: "base" (the two experts) or "fast"
    (LingBot-World-Fast, a `worldgen.pipelines.fast.FastPipeline`). `compute`: "exact" ("bf16", its old name) or "fp8"
    (approximate, Ada/Hopper only: `worldgen.kernels.fp8`), a job's settings may override it. `devices`:
    one device (as `device`) or two: the base model's second runs each step's unconditional pass
    (`worldgen.pipelines.multi_gpu`), the causal models' split each chunk forward with the first, from a
    process of its own (`worldgen.pipelines.two_gpu`); `devices_for_gpus` turns `--gpus 0,1` into them. What was applied is
    recorded in `pipe.engine` (the worker reports it in its health answers). A Fast pipeline on CUDA
    compiles its kernels ahead (`FastPipeline.compile_ahead`); with `first_use_ahead` (a server) it also
    runs umT5 and the VAE once (`FastPipeline.first_use_ahead`), so its first job is as quick as its next;
    both for a job of `ahead_settings` (a server's job defaults; None: the default settings). Which model
    family the folder holds (v1 base or Fast, LingBot-World 2.0's causal-fast or causal-pretrain) is
    `contracts.checkpoint_layout.find_model`'s answer; `assets_dir`: where a 2.0 1.3B download's umT5,
    VAE and tokenizer are (else beside it or in a sibling download). `model` "causal" runs the guided
    causal-pretrain loop (`worldgen.pipelines.causal_pretrain`).
    """
    from worldgen.kernels.attention import resolve_backend
    from worldgen.runtime.checkpoint import (
        expert_files,
        load_expert,
        load_t5,
    )
    from worldgen.runtime.cuda_memory import (
        apply_memory_cap,
        gpu_total_gib,
        release_pinned_cache,
        use_expandable_segments,
    )
    from worldgen.runtime.memory import plan_memory
    from worldgen.runtime.tensor_stream import prefetch_into_page_cache

    use_expandable_segments()  # fewer fragmentation OOMs near the budget, wherever CUDA was first touched
    if devices:
        from worldgen.pipelines.multi_gpu import check_devices

        if len(devices) > 2:
            raise InputError(f"devices {list(devices)}: a rollout uses one or two devices")
        check_devices(devices)
        device = devices[0]
    device = resolve_device(device)
    from worldgen.kernels.compute_choice import auto_compute
    from worldgen.kernels.compute_choice import check_supported as check_compute
    from worldgen.kernels.fp8 import COMPUTES, check_dtype, check_supported

    compute = canonical_compute(compute) or "exact"  # None: the engine's choice, the exact path
    compute_reason = f"compute {compute}: as asked"
    if compute == AUTO_COMPUTE:  # the card decides (worldgen.kernels.compute_choice), the record says why
        compute, compute_reason = auto_compute(device)
    if compute not in COMPUTES:
        raise InputError(f"compute {compute!r} is unknown: use one of {', '.join(COMPUTES)} or {AUTO_COMPUTE}")
    if compute == "fp8":
        if dtype is not None:  # asked for explicitly: say so before the device (a CPU's float32 is no choice)
            check_dtype(dtype)
        for name in devices or [device]:
            check_supported(name)
    if compute == "int8":
        for name in devices or [device]:
            check_compute(compute, name)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if device.type == "cuda":  # compiled kernels kept under the user's cache folder across processes
        from worldgen.runtime.compile_cache import use_persistent_cache

        use_persistent_cache()
    if model not in MODELS:
        raise InputError(f"model {model!r} is unknown: use one of {', '.join(MODELS)}")
    root, is_tiny = resolve_checkpoint(ckpt)
    if is_tiny and model == "fast" and str(ckpt) not in TINY_V2_CHECKPOINTS:
        from worldgen.runtime.tiny import ensure_tiny_fast

        ensure_tiny_fast(root)
    family, layout = find_model(root, model, assets_dir)

    dit_folder = next(iter(layout.experts.values()))
    dit_config = DiTConfig.from_json(dit_folder / "config.json")

    def planned(on: torch.device, t5_on_cpu: bool) -> MemoryPlan:
        """The plan for one device, its CUDA cap applied (the one side effect of the budget)."""
        plan = plan_memory(
            on,
            vram_budget_gb,
            ram_budget_gb,
            expert_gib=layout.expert_gib,
            checkpoint_kind=layout.kind,
            gpu_total_gib=gpu_total_gib(on) if on.type == "cuda" else None,
            text_encoder_gib=layout.t5.stat().st_size / GiB if layout.t5.exists() else 0.0,
            text_encoder_on_cpu=t5_on_cpu,
            width=dit_config.dim,  # a narrower DiT (2.0's 1.3B) holds fewer activations
        )
        apply_memory_cap(plan)
        return plan

    plan = planned(device, text_encoder_on_cpu)
    backend = resolve_backend(attention)
    text_len = dit_config.text_len
    experts = {
        name: ModelSlot(
            "Fast DiT" if name == "fast" else f"{name}-noise expert",
            lambda f=folder: _prepared_expert(load_expert(f, device, dtype), plan, backend, compute),
            prefetch=lambda f=folder: prefetch_into_page_cache(expert_files(f)),
        )
        for name, folder in layout.experts.items()
    }
    t5_device = plan.text_encoder_device
    t5_dtype = dtype if t5_device.type == "cuda" else torch.float32
    kind = Pipeline
    extra = {"experts": experts}
    if devices and len(devices) == 2 and model == "base":  # guidance's two passes, one a device
        from worldgen.pipelines.multi_gpu import SecondDevice

        other = torch.device(devices[1])
        plan2 = planned(other, t5_on_cpu=True)  # the second GPU holds experts only
        experts2 = {
            name: ModelSlot(
                f"{name}-noise expert on {other}",
                lambda f=folder, p=plan2: _prepared_expert(load_expert(f, other, dtype), p, backend, compute),
            )
            for name, folder in layout.experts.items()
        }
        extra["second_device"] = SecondDevice(other, ResidencyPolicy(plan2, experts=experts2))
    from worldgen.pipelines.fast_plan import vae_dtype

    vae_compute = vae_dtype(model, compute, device)
    if model in ("fast", "causal"):
        from worldgen.pipelines.causal_pretrain import CausalPretrainPipeline
        from worldgen.pipelines.fast import FastPipeline

        kind = CausalPretrainPipeline if model == "causal" else FastPipeline
        extra = {"dit": experts["fast"], "dit_config": dit_config, "dtype": dtype, "family": family}
    pipe = kind(
        **extra,
        tokenizer=PromptTokenizer(layout.tokenizer_dir / "tokenizer.json"),
        text_encoder=ModelSlot(
            "umT5",
            lambda: load_t5(layout, t5_device, t5_dtype, plan.stream_text_encoder),
        ),
        vae=ModelSlot("VAE", lambda: _vae(layout, device, pipe.vae_dtype, first_use_ahead)),  # `pipe`: it may change it
        device=device,
        text_len=text_len,
        name=f"{'tiny (random weights)' if is_tiny else root.name}{_family_label(family, dit_folder)}, "
        f"{layout.kind} checkpoint layout",
        plan=plan,
        text_cache=TextCache(layout.t5, text_cache_dir, variant=f"{t5_device.type}-{t5_dtype}")
        if use_text_cache
        else None,
        is_random_weights=is_tiny,
        text_dtype=t5_dtype,
        compute=compute,
        vae_dtype=vae_compute,
    )
    pipe.engine = {
        "model": model,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "compute": compute,
        "compute_reason": compute_reason,  # `--compute auto`: which path the card took and why
        "devices": [str(d) for d in devices] if devices else [str(device)],
        "attention": backend,
        "text_encoder_device": str(t5_device),
        "text_encoder_streamed": plan.stream_text_encoder,  # --t5-on-cpu: block by block from its file
        "vae_dtype": str(vae_compute).removeprefix("torch."),
        "vram_budget_gb": vram_budget_gb,  # as asked (the plan applies it on CUDA only)
    }
    # what the provenance record of each rollout says about the model (worldgen.rollout.rollout_record)
    pipe.identity = {
        "variant": model,
        "family": family.name,  # contracts.model_families
        "size": dit_size(dit_folder / "config.json"),
        "weights": "tiny" if is_tiny else "real",
        "checkpoint": str(root),
        "layout": layout.kind,
        "dtype": str(dtype).removeprefix("torch."),
        "vae_dtype": str(vae_compute).removeprefix("torch."),
        "text_encoder": "cpu, streamed" if text_encoder_on_cpu else str(t5_device),
        "attention": backend,
    }
    if devices and len(devices) == 2 and model != "base":  # each chunk forward split over both: rank 1 a process
        from worldgen.pipelines.two_gpu import use_two_devices

        if dit_config.num_heads % 2:
            raise InputError(
                f"two devices split the DiT's attention heads in halves: its {dit_config.num_heads} do not"
            )

        sizes = (vram_budget_gb, ram_budget_gb, layout.expert_gib, layout.kind)
        rank1 = functools.partial(_rank1_dit, dit_folder, str(devices[1]), dtype, *sizes, backend, compute)
        use_two_devices(pipe, rank1, [str(device), str(devices[1])])
    if model in ("fast", "causal") and device.type == "cuda":
        from worldgen.pipelines import fast_warm_up

        # the loads' pinned staging buffers, cached by PyTorch for nothing that comes after (`release_pinned_cache`)
        pipe.engine["pinned_released_gib"] = release_pinned_cache()
        if fast_warm_up.COMPILE_AHEAD:  # its kernels compiled side by side now, not in the first chunk
            pipe.engine["compile_ahead_s"] = round(pipe.compile_ahead(ahead_settings), 2)
        if first_use_ahead:
            pipe.engine["first_use_ahead_s"] = round(pipe.first_use_ahead(ahead_settings), 2)
    pipe.engine["host_heap_trimmed_gib"] = host_heap.trim()  # what the load freed, out of the job's RSS
    return pipe


def _vae(layout, device: torch.device, dtype: torch.dtype, long_lived: bool) -> torch.nn.Module:
    """The VAE; a long-lived pipeline's (one that runs its models once ahead) lets cuDNN time a bf16 VAE's
    convolutions: its run-ahead pays the timing once (`worldgen.models.vae`)."""
    from worldgen.runtime.checkpoint import load_vae

    vae = load_vae(layout, device, dtype)
    vae.timed_conv = long_lived
    return vae


def load_pipeline_from_options(options: EngineOptions, **kwargs: Any) -> Pipeline:
    """`load_pipeline` with `contracts.engine_options.EngineOptions` (what a worker is sent)."""
    from worldgen.pipelines.fast_warm_up import job_defaults

    return load_pipeline(
        options.ckpt if options.ckpt == "tiny" else Path(options.ckpt),
        device=options.device,
        devices=options.devices if len(options.devices) > 1 else None,
        dtype=getattr(torch, TORCH_DTYPE_NAMES[options.dtype]) if options.dtype else None,
        vram_budget_gb=options.vram_budget_gb,
        text_encoder_on_cpu=options.t5_on_cpu,
        attention=options.attention,
        model=options.model,
        compute=options.compute,
        ahead_settings=job_defaults(options),
        assets_dir=options.assets_dir,
        **kwargs,
    )


def _prepared_expert(
    model: torch.nn.Module, plan: MemoryPlan, attention_backend: str, compute: str = "exact"
) -> torch.nn.Module:
    model.set_ffn_chunk_tokens(plan.ffn_chunk_tokens)
    model.set_attention_backend(attention_backend)
    model.set_compute(compute)
    return model


def _rank1_dit(
    folder: Path, device: str, dtype: torch.dtype, vram_budget_gb, ram_budget_gb, expert_gib, kind, backend, compute
) -> torch.nn.Module:
    """Rank 1's DiT of a two-device causal job, loaded in its own process (`worldgen.pipelines.two_gpu`) under
    its device's plan (it holds no text encoder or VAE)."""
    from worldgen.runtime.checkpoint import load_expert
    from worldgen.runtime.cuda_memory import apply_memory_cap, gpu_total_gib
    from worldgen.runtime.memory import plan_memory

    on = torch.device(device)
    total = gpu_total_gib(on) if on.type == "cuda" else None
    plan = plan_memory(
        on, vram_budget_gb, ram_budget_gb, expert_gib=expert_gib, checkpoint_kind=kind, gpu_total_gib=total
    )
    apply_memory_cap(plan)
    return _prepared_expert(load_expert(folder, on, dtype), plan, backend, compute)


def _family_label(family: ModelFamily, dit_folder: Path) -> str:
    """What a pipeline's name says of its model (v1's names as they were: nothing for base, ", Fast")."""
    if family in (V1_BASE, V1_FAST):
        return ", Fast" if family is V1_FAST else ""
    return f", {family.title}, {dit_size(dit_folder / 'config.json')}"
