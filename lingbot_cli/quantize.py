"""Convert the original bf16 release into the community NF4 layout, one tensor at a time.

  lingbot-isaac quantize ~/models/lingbot-world-base-cam                 # -> lingbot-world-base-cam-nf4
  lingbot-isaac quantize ~/models/lingbot-world-base-cam /fast/ssd/lingbot-nf4 --device cpu

The command line of `worldgen.runtime.quantize` (which says how it works); torch and bitsandbytes are
imported only when it runs, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from worldgen.errors import InputError

USER_ERRORS = (InputError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument("source", type=Path, help="the original bf16 release folder (high_noise_model/, ...)")
    parser.add_argument(
        "target", type=Path, nargs="?", help="output folder (default: SOURCE-nf4 beside it; may be SOURCE itself)"
    )
    parser.add_argument("--device", help="where to quantize: cuda, cuda:1 or cpu (default: cuda when available)")
    parser.add_argument("--force", action="store_true", help="replace NF4 experts already in the output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import torch

    from worldgen.runtime.metering import peak_rss_gib
    from worldgen.runtime.quantize import quantize_checkpoint

    source = args.source.expanduser()
    target = (args.target or source.with_name(source.name.rstrip("/") + "-nf4")).expanduser()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA GPU is visible to PyTorch; use --device cpu")
    for line in quantize_checkpoint(source, target, device, args.force, not args.quiet):
        print(line)
    rss = peak_rss_gib()
    print(f"NF4 checkpoint ready: {target}" + ("" if rss is None else f" (peak RSS {rss:.2f} GiB)"))
    return 0
