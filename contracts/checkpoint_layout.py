"""The checkpoint layouts users download, recognised from the folder alone (no torch, no weights read).

Layouts (see docs/checkpoints.md):
- original bf16 release: `high_noise_model/`, `low_noise_model/` (sharded safetensors + index.json);
- community NF4 release: `high_noise_model_bnb_nf4/`, `low_noise_model_bnb_nf4/` (`model.safetensors`
  or legacy `model.pt`, every Linear serialised as bitsandbytes' NF4);
- both: `models_t5_umt5-xxl-enc-bf16.pth`, `Wan2.1_VAE.pth`, tokenizer in `google/umt5-xxl/` or
  `tokenizer/`;
- LingBot-World-Fast: `lingbot_world_fast/` (or `lingbot_world_fast_bnb_nf4/`) inside the base folder;
- LingBot-World 2.0: one DiT a download, `transformers/` (causal-fast, 14B or 1.3B) or
  `transformer_causal/` (causal-pretrain) in the diffusers layout (or their `_bnb_nf4` conversions),
  umT5, VAE and tokenizer beside it, except in the 1.3B's download: those come from `--assets-dir` or a
  sibling folder that has them (the 14B's), as the reference's `--assets_dir` does.
Which family a folder holds: `contracts.model_families`.

The one home of these rules: the engine loads what `find_checkpoint` / `find_fast_checkpoint` found
(`worldgen.runtime.checkpoint`), and `check_checkpoint` is what `generate`, `serve` and `demo` run
before anything starts, so a typo'd or half-downloaded folder costs a second and one message, the
same one everywhere.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from contracts import model_families
from contracts.errors import CheckpointError

# the built-in random-weights models (made on first use): LingBot-World 1 (base and Fast), and 2.0 (`tiny-v2`)
TINY_V2_CHECKPOINTS = ("tiny-v2",)
TINY_CHECKPOINTS = ("tiny", "tiny-bf16", "tiny-nf4", *TINY_V2_CHECKPOINTS)


def check_checkpoint(ckpt: str | Path, model: str | None = "base", assets_dir: str | Path | None = None) -> None:
    """Raise CheckpointError (the message `generate` prints) unless `ckpt` is the built-in tiny model
    or a folder of the layout `model` loads (`find_model`)."""
    if str(ckpt) in TINY_CHECKPOINTS:
        return
    find_model(ckpt, model or "base", assets_dir)


def find_model(
    root: Path | str, engine: str, assets_dir: str | Path | None = None
) -> tuple[model_families.ModelFamily, CheckpointLayout]:
    """(the family, its layout) that `engine` (the `model` setting) runs from `root`: a LingBot-World
    2.0 folder's own model, else v1's two experts ("base") or the Fast folder ("fast")."""
    family = model_families.family_for(root, engine)
    if family in model_families.V2_FAMILIES:
        return family, find_v2_checkpoint(root, family, assets_dir)
    if engine == "causal":
        raise CheckpointError(
            f"{root}: --model causal runs LingBot-World 2.0's causal-pretrain model: expected "
            f"{model_families.V2_PRETRAIN.dit_dirs[0]}/ in this folder"
        )
    if engine == "fast":
        return family, find_fast_checkpoint(root)
    return family, find_checkpoint(root)


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
    kind = _checked_dit(folder, "Fast model")
    try:
        return _with_shared_parts(base, kind, {"fast": folder})
    except CheckpointError as exc:
        if base == root:
            raise
        raise CheckpointError(
            f"{exc}; the Fast model uses the base checkpoint's umT5, VAE and tokenizer: put {folder.name}/ "
            "inside the lingbot-world-base-cam folder and pass that folder"
        ) from None


def _checked_dit(folder: Path, what: str) -> str:
    """One DiT folder's kind ("bf16" or "nf4") once its config, shards or quantization meta are all there."""
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder}: config.json is missing; re-download the {what}")
    kind = expert_kind(folder)
    if kind == "bf16":
        _check_shards(folder)
    elif not (folder / "quantization_meta.json").exists():
        raise CheckpointError(f"{folder}: quantization_meta.json is missing; this is not a complete NF4 model")
    return kind


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


def find_v2_checkpoint(
    root: Path | str, family: model_families.ModelFamily, assets_dir: str | Path | None = None
) -> CheckpointLayout:
    """A LingBot-World 2.0 download (`root` holds `family`'s DiT folder, or is it): the DiT (its NF4
    conversion preferred), then umT5, VAE and tokenizer from `assets_dir`, the download itself, or a
    sibling download that has them (the 1.3B's come from the 14B's); the error says where it looked."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint folder {root} does not exist (pass --ckpt-dir, or 'tiny' for the built-in model)"
        )
    if root.name in family.dit_dirs:
        folder, download = root, root.parent
    else:
        folder = next((root / d for d in reversed(family.dit_dirs) if (root / d).is_dir()), None)
        if folder is None:
            raise CheckpointError(f"{root}: expected {family.dit_dirs[0]}/ ({family.title})")
        download = root
    kind = _checked_dit(folder, f"{family.title} model")
    places = [Path(assets_dir).expanduser()] if assets_dir else []
    places.append(download)
    if download.parent.is_dir():  # the other downloads beside this one (the 14B's, for the 1.3B)
        places += sorted(
            p for p in download.parent.iterdir() if p.is_dir() and p != download and (p / T5_FILE).exists()
        )
    for place in places:
        try:  # root: where the shared parts are (as for v1 Fast: the base folder whose parts it uses)
            return _with_shared_parts(place, kind, {"fast": folder})  # both causal engines: one DiT, one slot
        except CheckpointError:
            continue
    looked = ", ".join(str(p) for p in places)
    if assets_dir and not Path(assets_dir).expanduser().is_dir():
        raise CheckpointError(
            f"--assets-dir {assets_dir} does not exist (it holds {T5_FILE}, {VAE_FILE}, google/umt5-xxl/)"
        )
    raise CheckpointError(
        f"{download}: {T5_FILE}, {VAE_FILE} and google/umt5-xxl/tokenizer.json were not found together (looked in "
        f"{looked}); the 1.3B download holds its DiT alone: pass --assets-dir with the 14B causal-fast folder, "
        "or put that folder beside this one"
    )
