"""Host memory for a set of tensors in a few blocks whose sizes are powers of two: pinned, nothing rounded away.

PyTorch's caching host allocator rounds every pinned block up to the next power of two
(`CachingHostAllocator.h`: "Round up the allocation to the nearest power of two to improve reuse"). The
decoder's causal caches are 32 tensors a tile of awkward sizes (82.7, 41.3, 20.7 MB ... for a 464x464 strip in
bf16), so parked one pinned block each (`worldgen.models.vae_tiling._Streaming.park`) the 1.3B's two strips under
`--vram-budget 8` took 3.08 GiB of pinned host memory for 1.90 GiB of caches, and exact's eight tiles 3.08 for
2.68 (the shapes' arithmetic: `bench/parked_host_memory.py`); that is most of the RSS above the 4 GiB target
(5.3-5.5 GiB measured, docs/benchmarks.md "Session 31").

Here the tensors are packed, largest first, into blocks of the largest power of two their remaining total
fills (first fit), and each tensor is a view of its block: the allocator rounds nothing, and the waste is what
the packing leaves (1-3% for the decoder's caches). Freed, the blocks stay in PyTorch's host cache, so the
next job's same set of shapes gets the same blocks back without pinning memory again (what
`worldgen.pipelines.fast_warm_up.first_use_ahead` counts on). Written here rather than taken from a library:
the sizes PyTorch's allocator rounds are its own, and nothing else hands out views of its blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

ALIGN = 4096  # each view starts on a page of its block (pinned blocks start on one): every dtype's alignment
SMALLEST_BLOCK = 2**21  # a set's last few small tensors share one block of at least 2 MiB

Layout = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]  # shape, stride, dtype


def layout(t: torch.Tensor) -> Layout:
    return tuple(t.shape), t.stride(), t.dtype


def span_bytes(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> int:
    """The bytes a strided tensor reaches from its first element (its numel's for a dense one)."""
    if any(size == 0 for size in shape):
        return 0
    return (1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))) * dtype.itemsize


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _power_of_two_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


def pack(sizes: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """(block sizes, each size's (block, offset)): every block a power of two, every offset a multiple of ALIGN.
    Each new block is the largest power of two the sizes left fill (at least the largest of them and
    SMALLEST_BLOCK), filled first fit, largest first."""
    left = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    blocks: list[int] = []
    places: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    while left:
        total = sum(_aligned(sizes[i]) for i in left)
        biggest = _aligned(sizes[left[0]])
        block = max(_power_of_two_at_most(total), _power_of_two_at_least(biggest), SMALLEST_BLOCK)
        used, kept = 0, []
        for i in left:
            need = _aligned(sizes[i])
            if used + need <= block:
                places[i] = (len(blocks), used)
                used += need
            else:
                kept.append(i)
        blocks.append(block)
        left = kept
    return blocks, places


class HostSlab:
    """Host tensors of given layouts (shape, stride, dtype) by key, views of a few blocks (`pack`), pinned on
    request: `slab[key]` is the tensor for `key`."""

    def __init__(self, layouts: Mapping[Hashable, Layout], pin: bool):
        self.layouts = dict(layouts)
        keys = list(self.layouts)
        sizes, places = pack([span_bytes(*self.layouts[k]) for k in keys])
        self.blocks = [torch.empty(n, dtype=torch.uint8, pin_memory=pin) for n in sizes]
        self.views: dict[Hashable, torch.Tensor] = {}
        for key, (block, offset) in zip(keys, places, strict=True):
            shape, stride, dtype = self.layouts[key]
            nbytes = span_bytes(shape, stride, dtype)
            flat = self.blocks[block][offset : offset + nbytes].view(dtype)
            self.views[key] = flat.as_strided(shape, stride)

    @classmethod
    def like(cls, tensors: Mapping[Hashable, torch.Tensor], pin: bool) -> HostSlab:
        """Room for a host copy of each of `tensors`, in its layout (channels-last stays channels-last)."""
        return cls({key: layout(t) for key, t in tensors.items()}, pin)

    def holds(self, tensors: Mapping[Hashable, torch.Tensor]) -> bool:
        """Whether this slab has a tensor of the same layout for each of `tensors`, and no other."""
        return self.layouts == {key: layout(t) for key, t in tensors.items()}

    def nbytes(self) -> int:
        """The host memory its blocks take."""
        return sum(block.numel() for block in self.blocks)

    def __getitem__(self, key: Hashable) -> torch.Tensor:
        return self.views[key]
