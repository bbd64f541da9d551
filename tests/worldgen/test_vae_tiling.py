"""Spatially tiled VAE encode/decode (used only when whole frames do not fit the VRAM budget)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.worldgen.numerics import rel_l2
from worldgen.models.vae_tiling import (
    _tiled,
    decode_tiled,
    encode_tiled,
    tile_overlap,
    tile_positions,
    tile_shape,
    tile_starts,
)
from worldgen.runtime.checkpoint import find_checkpoint, load_vae
from worldgen.runtime.tiny import ensure_tiny_checkpoint


@settings(deadline=None)  # hypothesis' 200 ms per example fails on a busy machine; the tiles are under test
@given(st.integers(1, 400), st.integers(1, 120), st.integers(0, 30))
def test_tiles_cover_the_axis_with_the_overlap(size, tile, overlap):
    overlap = min(overlap, tile // 4)
    starts = tile_starts(size, tile, overlap)
    assert starts[0] == 0 and min(size, starts[-1] + tile) == size
    assert all(0 <= s <= max(0, size - tile) for s in starts)
    assert all(b - a <= tile - overlap for a, b in zip(starts, starts[1:], strict=False))  # no gaps, overlap kept


def test_blending_reproduces_a_pointwise_map_exactly():
    """With a map that needs no context (8x nearest upsampling), tiles must blend back to the same image."""
    latent = torch.randn(1, 2, 3, 20, 36)

    def upsample(x):
        return x.repeat_interleave(8, -1).repeat_interleave(8, -2)

    out = _tiled(upsample, latent, 8, (9, 14), 3, unit=1)
    torch.testing.assert_close(out, upsample(latent), rtol=1e-6, atol=1e-6)
    down = _tiled(lambda x: x[..., ::8, ::8], upsample(latent), 1 / 8, (64, 96), 16, unit=8)
    torch.testing.assert_close(down, latent, rtol=1e-6, atol=1e-6)


def test_tile_shape_respects_the_area_and_the_unit():
    assert tile_shape(720, 1280, 10**7, 8, 64) == (720, 1280)
    h, w = tile_shape(720, 1280, 400_000, 8, 64)
    assert h * w <= 400_000 and h % 8 == 0 and w % 8 == 0 and h <= 720 and w <= 1280


@settings(deadline=None)
@given(st.integers(8, 120), st.integers(8, 180), st.integers(16, 4000), st.sampled_from([4, 8]))
def test_tile_shape_takes_the_fewest_tiles_that_keep_the_overlap(height, width, max_pixels, overlap):
    """Against every tile size (not only the grids'): none of area <= max_pixels keeping the asked overlap covers the
    frame in fewer tiles, or in as many smaller ones."""
    tile = tile_shape(height, width, max_pixels, 1, overlap)
    if height * width <= max_pixels:
        assert tile == (height, width)
        return
    count = len(tile_positions(height, width, tile, overlap, 1))
    keeps = [
        (len(tile_positions(height, width, (th, tw), overlap, 1)), th * tw)
        for th in range(1, height + 1)
        for tw in range(1, max_pixels // th + 1)
        if tw <= width and tile_overlap((th, tw), overlap, 1) == overlap
    ]
    if tile_overlap(tile, overlap, 1) == overlap:  # a tile keeping the overlap: the fewest tiles, then the smallest
        assert tile[0] * tile[1] <= max_pixels and (count, tile[0] * tile[1]) == min(keeps)
    else:  # none keeps it (the widest overlap, 8, needs 32-wide tiles: 16 of them overlapping by 8 reach 392 > 180)
        assert not keeps


@pytest.fixture(scope="module")
def tiny_vae():
    return load_vae(find_checkpoint(ensure_tiny_checkpoint("bf16")), "cpu")


def test_whole_frames_are_the_untiled_pass(tiny_vae):
    video = torch.rand(1, 3, 5, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert torch.equal(encode_tiled(tiny_vae, video, None), tiny_vae.encode(video))
    latent = torch.randn(1, 16, 2, 8, 12, generator=torch.Generator().manual_seed(1))
    assert torch.equal(decode_tiled(tiny_vae, latent, 64 * 96), tiny_vae.decode(latent))


def test_tiled_passes_keep_shape_and_stay_close(tiny_vae):
    """Random tiny weights and noise input are the worst case for seams (no spatial smoothness, and the
    decoder's middle attention sees one tile): close, not equal."""
    g = torch.Generator().manual_seed(0)
    video = torch.rand(1, 3, 5, 96, 160, generator=g) * 2 - 1
    encoded = encode_tiled(tiny_vae, video, 96 * 96, overlap=32)
    assert encoded.shape == (1, 16, 2, 12, 20)
    assert rel_l2(encoded, tiny_vae.encode(video)) < 0.1
    latent = torch.randn(1, 16, 3, 12, 20, generator=g)
    decoded = decode_tiled(tiny_vae, latent, 96 * 96, overlap=32)
    assert decoded.shape == (1, 3, 9, 96, 160) and decoded.abs().max() <= 1
    assert rel_l2(decoded, tiny_vae.decode(latent)) < 0.15
