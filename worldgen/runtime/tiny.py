"""The built-in `tiny` model: seeded random weights in the real checkpoint layouts, made on first use.

It exercises every code path (tokenizer, T5, VAE, both experts, camera layers, NF4 and bf16
loading) on a CPU in seconds with no download. Its weights are random: ITS OUTPUT IS NOISE.
Written once to `$LINGBOT_ISAAC_CACHE/tiny-v1/{bf16,nf4}` (default `~/.cache/lingbot-isaac`),
atomically (a temporary folder renamed into place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save

from contracts import atomic
from worldgen.kernels.nf4 import quantize_weight
from worldgen.models.dit import Linear, WanCameraDiT
from worldgen.models.dit_config import DiTConfig
from worldgen.runtime.checkpoint import FAST_DIR, FAST_NF4_DIR, INDEX_FILE, T5_FILE, VAE_FILE

VERSION = "tiny-v1"
NOISE_NOTE = "the tiny model has random weights: its output is noise, not a prediction"
SEED = 20260101
FAST_SEED = 20260407  # the tiny Fast DiT's weights (made on first use of --model fast)
V2_SEED = 20261128  # the tiny LingBot-World 2.0 DiTs' weights (`tiny-v2`)
DIT = DiTConfig(text_len=512, dim=64, ffn_dim=128, freq_dim=32, text_dim=32, num_heads=4, num_layers=2)
# `tiny-v2`'s DiTs: another shape than DIT's, as the 1.3B's differs from the 14B's (every size comes from config.json)
V2_DIT = dataclasses.replace(DIT, dim=48, ffn_dim=96, num_heads=3, num_layers=3)
T5 = {"vocab": 100, "dim": 32, "dim_attn": 32, "dim_ffn": 64, "num_heads": 4, "num_layers": 2,
      "num_buckets": 32, "shared_pos": False, "dropout": 0.0}  # fmt: skip
VAE_OVERRIDES = {"dim": 8, "num_res_blocks": 1}


def cache_root() -> Path:
    """Where the project caches what it can rebuild (tiny checkpoints, prompt embeddings)."""
    return Path(os.environ.get("LINGBOT_ISAAC_CACHE") or Path.home() / ".cache" / "lingbot-isaac")


def _random_state(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Seeded weights with a sane scale (so activations stay finite through every layer)."""
    state = {}
    for name, tensor in module.state_dict().items():
        if name.endswith("bias"):
            value = torch.randn(tensor.shape, generator=generator) * 0.02
        elif "norm" in name or name.endswith("gamma"):
            value = 1.0 + 0.05 * torch.randn(tensor.shape, generator=generator)
        else:
            fan_in = max(1, tensor[0].numel()) if tensor.ndim > 1 else tensor.numel()
            value = torch.randn(tensor.shape, generator=generator) / fan_in**0.5
        state[name] = value.contiguous()
    return state


def _write_expert_bf16(
    folder: Path, state: dict[str, torch.Tensor], class_name: str = "WanModel", config: DiTConfig = DIT
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"_class_name": class_name, **dataclasses.asdict(config)}, indent=1))
    keys = sorted(state)
    halves = (keys[: len(keys) // 2], keys[len(keys) // 2 :])
    weight_map = {}
    for i, part in enumerate(halves, start=1):
        shard = f"diffusion_pytorch_model-{i:05d}-of-{len(halves):05d}.safetensors"
        (folder / shard).write_bytes(save({k: state[k].to(torch.bfloat16) for k in part}))  # umask mode
        weight_map.update({k: shard for k in part})
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def _write_expert_nf4(folder: Path, state: dict[str, torch.Tensor], model: WanCameraDiT) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dataclasses.asdict(DIT), indent=1))
    meta = {"quant": {"format": "bnb_nf4", "quant_type": "nf4", "double_quant": True,
                      "compute_dtype": "bfloat16", "blocksize": 64}}  # fmt: skip
    (folder / "quantization_meta.json").write_text(json.dumps(meta, indent=1))
    linears = {name for name, m in model.named_modules() if isinstance(m, Linear)}
    out = {}
    for key, value in state.items():
        owner = key.rpartition(".")[0]
        if owner in linears and key.endswith(".weight"):
            out.update({f"{owner}.{k}": v for k, v in quantize_weight(value.to(torch.bfloat16)).items()})
        else:
            out[key] = value.to(torch.bfloat16)
    (folder / "model.safetensors").write_bytes(save(out))  # not save_file: it makes 0600 files


def _write_shared_parts(root: Path, generator: torch.Generator, tokenizer_dir: str) -> None:
    from worldgen.models.t5 import T5Config, UMT5Encoder
    from worldgen.models.tokenizer import build_tiny_tokenizer
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE

    (root / "t5_config.json").write_text(json.dumps(T5, indent=1))
    t5 = UMT5Encoder(T5Config(**T5))
    torch.save({k: v.to(torch.bfloat16) for k, v in _random_state(t5, generator).items()}, root / T5_FILE)
    vae_config = dataclasses.replace(WAN21_VAE, **VAE_OVERRIDES)
    (root / "vae_config.json").write_text(json.dumps(dataclasses.asdict(vae_config), indent=1))
    torch.save(_random_state(WanVAE(vae_config), generator), root / VAE_FILE)
    (root / tokenizer_dir).mkdir(parents=True)
    build_tiny_tokenizer(T5["vocab"]).save(str(root / tokenizer_dir / "tokenizer.json"))
    (root / "README.txt").write_text(f"lingbot-isaac built-in tiny model ({VERSION}): {NOISE_NOTE}.\n")


@contextlib.contextmanager
def _built_once(target: Path, marker: str) -> Iterator[Path]:
    """A staging folder to build `target` in, renamed into place when the block ends. Several
    processes may build it at once: the first rename wins and the others drop theirs (`marker`, a
    file of the finished folder, tells that it was won, not lost)."""
    staging = atomic.staging_dir(target)  # not mkdtemp: the folder keeps the umask's mode, not 0700
    try:
        yield staging
        try:
            atomic.replace_dir(staging, target)
        except OSError:  # another process finished first (FileExistsError, or ENOTEMPTY in a race)
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_tiny_checkpoint(kind: str = "bf16") -> Path:
    """Path of the tiny checkpoint in the `bf16` (original) or `nf4` (community) layout; made once."""
    if kind not in ("bf16", "nf4"):
        raise ValueError(f"kind must be 'bf16' or 'nf4', not {kind!r}")
    target = cache_root() / VERSION / kind
    if (target / "README.txt").exists():
        return target
    with _built_once(target, "README.txt") as tmp:
        generator = torch.Generator().manual_seed(SEED)
        model = WanCameraDiT(DIT)
        for expert in ("high", "low"):
            state = _random_state(model, generator)
            if kind == "bf16":
                _write_expert_bf16(tmp / f"{expert}_noise_model", state)
            else:
                _write_expert_nf4(tmp / f"{expert}_noise_model_bnb_nf4", state, model)
        _write_shared_parts(tmp, generator, "google/umt5-xxl" if kind == "bf16" else "tokenizer")
    return target


def ensure_tiny_fast(root: Path) -> Path:
    """Add a tiny LingBot-World-Fast DiT to a tiny checkpoint folder (once): `lingbot_world_fast/`
    beside bf16 experts, `lingbot_world_fast_bnb_nf4/` beside NF4 ones, as the real layouts have it."""
    nf4 = (root / "high_noise_model_bnb_nf4").is_dir()
    target = root / (FAST_NF4_DIR if nf4 else FAST_DIR)
    if (target / "config.json").exists():
        return target
    with _built_once(target, "config.json") as tmp:
        model = WanCameraDiT(DIT)
        state = _random_state(model, torch.Generator().manual_seed(FAST_SEED))
        if nf4:
            _write_expert_nf4(tmp, state, model)
        else:
            _write_expert_bf16(tmp, state, class_name="WanModelFast")
    return target


def ensure_tiny_v2() -> Path:
    """The tiny LingBot-World 2.0 download (`tiny-v2`), made once: `transformers/` (causal-fast) and
    `transformer_causal/` (causal-pretrain) in the diffusers layout, with umT5, VAE and tokenizer beside
    them (a real download holds one of the two DiTs; the tiny one serves --model fast and causal)."""
    target = cache_root() / VERSION / "v2"
    if (target / "README.txt").exists():
        return target
    from contracts.model_families import V2_FAST, V2_PRETRAIN

    with _built_once(target, "README.txt") as tmp:
        generator = torch.Generator().manual_seed(V2_SEED)
        model = WanCameraDiT(V2_DIT)
        for folder, class_name in ((V2_FAST.dit_dirs[0], "WanModelFast"), (V2_PRETRAIN.dit_dirs[0], "WanModelCausal")):
            _write_expert_bf16(tmp / folder, _random_state(model, generator), class_name, V2_DIT)
        _write_shared_parts(tmp, generator, "google/umt5-xxl")
    return target
