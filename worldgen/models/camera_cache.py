"""The camera's modulation of each DiT block, computed once per job and expert, reused every step.

A block's camera path (`cam_injector_layer1/2`, `cam_scale_layer`, `cam_shift_layer`, and the
model's `embed_camera` before the blocks) depends only on the camera's Plücker tensor and the
expert's weights: not on the noisy latent, the timestep or the prompt. A rollout runs it unchanged
in every one of its 2 x 70 forwards per expert: four Linears over every token in each of the 40
blocks, 14% of a forward's FLOPs at 480p. With a `CameraCache` attached (`model.camera_cache`),
the first forward with a camera stores each block's (scale, shift) and the later forwards with the
same camera tensor read them back: the same numbers, so the output is unchanged.

It costs 2 x tokens x dim values in the compute dtype per block (26.8 GiB for the A14B expert at
480p in bf16), so `worldgen.runtime.memory.MemoryPlan` turns it on only where that fits beside everything
else (an 80 GB card, not a 24 GB one), and the pipeline attaches it to one expert at a time.
"""

from __future__ import annotations

import torch


def cache_gib(tokens: int, dim: int = 5120, num_layers: int = 40, bytes_per_value: int = 2) -> float:
    """GiB a CameraCache holds for a job of `tokens` DiT tokens (the A14B expert's shape by default)."""
    return 2 * tokens * dim * num_layers * bytes_per_value / 2**30


class CameraCache:
    """Per-block (scale, shift) of one camera tensor. `source` is the tensor they were computed from:
    a forward given another tensor (another job, another chunk) recomputes and replaces them."""

    def __init__(self) -> None:
        self.source: torch.Tensor | None = None
        self.blocks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def holds(self, cam: torch.Tensor | None, num_blocks: int) -> bool:
        """True when every block's modulation of this very camera tensor is stored."""
        return cam is not None and cam is self.source and len(self.blocks) == num_blocks

    def restart(self, cam: torch.Tensor) -> None:
        self.source, self.blocks = cam, {}

    def clear(self) -> None:
        self.source, self.blocks = None, {}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.blocks.values() for t in pair)


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
