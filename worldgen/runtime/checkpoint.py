"""Find and load the checkpoint layouts users download, streaming weights straight to the device.

Layouts (see docs/checkpoints.md):
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

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from worldgen.errors import CheckpointError
from worldgen.kernels.nf4 import QUANT_SUFFIXES, NF4Linear
from worldgen.models.dit import DiTConfig, Linear, WanCameraDiT
from worldgen.runtime.tensor_stream import StagingBuffer, stream_safetensors, stream_torch_file

EXPERTS = ("high", "low")
FAST_DIR = "lingbot_world_fast"  # LingBot-World-Fast, inside the base folder as its README downloads it
FAST_NF4_DIR = "lingbot_world_fast_bnb_nf4"  # the same quantized by `lingbot-isaac quantize`
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_FILE = "Wan2.1_VAE.pth"
INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
TOKENIZER_DIRS = ("google/umt5-xxl", "tokenizer")


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    root: Path
    kind: str  # "bf16" (original release) or "nf4" (community release)
    experts: dict[str, Path]  # "high"/"low" -> expert folder; "fast" -> the Fast DiT folder
    t5: Path
    vae: Path
    tokenizer_dir: Path

    @property
    def t5_config_file(self) -> Path | None:
        path = self.root / "t5_config.json"
        return path if path.exists() else None

    @property
    def vae_config_file(self) -> Path | None:
        path = self.root / "vae_config.json"
        return path if path.exists() else None

    @property
    def expert_gib(self) -> float:
        """One expert's size on disk in GiB (what it takes in memory, near enough, for the plan)."""
        folder = next(iter(self.experts.values()))
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30


def find_checkpoint(root: Path | str) -> CheckpointLayout:
    """Recognise a checkpoint folder; errors name what is missing and what was expected."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint folder {root} does not exist (pass --ckpt-dir, or 'tiny' for the built-in model)"
        )
    kinds = {
        "bf16": {e: root / f"{e}_noise_model" for e in EXPERTS},
        "nf4": {e: root / f"{e}_noise_model_bnb_nf4" for e in EXPERTS},
    }
    found = {kind: dirs for kind, dirs in kinds.items() if any(d.is_dir() for d in dirs.values())}
    if not found:
        raise CheckpointError(
            f"{root} is neither checkpoint layout: expected high_noise_model/ + low_noise_model/ (original "
            "bf16 release) or high_noise_model_bnb_nf4/ + low_noise_model_bnb_nf4/ (NF4 release)"
        )
    kind = "nf4" if "nf4" in found else "bf16"  # prefer the smaller one when both are there
    experts = found[kind]
    for name, folder in experts.items():
        if not folder.is_dir():
            raise CheckpointError(
                f"{root}: {folder.name}/ is missing (the {name}-noise expert); the download is partial"
            )
    for folder in experts.values():
        if not (folder / "config.json").exists():
            raise CheckpointError(f"{folder}: config.json is missing; re-download this expert")
    return _with_shared_parts(root, kind, experts)


def _with_shared_parts(root: Path, kind: str, experts: dict[str, Path]) -> CheckpointLayout:
    for path, what in ((root / T5_FILE, "umT5 text encoder"), (root / VAE_FILE, "video VAE")):
        if not path.exists():
            raise CheckpointError(f"{root}: {path.name} ({what}) is missing; download it into this folder")
    tokenizer_dir = next((root / d for d in TOKENIZER_DIRS if (root / d / "tokenizer.json").exists()), None)
    if tokenizer_dir is None:
        tried = ", ".join(f"{d}/tokenizer.json" for d in TOKENIZER_DIRS)
        raise CheckpointError(f"{root}: no tokenizer found (looked for {tried})")
    return CheckpointLayout(root, kind, experts, root / T5_FILE, root / VAE_FILE, tokenizer_dir)


def _is_dit_folder(folder: Path) -> bool:
    return (folder / "config.json").exists() or any(folder.glob("diffusion_pytorch_model*.safetensors"))


def find_fast_checkpoint(root: Path | str) -> CheckpointLayout:
    """The LingBot-World-Fast DiT as released (`lingbot_world_fast/` inside the base checkpoint
    folder, whose umT5, VAE and tokenizer it uses), quantized (`lingbot_world_fast_bnb_nf4/`), or
    that folder given on its own (the shared parts are then looked for beside it). Layout
    `experts` = {"fast": folder}; errors name what is missing and the fix."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint folder {root} does not exist (pass --ckpt-dir, or 'tiny' for the built-in model)"
        )
    if root.name in (FAST_DIR, FAST_NF4_DIR) or (
        _is_dit_folder(root) and not (root / FAST_DIR).is_dir() and not (root / FAST_NF4_DIR).is_dir()
    ):
        folder, base = root, root.parent
    else:
        folder = next((root / d for d in (FAST_NF4_DIR, FAST_DIR) if (root / d).is_dir()), None)
        if folder is None:
            raise CheckpointError(
                f"{root}: no LingBot-World-Fast model: expected {FAST_DIR}/ inside it (download the Fast "
                f"weights there, as the reference README does) or {FAST_NF4_DIR}/ (lingbot-isaac quantize)"
            )
        base = root
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder}: config.json is missing; re-download the Fast model")
    kind = expert_kind(folder)
    if kind == "bf16":
        _check_shards(folder)
    elif not (folder / "quantization_meta.json").exists():
        raise CheckpointError(f"{folder}: quantization_meta.json is missing; this is not a complete NF4 model")
    try:
        return _with_shared_parts(base, kind, {"fast": folder})
    except CheckpointError as exc:
        if base == root:
            raise
        raise CheckpointError(
            f"{exc}; the Fast model uses the base checkpoint's umT5, VAE and tokenizer: put {folder.name}/ "
            "inside the lingbot-world-base-cam folder and pass that folder"
        ) from None


def _check_shards(folder: Path) -> None:
    index_path = folder / INDEX_FILE
    if not index_path.exists():
        return
    try:
        shards = set(json.loads(index_path.read_text())["weight_map"].values())
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{index_path}: unreadable index ({exc}); re-download it") from None
    absent = sorted(name for name in shards if not (folder / name).exists())
    if absent:
        raise CheckpointError(f"{folder}: shard {absent[0]} listed in {INDEX_FILE} is missing; the download is partial")


def expert_kind(folder: Path) -> str:
    if (folder / INDEX_FILE).exists() or list(folder.glob("diffusion_pytorch_model*.safetensors")):
        return "bf16"
    if (folder / "model.safetensors").exists() or (folder / "model.pt").exists():
        return "nf4"
    raise CheckpointError(
        f"{folder}: no weights found (expected {INDEX_FILE} with its shards, or model.safetensors / model.pt)"
    )


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
    from worldgen.models.vae import WAN21_VAE, VAEConfig, WanVAE

    config = VAEConfig.from_json(layout.vae_config_file) if layout.vae_config_file else WAN21_VAE
    with torch.device("meta"):
        model = WanVAE(config)
    return load_state_streaming(model, stream_torch_file(layout.vae, device, dtype), layout.vae).eval()
