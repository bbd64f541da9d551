"""The Wan VAE over spatial tiles, whole or streamed a few frames at a time (`worldgen.models.vae`'s network).

When a whole frame does not fit the memory budget, the video is cut into overlapping spatial
tiles, each run through every chunk with its own frame cache, and blended back with linear ramps
across the overlaps. The decoder's middle attention sees one tile instead of the whole frame, so
tiled output differs slightly from the reference; whole frames are used whenever they fit.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable

import torch

from worldgen.errors import InputError
from worldgen.host_slab import HostSlab
from worldgen.models.vae import FrameCache, WanVAE, still_after, watch_stillness


def tile_starts(size: int, tile: int, overlap: int) -> list[int]:
    """Starts of tiles of length `tile` covering [0, size), neighbours overlapping by >= `overlap`."""
    if tile >= size:
        return [0]
    stride = tile - overlap
    count = -(-(size - tile) // stride) + 1
    return [round(i * (size - tile) / (count - 1)) for i in range(count)]


def _ramp(length: int, start: int, tile: int, size: int, overlap: int, device) -> torch.Tensor:
    """Blend weights along one axis of a tile: rising over the overlap with a left/top neighbour, falling
    over the overlap with a right/bottom one, 1 elsewhere (and at the frame's own borders)."""
    weight = torch.ones(length, device=device)
    ramp = torch.arange(1, overlap + 1, device=device, dtype=torch.float32) / (overlap + 1)
    if start > 0:
        weight[:overlap] = ramp
    if start + tile < size:
        weight[-overlap:] = ramp.flip(0)
    return weight


MAX_GRID = 16  # tiles along either axis at most
TILE_OVERLAP = 64  # pixels neighbouring tiles blend over, where the tiles are large enough (`tile_overlap`)


def tile_overlap(tile_hw: tuple[int, int], overlap: int, unit: int) -> int:
    """The overlap neighbouring tiles of `tile_hw` blend over: the one asked, at most a quarter of the tile's shorter
    side, a multiple of `unit` and one unit at least (in the frame's pixels, as `_tiled` takes it)."""
    return max(unit, min(overlap, min(tile_hw) // 4) // unit * unit)


def tile_shape(height: int, width: int, max_pixels: int, unit: int, overlap: int) -> tuple[int, int]:
    """Tile (h, w), multiples of `unit`, of area <= max_pixels: the whole frame when it fits, else the tile of a grid
    (rows x columns of equal tiles, neighbours overlapping by `tile_overlap`) whose tiles keep the asked overlap,
    with the fewest tiles, then the smallest; where none keeps it, the fewest tiles, then the widest overlap. A
    streamed VAE's caches scale with the pixels of all its tiles together (they overlap), and a parked cut's host
    memory with every tile's but one (`worldgen.pipelines.fast_plan.StreamVAE`): near-square tiles of the largest
    area allowed cut 464x832 frames into 8 tiles of 272x280 pixels (1.58 frames) where a 2 x 3 grid of 264x320 tiles
    (1.31 frames) fits 5% more. Where no grid of up to MAX_GRID x MAX_GRID fits: its smallest tile."""
    if height * width <= max_pixels:
        return height, width
    areas, best = _best_tiles(height, width, unit, overlap)
    fits = bisect.bisect_right(areas, max_pixels)
    return best[fits - 1][-1] if fits else best[0][-1]


@functools.cache
def _best_tiles(height: int, width: int, unit: int, overlap: int) -> tuple[list[int], list[tuple]]:
    """`tile_shape`'s choice for every area: (the candidate tiles' areas, ascending; for each, the best candidate of
    that area or less, as (thin, count, -blended overlap, area, tile)). The candidates, in units: of every grid of up
    to MAX_GRID x MAX_GRID, the narrowest tiles covering the frame with the asked overlap, and those widened to keep
    it (`tile_overlap`: a quarter of the tile's shorter side). One sweep a frame shape, kept: the plan asks for
    hundreds of cuts."""
    h, w, step = height // unit, width // unit, max(1, overlap // unit)

    def sides(size: int) -> set[int]:
        narrowest = [min(size, -(-(size + (parts - 1) * step) // parts)) for parts in range(1, min(size, MAX_GRID) + 1)]
        return {*narrowest, *(min(size, max(n, 4 * step)) for n in narrowest)}

    ranked = []
    for tile_h in sides(h):
        for tile_w in sides(w):
            tile = (tile_h * unit, tile_w * unit)
            blended = tile_overlap(tile, overlap, unit)
            thin = blended < max(unit, overlap // unit * unit)  # its overlap cut short
            count = _tile_count(h, tile_h, blended // unit) * _tile_count(w, tile_w, blended // unit)
            ranked.append((thin, count, -blended, tile[0] * tile[1], tile))
    ranked.sort(key=lambda choice: choice[3])
    best = list(itertools.accumulate(ranked, min))
    return [choice[3] for choice in ranked], best


def _tile_count(size: int, tile: int, overlap: int) -> int:
    """len(tile_starts(size, tile, overlap)), counted."""
    return 1 if tile >= size else -(-(size - tile) // (tile - overlap)) + 1


def grid_tile_areas(height: int, width: int, overlap: int = TILE_OVERLAP) -> list[int]:
    """The tile areas (pixels) of every distinct cut `tile_shape` makes of `height` x `width` frames (in latent
    pixels, 8 x 8 each, as the decoder cuts them), the fewest tiles first, then the smallest: those that keep the whole
    overlap, or, where none does (small frames), all. A tile whose overlap is cut short blends its seams over fewer
    pixels, and the plan's per-pixel figures were not measured on such tiles: 464x120 strips let a 14B job's window
    grow from 10 to 13 frames at 24 GiB on figures nobody had checked."""
    h, w = height // 8, width // 8
    cuts = {(thin, count, 64 * area) for thin, count, _, area, tile in _best_tiles(h, w, 1, overlap // 8)[1]}
    cuts -= {(False, 1, 64 * h * w), (True, 1, 64 * h * w)}  # whole frames: not a cut of tiles
    keep = [cut for cut in sorted(cuts) if not cut[0]] or sorted(cuts, key=lambda cut: cut[1:])
    return [area for _, _, area in keep]


def _tiled(
    run_tile, source: torch.Tensor, scale: float, tile_hw: tuple[int, int], overlap: int, unit: int
) -> torch.Tensor:
    """Apply `run_tile` (source tile -> output tile `scale` times larger or smaller) over spatial tiles of
    `source` [B, C, T, H, W] and blend. `tile_hw` and `overlap` (the one asked: `tile_overlap` says the one blended)
    are in source pixels, multiples of `unit` (8 for pixels going into the encoder, so every tile starts on a latent
    pixel)."""
    height, width = source.shape[-2:]
    tile_h, tile_w = tile_hw
    overlap = tile_overlap(tile_hw, overlap, unit)
    out = weights = None
    for top, left in tile_positions(height, width, tile_hw, overlap, unit):
        piece = run_tile(source[..., top : top + tile_h, left : left + tile_w])
        if out is None:
            size = (round(height * scale), round(width * scale))
            out = torch.zeros(*piece.shape[:-2], *size, device=piece.device, dtype=torch.float32)
            weights = torch.zeros(size, device=piece.device, dtype=torch.float32)
        h, w = piece.shape[-2:]
        o = round(overlap * scale)
        y0, x0 = round(top * scale), round(left * scale)
        wy = _ramp(h, y0, h, size[0], o, piece.device)
        wx = _ramp(w, x0, w, size[1], o, piece.device)
        blend = wy[:, None] * wx[None, :]
        out[..., y0 : y0 + h, x0 : x0 + w] += piece * blend
        weights[y0 : y0 + h, x0 : x0 + w] += blend
        del piece
    return out / weights


@torch.no_grad()
def encode_tiled(
    vae: WanVAE, video: torch.Tensor, max_tile_pixels: int | None, overlap: int = TILE_OVERLAP
) -> torch.Tensor:
    """`vae.encode` over spatial tiles of at most `max_tile_pixels` (None or a big enough value: whole frames)."""
    return encode_per_tile(vae.encode, video, max_tile_pixels, overlap)


def encode_per_tile(
    run: Callable[[torch.Tensor], torch.Tensor],
    pixels: torch.Tensor,
    max_tile_pixels: int | None,
    overlap: int = TILE_OVERLAP,
) -> torch.Tensor:
    """`run` (pixels [B, C, t, th, tw] -> latents [B, z, T, th/8, tw/8]) over the encoder's spatial tiles of `pixels`,
    one tile after the other, blended: the tiling rule of `encode_tiled` for any encoding of a tile."""
    height, width = pixels.shape[-2:]
    if max_tile_pixels is None or height * width <= max_tile_pixels:
        return run(pixels)
    tile = tile_shape(height, width, max_tile_pixels, unit=8, overlap=overlap)
    return _tiled(run, pixels, 1 / 8, tile, overlap, unit=8)


@torch.no_grad()
def decode_tiled(
    vae: WanVAE, latent: torch.Tensor, max_tile_pixels: int | None, overlap: int = TILE_OVERLAP
) -> torch.Tensor:
    """`vae.decode` over spatial tiles of at most `max_tile_pixels` output pixels (None: whole frames)."""
    h, w = latent.shape[-2:]
    if max_tile_pixels is None or h * w * 64 <= max_tile_pixels:
        return vae.decode(latent)
    tile = tile_shape(h, w, max_tile_pixels // 64, unit=1, overlap=overlap // 8)
    return _tiled(vae.decode, latent, 8, tile, overlap // 8, unit=1)


class _Streaming:
    """Run a VAE half a few frames at a time over fixed spatial tiles, each tile's causal frame cache
    carried from one call to the next, so the pieces, concatenated, equal the whole-video tiled result
    (same tiles, same per-frame arithmetic).

    `park`: the device holds one tile's caches at a time, not every tile's (a tight VRAM budget:
    `worldgen.pipelines.fast_plan.StreamVAE.parked`). At a tile's turn its caches come from host memory (pinned on
    CUDA) and the tile before it takes their place there, one tensor after the other: the device holds one tile's
    caches and one tensor more, and the host the other tiles' only (the last tile of a call keeps its caches on the
    device until the next call's first turn; for two strips, half of what every tile's parked took). The same
    numbers, copied there and back exactly; the copies are queued on the current stream, in order with the
    tiles' work (each host block read for the incoming tile before the outgoing one's write into it)."""

    def __init__(self, vae: WanVAE, max_tile_pixels: int | None, overlap: int, park: bool = False):
        self.vae = vae
        self.max_tile_pixels = max_tile_pixels
        self.overlap = overlap
        self.park = park
        self.caches: dict[tuple[int, int], FrameCache] = {}
        self.host: dict[tuple[int, int], HostSlab] = {}  # parked: the host blocks a tile's caches are in
        self.resident: tuple[int, int] | None = None  # parked: the tile whose caches are on the device

    def cache_bytes(self) -> int:
        """Bytes held by every tile's causal caches (what a streamed VAE keeps between calls)."""
        return sum(t.numel() * t.element_size() for c in self.caches.values() for t in c.values() if t is not None)

    def host_bytes(self) -> int:
        """Host memory the parked tiles' blocks take."""
        return sum(slab.nbytes() for slab in self.host.values())

    def _cache(self, key: tuple[int, int], device: torch.device) -> FrameCache:
        """Tile `key`'s caches, on `device` (parked: swapped there with the resident tile's)."""
        cache = self.caches.setdefault(key, {})
        if self.park and self.resident != key:
            self._swap(key, device)
        return cache

    def _swap(self, key: tuple[int, int], device: torch.device) -> None:
        """Tile `key`'s caches to `device`, the resident tile's to host memory: into the blocks `key`'s leave where
        their layouts match (tiles of one shape), else into new ones (`HostSlab`: pinned blocks the allocator does
        not round up). Module by module, so each outgoing tensor is freed as its incoming one arrives."""
        incoming, slab = self.caches[key], self.host.pop(key, None)
        out_key, self.resident = self.resident, key
        out_cache = {} if out_key is None else self.caches[out_key]
        outgoing = {module: t for module, t in out_cache.items() if isinstance(t, torch.Tensor)}
        if outgoing and (slab is None or not slab.holds(outgoing)):
            slab = None  # its blocks back to PyTorch's host cache (once read) before the new ones are taken
            target = HostSlab.like(outgoing, pin=device.type == "cuda")
        else:
            target = slab
        for module in {**incoming, **outgoing}:
            held = incoming.get(module)
            if isinstance(held, torch.Tensor):  # a copy even on the CPU: its host block is about to be rewritten
                incoming[module] = held.to(device, non_blocking=True, copy=True)
            if module in outgoing:
                out_cache[module] = target[module].copy_(outgoing.pop(module), non_blocking=True)
        if out_key is not None and target is not None:
            self.host[out_key] = target


class StreamingDecoder(_Streaming):
    """`decode_tiled` a few latent frames at a time (see `_Streaming`): a streamed video equals a
    decoded-at-the-end one."""

    def __init__(self, vae: WanVAE, max_tile_pixels: int | None, overlap: int = TILE_OVERLAP, park: bool = False):
        super().__init__(vae, max_tile_pixels, overlap, park)

    def _run(self, key: tuple[int, int], latent: torch.Tensor) -> torch.Tensor:
        cache = self._cache(key, latent.device)
        frames = [self.vae.decode_chunk(latent[:, :, t : t + 1], cache) for t in range(latent.shape[2])]
        return torch.cat(frames, dim=2)

    @torch.no_grad()
    def push(self, latent: torch.Tensor) -> torch.Tensor:
        """The next latent frames [B, z, t, h, w] -> their video frames [B, 3, f, 8h, 8w] float32."""
        with torch.profiler.record_function("vae decode push"):  # named on a profile (bench/kernel_profile.py)
            return self._push(latent)

    def _push(self, latent: torch.Tensor) -> torch.Tensor:
        h, w = latent.shape[-2:]
        if self.max_tile_pixels is None or h * w * 64 <= self.max_tile_pixels:
            return self._run((0, 0), latent)
        overlap = self.overlap // 8
        tile = tile_shape(h, w, self.max_tile_pixels // 64, unit=1, overlap=overlap)
        positions = tile_positions(h, w, tile, overlap, unit=1)
        # parked: the tile whose caches are on the device runs first (no swap for it: one swap a push fewer, half of
        # two strips' copies), its piece held until `_tiled` blends it in its own place; the others in that order
        early: dict[tuple[int, int], torch.Tensor] = {}
        if self.park and self.resident in positions:
            top, left = self.resident
            early[self.resident] = self._run(self.resident, latent[..., top : top + tile[0], left : left + tile[1]])
        made = iter(positions)

        def piece(tile_latent: torch.Tensor) -> torch.Tensor:
            key = next(made)
            return early.pop(key) if key in early else self._run(key, tile_latent)

        return _tiled(piece, latent, 8, tile, overlap, unit=1)


class StreamingEncoder(_Streaming):
    """`encode_tiled` a few frames at a time (see `_Streaming`): the first push holds 4k+1 frames
    (frame 0 is encoded alone, as `WanVAE.encode` does), every later one 4k frames; the latents,
    concatenated, equal `encode_tiled` of the whole video.

    `still`: the last push left every tile's causal caches as they were (`vae.still_after`). Then a next push of
    the same frames gives the same latents, bit for bit, and so does every one after it: a conditioning video's
    black tail, once the image has left every layer's cached frames (at the Wan2.1 VAE's depth by frame 117,
    whatever the weights), needs no more encoding (`worldgen.pipelines.conditioning_video.ImageThenBlack`)."""

    def __init__(self, vae: WanVAE, max_tile_pixels: int | None, overlap: int = TILE_OVERLAP):
        super().__init__(vae, max_tile_pixels, overlap)
        self.frames_seen = 0
        self.still = False
        self._tiles_still: list[bool] = []

    def _run(self, key: tuple[int, int], video: torch.Tensor) -> torch.Tensor:
        cache = self.caches.setdefault(key, {})
        first = self.frames_seen == 0
        starts = [0, *range(1, video.shape[2], 4)] if first else list(range(0, video.shape[2], 4))
        sizes = [1 if first and s == 0 else 4 for s in starts]
        watch_stillness(cache, video.device)
        latent = torch.cat(
            [self.vae.encode_chunk(video[:, :, s : s + n], cache) for s, n in zip(starts, sizes, strict=True)], dim=2
        )
        self._tiles_still.append(still_after(cache))
        return latent

    @torch.no_grad()
    def push(self, video: torch.Tensor) -> torch.Tensor:
        """The next frames [B, 3, f, H, W] in [-1, 1] -> their latent frames [B, z, t, H/8, W/8]."""
        frames, height, width = video.shape[2:]
        if (frames - (1 if self.frames_seen == 0 else 0)) % 4 or height % 8 or width % 8:
            raise InputError(
                f"streamed VAE encode takes 4k+1 frames first, then 4k frames, H and W multiples of 8; got "
                f"{frames} frames (after {self.frames_seen}) of {height}x{width}"
            )
        self._tiles_still = []
        with torch.profiler.record_function("vae encode push"):  # named on a profile (bench/kernel_profile.py)
            if self.max_tile_pixels is None or height * width <= self.max_tile_pixels:
                latent = self._run((0, 0), video)
            else:
                tile = tile_shape(height, width, self.max_tile_pixels, unit=8, overlap=self.overlap)
                positions = iter(tile_positions(height, width, tile, self.overlap, unit=8))
                run = lambda piece: self._run(next(positions), piece)  # noqa: E731
                latent = _tiled(run, video, 1 / 8, tile, self.overlap, unit=8)
        self.frames_seen += frames
        self.still = all(self._tiles_still)
        return latent


def streamed_tiles(
    height: int, width: int, max_tile_pixels: int | None, overlap: int = TILE_OVERLAP
) -> tuple[int, int, int]:
    """(pixels of one tile, pixels of all tiles, tiles) of a `height` x `width` frame as `StreamingDecoder`
    cuts it (`StreamingEncoder`'s cut is the same to within rounding): what their memory scales with."""
    if max_tile_pixels is None or height * width <= max_tile_pixels:
        return height * width, height * width, 1
    h, w = height // 8, width // 8
    tile = tile_shape(h, w, max_tile_pixels // 64, unit=1, overlap=overlap // 8)
    count = len(tile_positions(h, w, tile, overlap // 8, unit=1))
    one = tile[0] * tile[1] * 64
    return one, one * count, count


def tile_positions(height: int, width: int, tile_hw: tuple[int, int], overlap: int, unit: int) -> list[tuple[int, int]]:
    """(top, left) of every tile in the order `_tiled` visits them (`overlap` the one asked: `tile_overlap`)."""
    overlap = tile_overlap(tile_hw, overlap, unit)
    rows = [s * unit for s in tile_starts(height // unit, tile_hw[0] // unit, overlap // unit)]
    cols = [s * unit for s in tile_starts(width // unit, tile_hw[1] // unit, overlap // unit)]
    return [(top, left) for top in rows for left in cols]
