"""The bytes two of the VAE's passes moved, by arithmetic on shapes (no GPU): `torch.cat` joining each causal
convolution's past and new frames (gone where a norm writes into the joined input, `vae.JOIN_IN_PLACE`) and the
two `+=` passes summing a residual block's three time taps (gone where the reader sums them,
`vae.SUM_TAPS_IN_READER`). The full-size Wan2.1 VAE runs on the meta device at its steady state: a decode of one
latent frame and an encode push of 4 frames.

Usage:
  python bench/vae_pass_bytes.py [--size 480*832] [--bytes 4]

A join saves 2T frames of its input's channels (the cat read and wrote T + 2, the join copies the 2 past ones);
the taps' sum in the reader saves 4T frames of the output's (two `+=` read 2T and wrote T each; the reader reads
2T more). Printed per push and per 16-frame chunk, with the time those bytes take at 4 TB/s (an H200's HBM3e at a
streaming kernel's rate): an estimate, not a measurement (docs/benchmarks.md, "Session 32").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.generation_request import latent_size  # noqa: E402
from contracts.model_frame import MODEL_FRAME, MODEL_SIZE  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.models import vae as vae_module  # noqa: E402

RATE = 4e12  # bytes a second
FLOAT32_BYTES = torch.float32.itemsize


def pass_bytes(height: int, width: int, element: int) -> dict[str, tuple[float, float]]:
    """{"decode" | "encode": (join bytes, taps bytes)} saved in one steady push."""
    with torch.device("meta"):
        vae = vae_module.WanVAE()
    blocks = [m for m in vae.modules() if isinstance(m, vae_module.ResidualBlock)]
    tapped = {conv for b in blocks for conv in (b.residual[2], b.residual[6])}
    joined = tapped | {vae.encoder.head[2], vae.decoder.head[2]}
    seen: list[tuple[torch.nn.Module, tuple[int, ...]]] = []
    forward = vae_module.CausalConv3d.forward

    def noted(self, x, *args, **kwargs):
        seen.append((self, tuple(x.shape)))
        return forward(self, x, *args, **kwargs)

    def saved(push) -> tuple[float, float]:
        seen.clear()
        push()
        join = taps = 0
        for conv, (_, c_in, t, h, w) in seen:
            join += (conv in joined) * 2 * t * c_in * h * w * element
            taps += (conv in tapped) * 4 * t * conv.out_channels * h * w * element
        return join, taps

    vae_module.CausalConv3d.forward = noted
    try:
        with torch.no_grad():
            cache: dict = {}
            latent = torch.empty(1, 16, 1, height // 8, width // 8, device="meta")
            for _ in range(2):
                vae.decoder(latent, cache)
            decode = saved(lambda: vae.decoder(latent, cache))
            cache = {}
            vae.encoder(torch.empty(1, 3, 1, height, width, device="meta"), cache)
            push = torch.empty(1, 3, 4, height, width, device="meta")
            vae.encoder(push, cache)
            encode = saved(lambda: vae.encoder(push, cache))
    finally:
        vae_module.CausalConv3d.forward = forward
    return {"decode": decode, "encode": encode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size", default=MODEL_SIZE, help=f"the job's size, H*W (default {MODEL_SIZE}: 464x832 frames)"
    )
    parser.add_argument(
        "--bytes", type=int, choices=(4, 2), default=FLOAT32_BYTES, help="bytes an element: 4 float32, 2 bf16"
    )
    args = parser.parse_args()
    lat_h, lat_w = latent_size(MODEL_FRAME, GenerationSettings(size=args.size).max_area)  # a model-frame image's
    height, width = 8 * lat_h, 8 * lat_w
    for half, (join, taps) in pass_bytes(height, width, args.bytes).items():
        taps = (
            taps if args.bytes == FLOAT32_BYTES else 0.0
        )  # the time taps run in float32 only (`vae.TIME_TAPS_DTYPES`)
        chunk = 4 * (join + taps)  # a 16-frame chunk: 4 latent frames decoded, 4 pushes of 4 frames encoded
        print(f"{half}: a push saves {join / 1e9:.1f} GB (join) + {taps / 1e9:.1f} GB (taps in the reader); "
              f"a 16-frame chunk {chunk / 1e9:.0f} GB, {1e3 * chunk / RATE:.0f} ms at {RATE / 1e12:g} TB/s")  # fmt: skip


if __name__ == "__main__":
    main()
