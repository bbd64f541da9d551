"""Load the checkpoint layouts users download, streaming weights straight to the device.

The layouts are recognised by `contracts.checkpoint_layout` (no torch: `serve` and `demo` check a
folder with it before they start anything); see docs/checkpoints.md:
- original bf16 release: `high_noise_model/`, `low_noise_model/` (sharded safetensors + index.json);
- community NF4 release: `high_noise_model_bnb_nf4/`, `low_noise_model_bnb_nf4/` (`model.safetensors`
  or legacy `model.pt`, every Linear serialised as bitsandbytes' NF4);
- both: `models_t5_umt5-xxl-enc-bf16.pth`, `Wan2.1_VAE.pth`, tokenizer in `google/umt5-xxl/` or
  `tokenizer/`. Optional `t5_config.json` / `vae_config.json` describe non-standard sizes (the
  built-in tiny preset); without them the real umT5-XXL and Wan2.1 VAE sizes are assumed.

Modules are built on the meta device and every tensor is assigned as it arrives, so a whole state
dict never exists in RAM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from contracts.checkpoint_layout import (  # the layouts' one home (no torch); re-exported here
    EXPERTS,
    FAST_DIR,
    FAST_NF4_DIR,
    INDEX_FILE,
    T5_FILE,
    TOKENIZER_DIRS,
    VAE_FILE,
    CheckpointLayout,
    expert_kind,
    find_checkpoint,
    find_fast_checkpoint,
)
from worldgen.errors import CheckpointError
from worldgen.kernels.nf4 import QUANT_SUFFIXES, NF4Linear
from worldgen.kernels.quantized_weights import exact_weights_from
from worldgen.models.dit import Linear, WanCameraDiT
from worldgen.models.dit_config import DiTConfig
from worldgen.runtime.tensor_stream import StagingBuffer, stream_safetensors, stream_torch_file

__all__ = [  # the layout names are re-exported for the engine's callers
    "EXPERTS",
    "INDEX_FILE",
    "expert_kind",
    "expert_files",
    "load_expert",
    "load_state_streaming",
    "load_t5",
    "load_vae",
    "stream_bf16_expert",
    "FAST_DIR",
    "FAST_NF4_DIR",
    "T5_FILE",
    "TOKENIZER_DIRS",
    "VAE_FILE",
    "CheckpointLayout",
    "find_checkpoint",
    "find_fast_checkpoint",
]


def _assign(model: nn.Module, key: str, tensor: torch.Tensor, source: Path) -> None:
    module_path, _, attr = key.rpartition(".")
    try:
        module = model.get_submodule(module_path)
    except AttributeError:
        raise CheckpointError(f"{source}: unexpected tensor {key} (not part of the model)") from None
    if attr in module._parameters:
        current = module._parameters[attr]
        if current is not None and tuple(current.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{source}: {key} has shape {tuple(tensor.shape)}, the config says {tuple(current.shape)}; "
                "config.json and the weights do not belong together"
            )
        module._parameters[attr] = nn.Parameter(tensor, requires_grad=False)
    elif attr in module._buffers:
        module._buffers[attr] = tensor
    else:
        raise CheckpointError(f"{source}: unexpected tensor {key} (not part of the model)")


def _check_complete(model: nn.Module, source: Path) -> None:
    missing = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{source}: missing tensors {missing[:5]}{more}; the checkpoint is partial or mismatched")


def load_state_streaming(model: nn.Module, tensors: Iterator[tuple[str, torch.Tensor]], source: Path) -> nn.Module:
    """Assign streamed (key, tensor) pairs into a meta-built module, then check nothing is missing."""
    for key, tensor in tensors:
        _assign(model, key, tensor, source)
    _check_complete(model, source)
    return model


def stream_bf16_expert(folder: Path, device, dtype, staging) -> Iterator[tuple[str, torch.Tensor]]:
    index_path = folder / INDEX_FILE
    if index_path.exists():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{index_path}: unreadable index ({exc}); re-download it") from None
        shards: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            shards.setdefault(shard, []).append(key)
    else:
        shards = {p.name: None for p in sorted(folder.glob("diffusion_pytorch_model*.safetensors"))}
    for shard, keys in shards.items():
        path = folder / shard
        if not path.exists():
            raise CheckpointError(f"{folder}: shard {shard} listed in {INDEX_FILE} is missing; the download is partial")
        yield from stream_safetensors(path, keys, device, dtype, staging)


def expert_files(folder: Path) -> list[Path]:
    """The weight files of an expert folder of either layout (what a load reads)."""
    if expert_kind(folder) == "bf16":
        return sorted(folder.glob("diffusion_pytorch_model*.safetensors"))
    return [_nf4_file(folder)]


def _nf4_file(folder: Path) -> Path:
    for name in ("model.safetensors", "model.pt"):
        if (folder / name).exists():
            return folder / name
    raise CheckpointError(f"{folder}: neither model.safetensors nor model.pt is there")


def _compute_dtype_of(folder: Path) -> torch.dtype:
    meta_path = folder / "quantization_meta.json"
    if not meta_path.exists():
        raise CheckpointError(f"{folder}: quantization_meta.json is missing; this is not a complete NF4 expert")
    try:
        name = json.loads(meta_path.read_text())["quant"]["compute_dtype"]
        return getattr(torch, name)
    except (ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{meta_path}: no usable quant.compute_dtype ({exc})") from None


def _swap_linears_for_nf4(model: nn.Module, compute_dtype: torch.dtype) -> dict[str, NF4Linear]:
    swapped = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear):
            parent_name, _, child = name.rpartition(".")
            nf4 = NF4Linear(module.in_features, module.out_features, module.bias is not None, compute_dtype)
            setattr(model.get_submodule(parent_name) if parent_name else model, child, nf4)
            swapped[name] = nf4
    return swapped


def load_expert(
    folder: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    staging: StagingBuffer | None = None,
) -> WanCameraDiT:
    """Load one DiT expert of either layout onto `device`; dense tensors are cast to `dtype`.

    For NF4 experts the Linear weights stay 4-bit; they are dequantized to `dtype` on each call.
    """
    folder = Path(folder)
    if staging is None and torch.device(device).type == "cuda":
        staging = StagingBuffer(128 * 2**20, pin=True)  # two pinned buffers: copies overlap the next read
    config = DiTConfig.from_json(folder / "config.json")
    with torch.device("meta"):
        model = WanCameraDiT(config)
    kind = expert_kind(folder)
    if kind == "bf16":
        load_state_streaming(model, stream_bf16_expert(folder, device, dtype, staging), folder)
        # where `--compute fp8` / `int8` find the bf16 weights they drop, when another compute is asked for later
        exact_weights_from(model, lambda: stream_bf16_expert(folder, device, dtype, None))
        return model.eval()

    _compute_dtype_of(folder)  # validates the meta file; we compute in the requested dtype
    linears = _swap_linears_for_nf4(model, dtype)
    path = _nf4_file(folder)
    stream = (
        stream_safetensors(path, None, device, None, staging)
        if path.suffix == ".safetensors"
        else stream_torch_file(path, device)
    )
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in stream:
        owner = next((key[: -len(s) - 1] for s in (*QUANT_SUFFIXES, "weight") if key.endswith("." + s)), None)
        if owner in linears:
            parts = pending.setdefault(owner, {})
            parts[key[len(owner) + 1 :].removeprefix("weight.") if key != owner + ".weight" else "weight"] = tensor
            if len(parts) == len(QUANT_SUFFIXES) + 1:
                linears[owner].set_quant_state(pending.pop(owner), owner)
            continue
        if tensor.dtype.is_floating_point:
            tensor = tensor.to(dtype)
        _assign(model, key, tensor, path)
    if pending:
        name, parts = next(iter(pending.items()))
        absent = sorted({"weight", *(s.removeprefix("weight.") for s in QUANT_SUFFIXES)} - set(parts))
        raise CheckpointError(f"{path}: NF4 layer {name} lacks {absent}; the file is partial")
    unquantized = [n for n, m in linears.items() if m.weight.numel() == 0]
    if unquantized:
        raise CheckpointError(f"{path}: no NF4 weight for {unquantized[:5]}; the file is partial or not NF4")
    _check_complete(model, path)
    return model.eval()


def load_t5(
    layout: CheckpointLayout,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    stream_blocks: bool = False,
):
    """The umT5 encoder of a checkpoint, loaded tensor by tensor from its .pth.

    With `stream_blocks`, tensors stay memory-mapped on the CPU in the file's dtype (no copy, no RSS
    growth) and `worldgen.runtime.streamed_text_encoder.encode_prompts_streamed` moves one block at a time to the device.
    """
    from worldgen.models.t5 import UMT5_XXL, T5Config, UMT5Encoder

    config = T5Config.from_json(layout.t5_config_file) if layout.t5_config_file else UMT5_XXL
    with torch.device("meta"):
        model = UMT5Encoder(config)
    if stream_blocks:  # as stored, memory-mapped: encode_prompts_streamed casts one block at a time
        tensors = stream_torch_file(layout.t5, "cpu", None, copy=False)
    else:
        tensors = stream_torch_file(layout.t5, device, dtype)
    return load_state_streaming(model, tensors, layout.t5).eval()


def load_vae(layout: CheckpointLayout, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """The Wan2.1 video VAE of a checkpoint (float32 by default, as the reference runs it)."""
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE, VAEConfig

    config = VAEConfig.from_json(layout.vae_config_file) if layout.vae_config_file else WAN21_VAE
    with torch.device("meta"):
        model = WanVAE(config)
    return load_state_streaming(model, stream_torch_file(layout.vae, device, dtype), layout.vae).eval()
