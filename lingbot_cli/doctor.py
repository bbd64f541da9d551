"""Check the installation: Python packages, the GPU, and (with --ckpt-dir) a checkpoint folder.

Prints one line per check and exits 1 when something the generation side needs is missing.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import warnings
from pathlib import Path

PACKAGES = {  # module -> (what needs it, required for generation)
    "numpy": ("everything", True),
    "zmq": ("bridge (pyzmq)", True),
    "msgpack": ("bridge", True),
    "torch": ("worldgen (generation side only)", True),
    "safetensors": ("worldgen checkpoints", True),
    "tokenizers": ("worldgen text encoder", True),
    "bitsandbytes": ("quantize to NF4 (reading NF4 checkpoints does not need it)", False),
    "ftfy": ("worldgen prompt cleaning", True),
    "imageio_ffmpeg": ("mp4 output", True),
    "scipy": ("camera interpolation", True),
    "cv2": ("comparison (opencv-python-headless)", False),
    "pxr": ("USD stages outside Isaac Sim (usd-core)", False),
    "h5py": ("replay of HDF5 recordings", False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ckpt-dir",
        type=Path,
        help="also check this checkpoint folder's layout and name its model family, size and variant ('tiny', "
        "'tiny-v2': the built-in tiny models)",
    )
    parser.add_argument(
        "--assets-dir", type=Path, help="a LingBot-World 2.0 1.3B's umT5, VAE and tokenizer (as generate)"
    )


def run(args: argparse.Namespace) -> int:
    from worldgen.quiet import hide_known_harmless

    hide_known_harmless()  # before importing bitsandbytes below: its harmless CPU-kernel notice is not a finding
    failed = False
    print(f"python {platform.python_version()} on {platform.platform()}")
    for module, (purpose, required) in PACKAGES.items():
        try:
            mod = importlib.import_module(module)
            print(f"  ok       {module:<15} {getattr(mod, '__version__', '')}  ({purpose})")
        except Exception as exc:  # an import can fail in many ways (missing CUDA libs, ...)
            failed |= required
            print(f"  {'MISSING' if required else 'optional'} {module:<15} ({purpose}): {exc}")
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            print(f"  gpu      {props.name}, {props.total_memory / 2**30:.1f} GiB, torch CUDA {torch.version.cuda}")
        else:
            print("  gpu      none visible to torch: generation runs on the CPU (fine for the tiny model only)")
        print_attention(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        from worldgen.runtime.compile_cache import cache_state

        print(f"  compile  cache {cache_state()}")
    except ImportError:
        pass
    if args.ckpt_dir:
        failed |= check_checkpoint_arg(args.ckpt_dir, args.assets_dir)
    return 1 if failed else 0


def check_checkpoint_arg(ckpt: Path, assets_dir: Path | None = None) -> bool:
    """`--ckpt-dir`: the built-in tiny model (written on first use) or a folder; True if it serves nothing."""
    try:
        from worldgen.pipelines.loader import resolve_checkpoint
    except ImportError as exc:  # no torch: the folder's layout can still be read
        if str(ckpt).startswith("tiny"):
            print(f"  ckpt     PROBLEM: the built-in tiny model needs torch ({exc})")
            return True
        return check_checkpoint(Path(ckpt), assets_dir)
    root, is_tiny = resolve_checkpoint(ckpt)
    if is_tiny:
        print(f"  ckpt     {ckpt}: the built-in tiny model (seeded random weights: its output is noise), in {root}")
    return check_checkpoint(root, assets_dir)


def print_attention(device) -> None:
    """Which attention kernels this machine runs: what --attention auto picks, and --compute fp8's."""
    from worldgen.kernels.attention import import_error, installed, resolve_backend
    from worldgen.kernels.cudnn_attention import attention_note
    from worldgen.kernels.fp8 import unsupported_reason

    if not installed("flash"):
        hint = " (pip install flash-attn-4 for FlashAttention 4 on Hopper: faster)"
    else:
        error = import_error("flash")
        hint = f" (FlashAttention is installed but does not import: {error}; reinstall it)" if error else ""
    with warnings.catch_warnings():  # the hint says it once
        warnings.simplefilter("ignore")
        auto = resolve_backend("auto")
    print(f"  attention auto = {auto}, base and Fast models{hint}")
    fp8_reason = unsupported_reason(device)
    print(f"  fp8      {fp8_reason}" if fp8_reason else f"  fp8      {attention_note(device)}")
    from worldgen.kernels.compute_choice import auto_compute

    print(f"  compute  {auto_compute(device)[1]} (--compute auto takes {auto_compute(device)[0]})")


def check_checkpoint(root: Path, assets_dir: Path | None = None) -> bool:
    """Print what the checkpoint folder serves (base experts, the Fast DiT, a LingBot-World 2.0 model: its
    family, size and variant, names from `contracts.model_families`); True if it serves nothing."""
    from contracts.checkpoint_layout import find_model
    from contracts.model_families import V2_FAMILIES, dit_size, families_in
    from worldgen.errors import CheckpointError

    v2 = [f for f in families_in(root) if f in V2_FAMILIES] if root.is_dir() else []
    if v2:  # a 2.0 download holds one model (the tiny one both): no v1 parts to look for
        served = 0
        for family in v2:
            try:
                _, layout = find_model(root, family.engine, assets_dir)
            except CheckpointError as exc:
                print(f"  {family.engine:<8} PROBLEM: {exc}")
                continue
            served += 1
            folder = layout.experts["fast"]
            print(f"  {family.engine:<8} {folder}: {family.name} ({family.title}), {dit_size(folder / 'config.json')}, "
                  f"{layout.kind} layout, umT5/VAE/tokenizer from {layout.root} (--model {family.engine}, "
                  f"--preset {family.preset})")  # fmt: skip
        return served < len(v2)
    from worldgen.runtime.checkpoint import FAST_DIR, FAST_NF4_DIR, find_checkpoint, find_fast_checkpoint

    base_ok = fast_ok = False
    try:
        layout = find_checkpoint(root)
        base_ok = True
        print(
            f"  ckpt     {layout.root}: v1-base, {layout.kind} layout, experts {sorted(layout.experts)}, "
            f"tokenizer in {layout.tokenizer_dir.relative_to(layout.root)}"
        )
    except CheckpointError as exc:
        base_problem = str(exc)
    fast_present = any((root / d).is_dir() for d in (FAST_DIR, FAST_NF4_DIR)) or root.name in (FAST_DIR, FAST_NF4_DIR)
    if fast_present:
        try:
            fast = find_fast_checkpoint(root)
            fast_ok = True
            print(f"  fast     {fast.experts['fast']}: v1-fast: LingBot-World-Fast, {fast.kind} (--model fast)")
        except CheckpointError as exc:
            print(f"  fast     PROBLEM: {exc}")
    else:
        print(f"  fast     not installed (optional): put the LingBot-World-Fast weights in {root / FAST_DIR}/ "
              "for --model fast")  # fmt: skip
    if not base_ok:
        print(f"  ckpt     {'note' if fast_ok else 'PROBLEM'}: {base_problem}"
              + (" (only --model fast can run)" if fast_ok else ""))  # fmt: skip
    return not base_ok and not fast_ok or (fast_present and not fast_ok)
