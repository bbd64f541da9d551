"""The camera's modulation of each DiT block, computed once per camera tensor, reused every forward.

A block's camera path (`cam_injector_layer1/2`, `cam_scale_layer`, `cam_shift_layer`, and the
model's `embed_camera` before the blocks) depends only on the camera's Plücker tensor and the
expert's weights: not on the noisy latent, the timestep or the prompt. The base model runs it
unchanged in every one of its 2 x 70 forwards per expert, the Fast model in each of a chunk's 5
(4 steps and the cache refresh): four Linears over every token in each of the 40 blocks, 14% of a
base forward's FLOPs at 480p and a quarter of a Fast forward's GEMM work. With a `CameraCache`
attached (`model.camera_cache`), the first forward with a camera stores each block's (scale, shift)
and the later forwards with the same camera tensor read them back: the same numbers, so the output
is unchanged.

It costs 2 x tokens x dim values in the compute dtype per block (26.8 GiB for the A14B expert at
480p in bf16; 3.5 GiB for a Fast chunk), so `worldgen.runtime.memory.MemoryPlan` turns it on only
where that fits beside everything else (an 80 GB card, not a 24 GB one), and the pipeline attaches
it to one expert at a time. The Fast pipeline may cover only the first `max_blocks` blocks (what its
plan leaves after the KV cache): the camera tokens are then kept too, for the blocks after them. A
streamed Fast job at 24 GiB keeps them in one slab from a chunk's first step to its decode, and frees it
whole there for the decoder (blocks' tensors freed one by one ran out of memory in fragments: docs/
benchmarks.md, "Session 18: Fast" and "Session 21: Fast").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def cache_gib(tokens: int, dim: int = 5120, num_layers: int = 40, bytes_per_value: int = 2) -> float:
    """GiB a CameraCache holds for a job of `tokens` DiT tokens (the A14B expert's shape by default)."""
    return 2 * tokens * dim * num_layers * bytes_per_value / 2**30


def block_bytes(tokens: int, dim: int, bytes_per_value: int) -> int:
    """Bytes one block's cached (scale, shift) take for `tokens` camera tokens."""
    return 2 * tokens * dim * bytes_per_value


class CameraCache:
    """Per-block (scale, shift) of one camera tensor. `source` is the tensor they were computed from:
    a forward given another tensor (another job, another chunk) recomputes and replaces them.
    `max_blocks` (None: every block) caps how many blocks are covered, from the first."""

    def __init__(self, max_blocks: int | None = None, slab: bool = False) -> None:
        self.max_blocks = max_blocks
        self.source: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None  # the camera tokens, kept while a block is not covered
        self.blocks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # `slab`: every covered block's (scale, shift) in one tensor, so `clear` frees one allocation
        # whole for whatever comes next (a chunk's decode), not dozens amid its transients
        self.slab: torch.Tensor | None = None if not slab else torch.empty(0)

    def covered(self, num_blocks: int) -> int:
        return num_blocks if self.max_blocks is None else min(self.max_blocks, num_blocks)

    def holds(self, cam: torch.Tensor | None, num_blocks: int) -> bool:
        """True when every covered block's modulation of this very camera tensor is stored."""
        return cam is not None and cam is self.source and len(self.blocks) == self.covered(num_blocks)

    def block_inputs(
        self, cam: torch.Tensor, blocks: Sequence, embed: Callable[[torch.Tensor], torch.Tensor]
    ) -> list[torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        """Each block's camera input for the Plücker tensor `cam`: its stored (scale, shift) where covered
        (computed now on the first forward with `cam`), else the camera tokens `embed(cam)`."""
        covered = self.covered(len(blocks))
        if not self.holds(cam, len(blocks)):
            self.restart(cam)
        tokens = self.tokens
        if tokens is None and (len(self.blocks) < covered or covered < len(blocks)):
            tokens = embed(cam)
        for i in range(covered):
            if i not in self.blocks:
                self.blocks[i] = self._kept(i, covered, blocks[i].camera_modulation(tokens))
        self.tokens = tokens if covered < len(blocks) else None
        return [self.blocks[i] if i < covered else tokens for i in range(len(blocks))]

    def _kept(self, i: int, covered: int, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slab is None:
            return pair
        if self.slab.shape[:2] != (covered, 2) or self.slab.shape[2:] != pair[0].shape:
            self.slab = torch.empty((covered, 2, *pair[0].shape), dtype=pair[0].dtype, device=pair[0].device)
        self.slab[i, 0].copy_(pair[0])
        self.slab[i, 1].copy_(pair[1])
        return self.slab[i, 0], self.slab[i, 1]

    def restart(self, cam: torch.Tensor) -> None:
        self.source, self.tokens, self.blocks = cam, None, {}

    def clear(self) -> None:
        self.source, self.tokens, self.blocks = None, None, {}
        if self.slab is not None:
            self.slab = torch.empty(0)

    def nbytes(self) -> int:
        kept = [t for pair in self.blocks.values() for t in pair] + ([] if self.tokens is None else [self.tokens])
        return sum(t.numel() * t.element_size() for t in kept)


class CameraCaches:
    """A denoising loop's camera caches: one expert's at a time (the previous expert's is emptied
    when the next takes over), all detached and freed by `release()` when the loop ends."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.current: tuple[str, CameraCache] | None = None
        self.models: list = []  # every model given a cache, to detach it at the end

    def attach(self, expert: str, model) -> None:
        if not self.enabled:
            return
        if self.current is None or self.current[0] != expert:
            if self.current is not None:
                self.current[1].clear()  # the boundary: the previous expert's modulations are done
            self.current = (expert, CameraCache())
        model.camera_cache = self.current[1]
        if all(m is not model for m in self.models):
            self.models.append(model)

    def release(self) -> None:
        for model in self.models:
            model.camera_cache = None
        if self.current is not None:
            self.current[1].clear()
        self.current, self.models = None, []
