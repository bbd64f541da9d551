"""The host memory a parked decoder cut takes (`worldgen.models.vae_tiling._Streaming.park`): its caches' bytes, the
pinned memory every tile's took one block a tensor (Session 31's code: PyTorch's host allocator rounds each block up
to a power of two), and what it takes now: every tile's but the one on the device, packed by
`worldgen.host_slab.HostSlab`. Arithmetic on shapes, no GPU: the full-size Wan2.1 decoder runs on the meta device
over a few latent frames of each tile, so every cache holds its steady 2 frames.

Usage:
  python bench/parked_host_memory.py [--size 480*832] [--dtype bfloat16] [--json OUT]

Prints one row per parked cut the plan can choose (`fast_plan.stream_vae_cuts(..., parked=True)`): tiles, tile
shape, caches (GiB), every tile's one pinned block a tensor (GiB), all tiles' but one packed (GiB). The 1.3B under `--vram-budget 8` parks two
464x464 strips (fp8, int8) or eight tiles (exact): docs/benchmarks.md, "Session 32".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts import atomic  # noqa: E402
from contracts.generation_request import latent_size  # noqa: E402
from contracts.model_frame import MODEL_FRAME, MODEL_SIZE  # noqa: E402
from contracts.settings import GenerationSettings  # noqa: E402
from worldgen.host_slab import pack  # noqa: E402
from worldgen.models.vae import WanVAE  # noqa: E402
from worldgen.models.vae_tiling import TILE_OVERLAP, streamed_tiles, tile_shape  # noqa: E402
from worldgen.pipelines.fast_plan import stream_vae_cuts  # noqa: E402

GiB = 2**30


def decoder_cache_sizes(latent_h: int, latent_w: int, dtype: torch.dtype = torch.bfloat16) -> list[int]:
    """Bytes of each causal cache the full-size decoder keeps for a `latent_h` x `latent_w` tile, steady (2 frames)."""
    with torch.device("meta"):
        vae = WanVAE().to(dtype)
    cache: dict = {}
    latent = torch.empty(1, vae.config.z_dim, 1, latent_h, latent_w, device="meta", dtype=dtype)
    with torch.no_grad():
        for _ in range(3):  # frame 0 alone, then doubled frames: every cache fills to its 2 frames
            vae.decoder(latent, cache)
    return [t.numel() * t.element_size() for t in cache.values() if isinstance(t, torch.Tensor)]


def one_block_a_tensor(sizes: list[int]) -> int:
    """The pinned bytes of one block a tensor, each rounded up to a power of two as PyTorch's host allocator does."""
    return sum(1 << (n - 1).bit_length() for n in sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size", default=MODEL_SIZE, help=f"the job's size, H*W (default {MODEL_SIZE}: 464x832 frames)"
    )
    parser.add_argument("--dtype", default="bfloat16", help="the VAE's dtype (a parked cut runs in bfloat16)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    lat_h, lat_w = latent_size(MODEL_FRAME, GenerationSettings(size=args.size).max_area)  # a model-frame image's
    height, width = 8 * lat_h, 8 * lat_w
    dtype = getattr(torch, args.dtype)
    rows = []
    for cut in stream_vae_cuts(height, width, parked=True):
        latent = (height // 8, width // 8)
        tile = latent if cut.tile_pixels is None else tile_shape(*latent, cut.tile_pixels // 64, 1, TILE_OVERLAP // 8)
        tiles = streamed_tiles(height, width, cut.tile_pixels)[2]
        sizes = decoder_cache_sizes(*tile, dtype)
        blocks, _ = pack(sizes)
        row = {
            "tiles": tiles,
            "tile_latent": list(tile),
            "caches_gib": tiles * sum(sizes) / GiB,
            "one_block_a_tensor_gib": tiles * one_block_a_tensor(sizes) / GiB,
            "packed_gib": tiles * sum(blocks) / GiB,  # every tile's, packed
            "parked_now_gib": (tiles - 1) * sum(blocks) / GiB,  # every tile's but the one on the device
            "blocks_mib": [b >> 20 for b in blocks],
        }
        rows.append(row)
        print(f"{tiles:3d} tiles of {tile[0]}x{tile[1]} latent pixels: caches {row['caches_gib']:.2f} GiB, "
              f"one pinned block a tensor {row['one_block_a_tensor_gib']:.2f} GiB, now {row['parked_now_gib']:.2f} "
              f"GiB (all tiles but one, packed: blocks a tile, MiB: {row['blocks_mib']})")  # fmt: skip
    if args.json:
        atomic.write_text(args.json, json.dumps({"size": args.size, "dtype": args.dtype, "cuts": rows}, indent=1))


if __name__ == "__main__":
    main()
