"""umT5 with its weights memory-mapped on the CPU, passed through the device one block at a time:
the GPU holds one block (~0.4 GiB for umT5-XXL) instead of 10.6 GiB. A memory policy over
`worldgen.models.t5`, so it lives here beside the streamed loads it relies on.

To a GPU, each tensor goes through one of two pinned staging buffers (`tensor_stream.StagingBuffer`), 32 MiB at a
time: the copy out of the mapped pages into one overlaps the GPU's copy out of the other, at the pinned rate.
Straight from the mapped (pageable) pages, the copies were 1.3 s of a Fast rollout's 1.4-1.8 s text phase on the
H100 (docs/benchmarks.md, "Session 11: Fast"), the GPU idle in between. Each tensor's mapped pages go back to the page
cache once it is copied, so the process holds one tensor of the file at a time (umT5-XXL's largest: 84 MB), not a
block (~0.4 GiB): the RSS a 1.3B job under `--vram-budget 8` holds beside Isaac Sim (docs/benchmarks.md, "Session
40"), with the buffers a quarter of the 128 MiB they were.
"""

from __future__ import annotations

import torch
from torch import nn

from worldgen.models.t5 import UMT5Encoder
from worldgen.runtime.tensor_stream import StagingBuffer, release_host_pages

STAGING_BYTES = 32 * 2**20  # each of the two pinned buffers; a larger tensor passes through in pieces


def _move_block(block: nn.Module, device: torch.device, dtype: torch.dtype | None, staging: StagingBuffer) -> None:
    """`block.to(device, dtype)` with every tensor copied through the pinned staging buffers, piece by piece, its
    mapped pages released once copied."""

    def staged(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, device=device)
        source, target = t.reshape(-1).view(torch.uint8), out.view(-1).view(torch.uint8)
        for start in range(0, source.numel(), staging.capacity):
            piece = source[start : start + staging.capacity]
            host = staging.view(piece.numel())
            host.copy_(piece)  # from the mapped pages (the CPU), while the GPU copies out of the other buffer
            target[start : start + piece.numel()].copy_(host, non_blocking=True)
            staging.copies_issued()
        release_host_pages(t)  # read, and never again (the block is consumed): its pages back to the page cache
        return out.to(dtype) if dtype is not None and out.is_floating_point() else out

    for param in block.parameters():
        param.data = staged(param.data)
    for module in block.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = staged(buffer)


@torch.no_grad()
def encode_prompts_streamed(
    encoder: UMT5Encoder,
    ids: torch.Tensor,
    mask: torch.Tensor,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Like `encode_prompts`, with the encoder's weights on the CPU (memory-mapped) passing one
    block at a time through `device` in `dtype` (default: the file's): the GPU holds one block
    (~0.4 GiB for umT5-XXL), not 10.6 GiB. With `device` the CPU, each block is cast, run and
    dropped in turn, so even float32 on the CPU needs one block of RAM, not 23 GB.

    Blocks are consumed: each is moved to the meta device after use, so load a fresh encoder for
    the next call (the text-embedding cache makes that rare).
    """
    device = torch.device(device)
    staging = StagingBuffer(STAGING_BYTES, pin=True) if device.type == "cuda" else None
    x = encoder.embed(ids).to(device, dtype)  # the embedding lookup gathers rows on the CPU
    ids_mask = mask.to(device)
    shared = encoder.shared_position_bias(ids.shape[1])
    if shared is not None:
        shared = shared.to(device, dtype)
    for block in encoder.blocks:
        # detach(): new handles on the CPU storages. `block.to` swaps each Parameter's `.data` in
        # place, so holding the Parameters themselves would leave us only the moved copies and the
        # mapped pages of every block would stay resident until the whole file is unmapped.
        host_tensors = [t.detach() for t in (*block.parameters(), *block.buffers())]
        if staging is not None:
            _move_block(block, device, dtype, staging)
        else:
            block.to(device, dtype)
        if device.type != "cpu":  # keep RSS flat: the mapped pages go back to the page cache
            for tensor in host_tensors:
                release_host_pages(tensor)
        x = block(x, ids_mask, shared)
        if device.type == "cpu":  # the block may have computed on the mapped pages themselves
            for tensor in host_tensors:
                release_host_pages(tensor)
        del host_tensors
        block.to("meta")
    hidden = encoder.norm.to(device, dtype)(x)
    lengths = mask.gt(0).sum(dim=1).tolist()
    return [row[:n].clone() for row, n in zip(hidden, lengths, strict=True)]
