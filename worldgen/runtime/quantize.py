"""Convert the original bf16 release into the community NF4 layout, one tensor at a time.

  lingbot-isaac quantize ~/models/lingbot-world-base-cam                 # -> lingbot-world-base-cam-nf4
  lingbot-isaac quantize ~/models/lingbot-world-base-cam /fast/ssd/lingbot-nf4 --device cpu

Each expert's tensors stream from their shards through a small staging buffer to the GPU (or stay
on the CPU with --device cpu). Every Linear weight of the DiT is quantized by bitsandbytes (NF4,
double quantization, blocksize 64, from bf16: the same bytes bitsandbytes' `Linear4bit` saves)
and appended to `model.safetensors` with its quant state; every other tensor is stored as bf16.
RAM holds one tensor at a time, whatever the model size. The umT5 and VAE files are hard-linked
into the output when it is on the same filesystem (copied otherwise) and the tokenizer files are
copied to `tokenizer/`. Each output file appears only when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from contracts import atomic
from contracts.model_families import V2_FAMILIES
from worldgen.errors import CheckpointError, InputError
from worldgen.kernels.nf4 import QUANT_SUFFIXES, quantize_weight
from worldgen.models.dit import Linear, WanCameraDiT
from worldgen.models.dit_config import DiTConfig
from worldgen.runtime.checkpoint import (
    EXPERTS,
    FAST_DIR,
    FAST_NF4_DIR,
    INDEX_FILE,
    T5_FILE,
    VAE_FILE,
    expert_kind,
    stream_bf16_expert,
)
from worldgen.runtime.safetensors_writer import SafetensorsWriter, header_bound
from worldgen.runtime.tensor_stream import StagingBuffer, read_safetensors_header

FAST = "fast"  # the LingBot-World-Fast DiT (lingbot_world_fast/ -> lingbot_world_fast_bnb_nf4/)
BLOCKSIZE = 64
QUANTIZATION_META = {
    "quant": {
        "format": "bnb_nf4",
        "quant_type": "nf4",
        "double_quant": True,
        "compute_dtype": "bfloat16",
        "blocksize": BLOCKSIZE,
    }
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model")
OPTIONAL_CONFIGS = ("t5_config.json", "vae_config.json")  # only non-standard (tiny) checkpoints have them


def _source_headers(folder: Path) -> dict[str, dict]:
    """key -> safetensors header entry, over every shard of an original-release expert."""
    shards = sorted(folder.glob("diffusion_pytorch_model*.safetensors"))
    index = folder / INDEX_FILE
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{index}: unreadable index ({exc}); re-download it") from None
        shards = [folder / n for n in names]
    entries: dict[str, dict] = {}
    for shard in shards:
        if not shard.exists():
            raise CheckpointError(
                f"{folder}: shard {shard.name} listed in {INDEX_FILE} is missing; the download is partial"
            )
        entries.update(read_safetensors_header(shard)[0])
    return entries


def quantize_expert(
    source: Path, target: Path, device: torch.device, show_progress: bool = True
) -> dict[str, float | int]:
    """One original-release expert folder -> one NF4 expert folder (written beside, renamed at the end)."""
    from tqdm import tqdm

    config = DiTConfig.from_json(source / "config.json")
    with torch.device("meta"):
        model = WanCameraDiT(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    linears = {name for name, module in model.named_modules() if isinstance(module, Linear)}
    del model
    headers = _source_headers(source)
    unknown = sorted(set(headers) - set(expected))
    if unknown:
        raise CheckpointError(f"{source}: tensors {unknown[:5]} are not part of the model its config.json describes")
    missing = sorted(set(expected) - set(headers))
    if missing:
        raise CheckpointError(f"{source}: missing tensors {missing[:5]}; the download is partial")

    def is_quantized(key: str) -> bool:
        return key.endswith(".weight") and key[: -len(".weight")] in linears

    planned = []
    for key, entry in headers.items():
        if is_quantized(key):
            planned += [(key, 2)] + [(f"{key[: -len('weight')]}{suffix}", 1) for suffix in QUANT_SUFFIXES]
        else:
            planned.append((key, len(entry["shape"])))
    total_bytes = sum(e["data_offsets"][1] - e["data_offsets"][0] for e in headers.values())

    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    staging = StagingBuffer(128 * 2**20, pin=True) if device.type == "cuda" else None
    start = time.perf_counter()
    quantized = 0
    try:
        shutil.copyfile(source / "config.json", partial / "config.json")
        (partial / "quantization_meta.json").write_text(json.dumps(QUANTIZATION_META, indent=1) + "\n")
        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=target.name, disable=not show_progress)
        with SafetensorsWriter(partial / "model.safetensors", header_bound(planned)) as writer, bar:
            for key, tensor in stream_bf16_expert(source, device, None, staging):
                if tuple(tensor.shape) != expected[key]:
                    raise CheckpointError(
                        f"{source}: {key} has shape {tuple(tensor.shape)}, config.json says {expected[key]}"
                    )
                bar.update(tensor.numel() * tensor.element_size())
                if is_quantized(key):
                    owner = key[: -len(".weight")]
                    for part, value in quantize_weight(tensor.to(torch.bfloat16), BLOCKSIZE).items():
                        writer.add(f"{owner}.{part}", value)
                    quantized += 1
                else:
                    writer.add(key, tensor.to(torch.bfloat16) if tensor.dtype.is_floating_point else tensor)
                del tensor
        atomic.replace_dir(partial, target, overwrite=True)  # fsynced, then swapped in whole
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {
        "seconds": time.perf_counter() - start,
        "source_bytes": total_bytes,
        "target_bytes": (target / "model.safetensors").stat().st_size,
        "quantized_layers": quantized,
    }


def _link_or_copy(source: Path, target: Path) -> str:
    if target.exists() and os.path.samefile(source, target):
        return "already there"
    with atomic.atomic_path(target) as partial:
        try:
            os.link(source, partial)
            how = "hard-linked"
        except OSError:  # another filesystem, or links not allowed: a streamed copy (no RAM cost)
            shutil.copyfile(source, partial)
            how = "copied"
    return how


def _source_layout(source: Path) -> tuple[dict[str, Path], Path | None]:
    """The original-release expert folders and the tokenizer folder of `source`, or a clear error."""
    if not source.is_dir():
        raise InputError(f"{source}: no such folder (pass the original bf16 release, e.g. lingbot-world-base-cam/)")
    experts = {name: source / f"{name}_noise_model" for name in EXPERTS}
    v2 = {f.dit_dirs[0]: source / f.dit_dirs[0] for f in V2_FAMILIES if (source / f.dit_dirs[0]).is_dir()}
    if (source / FAST_DIR).is_dir() or v2:  # LingBot-World-Fast or a 2.0 download: the experts may be absent
        if not any(folder.is_dir() for folder in experts.values()):
            experts = {}  # a folder holding only the Fast DiT or a 2.0 model (and the shared parts)
        if (source / FAST_DIR).is_dir():
            experts[FAST] = source / FAST_DIR
        experts.update(v2)
    for name, folder in experts.items():
        if not folder.is_dir():
            nf4 = source / f"{name}_noise_model_bnb_nf4"
            hint = " (this folder is already in the NF4 layout)" if nf4.is_dir() else ""
            raise InputError(f"{source}: {folder.name}/ is missing{hint}; quantize needs the original bf16 release")
        if expert_kind(folder) != "bf16":
            raise InputError(
                f"{folder}: no diffusion_pytorch_model*.safetensors shards; not an original-release expert"
            )
        if not (folder / "config.json").exists():
            raise CheckpointError(f"{folder}: config.json is missing; re-download this expert")
    tokenizer = next(
        (source / d for d in ("google/umt5-xxl", "tokenizer") if (source / d / "tokenizer.json").exists()), None
    )
    if v2 and set(experts) == set(v2) and tokenizer is None and not (source / T5_FILE).exists():
        return experts, None  # a 2.0 1.3B download: its DiT alone (its shared parts are the 14B folder's)
    for name in (T5_FILE, VAE_FILE):
        if not (source / name).exists():
            raise CheckpointError(f"{source}: {name} is missing; download it into this folder")
    if tokenizer is None:
        raise CheckpointError(
            f"{source}: no tokenizer (looked for google/umt5-xxl/tokenizer.json, tokenizer/tokenizer.json)"
        )
    return experts, tokenizer


def _nf4_folder(name: str) -> str:
    """Where an expert's NF4 conversion goes: the layout `contracts.checkpoint_layout` reads."""
    if name == FAST:
        return FAST_NF4_DIR
    v2 = next((f for f in V2_FAMILIES if f.dit_dirs[0] == name), None)
    return v2.dit_dirs[1] if v2 else f"{name}_noise_model_bnb_nf4"


def quantize_checkpoint(
    source: Path, target: Path, device: torch.device, force: bool = False, show_progress: bool = True
) -> list[str]:
    """The whole release -> the NF4 layout in `target`; returns one line per thing done."""
    experts, tokenizer = _source_layout(source)
    outputs = {name: target / _nf4_folder(name) for name in experts}
    existing = [p.name for p in outputs.values() if p.exists()]
    if existing and not force:
        raise InputError(f"{target}: {', '.join(existing)} already exist; pass --force to replace them")
    target.mkdir(parents=True, exist_ok=True)
    report = []
    for name in experts:
        stats = quantize_expert(experts[name], outputs[name], device, show_progress)
        report.append(
            f"{outputs[name].name}/model.safetensors: {stats['quantized_layers']} NF4 layers, "
            f"{stats['source_bytes'] / 2**30:.2f} -> {stats['target_bytes'] / 2**30:.2f} GiB in {stats['seconds']:.0f} s"
        )
    for name in (T5_FILE, VAE_FILE, *OPTIONAL_CONFIGS):
        if (source / name).exists():
            report.append(f"{name}: {_link_or_copy(source / name, target / name)}")
    if tokenizer is None:  # a 2.0 1.3B download: nothing beside its DiT
        return report
    tokenizer_target = target / "tokenizer"
    tokenizer_target.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            _link_or_copy(tokenizer / name, tokenizer_target / name)
    report.append(f"tokenizer: {tokenizer.relative_to(source)}/ -> tokenizer/")
    return report
