"""The LingBot-World model families a user downloads, in one table (`FAMILIES`): for each, how its
checkpoint folder is recognised, which engine runs it (the `model` setting), its chunk loop's
constants, its default preset in config/generation.toml, and the names `doctor` and the rollout
record give it. Adding a family is a row here, its layout rule in `contracts.checkpoint_layout` and,
if its loop is new, its pipeline in worldgen (`worldgen.pipelines.loader` maps `engine` to it).

Families (facts from the reference code: ../shared/docs/lingbot-*-reference.md):
- v1-base: LingBot-World, two 14B experts, 70 guided steps (engine `base`);
- v1-fast: LingBot-World-Fast, one causal 14B DiT, chunks of 3 latent frames, 4 steps
  [0, 179, 358, 679] of the shifted schedule (engine `fast`);
- v2-causal-fast: LingBot-World 2.0's causal-fast models, 14B and 1.3B (its size from config.json),
  the v1 Fast loop with chunks of 4 latent frames and steps [0, 250, 500, 750]; its window
  (`local_attn_size`) sizes a KV cache that rolls keeping `sink_size` frames (engine `fast`);
- v2-causal-pretrain: LingBot-World 2.0's 14B causal-pretrain, 40 UniPC steps a chunk with guidance
  (a conditional and an unconditional KV cache) (engine `causal`).
Numpy-free and torch-free: the Isaac side and `doctor` read it without the engine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from contracts.errors import CheckpointError

MODELS = ("base", "fast", "causal")  # the `model` setting: which engine (loop) a job runs


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str  # what `doctor`, the worker's health and the rollout record call it
    title: str  # what a user reads
    engine: str  # the `model` setting that runs it (MODELS)
    dit_dirs: tuple[str, ...]  # its DiT's folder in the download, then its NF4 conversion (`quantize`)
    preset: str  # its reference defaults: a [preset] of config/generation.toml
    chunk_frames: int = 0  # latent frames a chunk (causal engines)
    timestep_indices: tuple[int, ...] = ()  # engine fast: the steps, as indices of the 1000-step schedule
    # attention_frames sizes a KV cache that rolls keeping sink_frames (v2's local_attn_size / sink_size);
    # False: it is v1 Fast's max_attention_size, a window read from the whole video's cache (no sink)
    window_keeps_sink: bool = False
    guidance_steps: int = 0  # engine causal: UniPC steps a chunk, each a conditional and an unconditional pass
    guide_scale: float = 0.0  # engine causal: hard-coded by the reference
    shared_parts_elsewhere: bool = False  # its download may lack umT5, VAE and tokenizer (--assets-dir)
    # settings a job may not set for it (v1's, which its loop has no use for): refused before anything loads
    unused_settings: tuple[str, ...] = ()

    def unused_in(self, given: dict) -> str | None:
        """Why a job's explicitly given settings cannot apply to this family (naming each and the fix), or
        None; the caller refuses the job with it (a SettingsError: contracts.settings imports this module)."""
        unused = [name for name in self.unused_settings if name in given]
        if not unused:
            return None
        return (
            f"{', '.join(unused)}: not used by {self.title} (a v1 setting: its loop is fixed by the model); "
            f"leave {'them' if len(unused) > 1 else 'it'} out"
        )


V1_BASE = ModelFamily(
    "v1-base",
    "LingBot-World base (two 14B experts, guided)",
    "base",
    ("high_noise_model", "high_noise_model_bnb_nf4"),
    "default",
)
V1_FAST = ModelFamily(
    "v1-fast",
    "LingBot-World-Fast (causal 14B, 3-frame chunks)",
    "fast",
    ("lingbot_world_fast", "lingbot_world_fast_bnb_nf4"),
    "default",
    chunk_frames=3,
    timestep_indices=(0, 179, 358, 679),
)
V2_FAST = ModelFamily(
    "v2-causal-fast",
    "LingBot-World 2.0 causal-fast (4-frame chunks)",
    "fast",
    ("transformers", "transformers_bnb_nf4"),
    "v2-fast",
    chunk_frames=4,
    timestep_indices=(0, 250, 500, 750),
    window_keeps_sink=True,
    shared_parts_elsewhere=True,  # the 1.3B download holds its DiT alone
    unused_settings=("steps", "guide_scale", "boundary", "negative_prompt"),  # 4 distilled steps, no guidance
)
V2_PRETRAIN = ModelFamily(
    "v2-causal-pretrain",
    "LingBot-World 2.0 causal-pretrain (guided, 40 steps a chunk)",
    "causal",
    ("transformer_causal", "transformer_causal_bnb_nf4"),
    "v2-pretrain",
    chunk_frames=4,
    window_keeps_sink=True,
    guidance_steps=40,
    guide_scale=5.0,
    shared_parts_elsewhere=True,
    unused_settings=("boundary",),  # one DiT: no expert switch
)
FAMILIES = (V1_BASE, V1_FAST, V2_FAST, V2_PRETRAIN)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}
V2_FAMILIES = (V2_FAST, V2_PRETRAIN)


def families_in(root: Path) -> list[ModelFamily]:
    """The families whose DiT folder `root` holds (or is), v2 first: from folder names alone."""
    root = Path(root).expanduser()
    found = []
    for family in (*V2_FAMILIES, V1_FAST, V1_BASE):
        if root.name in family.dit_dirs or any((root / d).is_dir() for d in family.dit_dirs):
            found.append(family)
    return found


def family_for(root: Path | str, engine: str) -> ModelFamily:
    """The family an `engine` runs from the folder `root`: a v2 folder's own, else v1's (the v1 layouts'
    own errors then say what is missing). An engine the folder's v2 model cannot run is a
    CheckpointError naming the engine it can."""
    root = Path(root).expanduser()
    present = [f for f in families_in(root) if f in V2_FAMILIES] if root.is_dir() else []
    for family in present:
        if family.engine == engine:
            return family
    if present:
        have = ", ".join(f"{f.title} (--model {f.engine})" for f in present)
        raise CheckpointError(f"{root} holds {have}: it has no model for --model {engine}")
    return V1_FAST if engine == "fast" else V1_BASE


def dit_size(config_file: Path) -> str:
    """The DiT's size as the releases name it ("14B", "1.3B"), from its config.json's shape."""
    try:
        config = json.loads(Path(config_file).read_text())
        dim, layers = int(config["dim"]), int(config["num_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown size"
    return {(5120, 40): "14B", (1536, 30): "1.3B"}.get((dim, layers), f"dim {dim}, {layers} layers")


TINY_PRESETS = {"tiny-v2": "tiny-v2"}  # a built-in tiny model's preset ([tiny] for the others)


def preset_for(ckpt: str | Path, engine: str | None) -> str:
    """The preset a server, `generate` or `demo` puts under a job's settings when none is named: a built-in
    tiny model's ([tiny], [tiny-v2]), a LingBot-World 2.0 folder's family's (its reference defaults, which
    name its engine), else [default] (v1's reference defaults). `engine` None: the folder's first 2.0 model."""
    if str(ckpt).startswith("tiny"):
        return TINY_PRESETS.get(str(ckpt), "tiny")
    try:
        if engine is None:
            v2 = [f for f in families_in(Path(ckpt)) if f in V2_FAMILIES] if Path(ckpt).expanduser().is_dir() else []
            return v2[0].preset if v2 else "default"
        return family_for(ckpt, engine).preset
    except CheckpointError:  # the folder's own check says what is wrong, where it loads
        return "default"
