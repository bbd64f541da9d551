"""Host tensors packed into power-of-two blocks (worldgen.host_slab): every block a size PyTorch's pinned allocator
keeps as asked, no two views overlapping, each view in its tensor's layout; the decoder's parked caches of the
1.3B's 8 GiB cuts take within 3% of their bytes, where one pinned block a tensor took up to 1.8x."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.parked_host_memory import decoder_cache_sizes, one_block_a_tensor
from worldgen.host_slab import ALIGN, SMALLEST_BLOCK, HostSlab, layout, pack, span_bytes


def _assert_packed(sizes: list[int], blocks: list[int], places: list[tuple[int, int]]) -> None:
    assert all(b & (b - 1) == 0 and b >= SMALLEST_BLOCK for b in blocks)  # powers of two: nothing rounded up
    spans: dict[int, list[tuple[int, int]]] = {}
    for size, (block, offset) in zip(sizes, places, strict=True):
        assert offset % ALIGN == 0 and offset + size <= blocks[block]
        spans.setdefault(block, []).append((offset, offset + size))
    for ranges in spans.values():
        ranges.sort()
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(ranges))  # disjoint
    assert sorted(spans) == list(range(len(blocks)))  # no empty block


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300 * 2**20), min_size=1, max_size=40))
def test_pack_puts_every_size_in_a_power_of_two_block_without_overlap(sizes):
    blocks, places = pack(sizes)
    _assert_packed(sizes, blocks, places)


@pytest.mark.parametrize(("tile", "tiles", "before"), [((58, 58), 2, 3.08), ((34, 35), 8, 3.08)])
def test_the_parked_decoder_caches_of_the_8_gib_cuts_take_their_bytes_not_a_power_of_two_each(tile, tiles, before):
    """fp8/int8's two 464x464 strips and exact's eight tiles under `--vram-budget 8` (tests/worldgen/
    test_small_budget.py): 1.90 and 2.68 GiB of bf16 caches, 3.08 GiB each as one pinned block a tensor."""
    sizes = decoder_cache_sizes(*tile)
    assert len(sizes) == 32
    blocks, places = pack(sizes)
    _assert_packed(sizes, blocks, places)
    assert tiles * one_block_a_tensor(sizes) / 2**30 == pytest.approx(before, abs=0.01)
    assert sum(blocks) <= 1.03 * sum(sizes)


def test_a_slab_holds_each_tensor_in_its_layout_in_its_own_bytes():
    tensors = {
        "channels_last": torch.randn(1, 6, 2, 5, 7).contiguous(memory_format=torch.channels_last_3d),
        "plain": torch.randn(1, 3, 2, 4, 4, dtype=torch.float64),
        "bf16": torch.randn(1, 8, 1, 3, 3).to(torch.bfloat16),
        "strided": torch.randn(4, 10)[:, ::2],  # not dense: its span, not its numel, is held
    }
    slab = HostSlab.like(tensors, pin=False)
    assert slab.holds(tensors) and not slab.holds({**tensors, "plain": torch.zeros(1, 3, 1, 4, 4)})
    for key, t in tensors.items():
        view = slab[key]
        assert layout(view) == layout(t) and (view.data_ptr() - slab.blocks[0].data_ptr()) % ALIGN == 0
        view.copy_(t)
    for key, t in tensors.items():  # written one after the other: none overwrote another
        assert torch.equal(slab[key], t)
    assert slab.nbytes() == SMALLEST_BLOCK  # four small tensors share one block
    assert span_bytes((4, 5), (10, 2), torch.float32) == (1 + 3 * 10 + 4 * 2) * 4
