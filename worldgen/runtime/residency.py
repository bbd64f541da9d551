"""Which model is in memory when: model slots, and the residency policy that loads, keeps,
prefetches and frees them as the memory plan says.

The pipeline never decides residency itself. It tells the policy where it is, through three hooks
(as diffusers' offload hooks sit outside its pipelines):

    model = policy.use("high", upcoming=["high", "low"])   # about to run this model (+ what runs next)
    ...
    policy.phase_done("denoise")                           # free what the plan does not keep

and, once per job, `policy.fit(tokens, pixels)` re-decides the plan for the job's size and applies
it to the models already loaded. Model names: "text_encoder", "vae", and the experts' names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from torch import nn

from worldgen.runtime.cuda_memory import free_device_memory
from worldgen.runtime.memory import MemoryPlan

PHASE_MODELS = {"text": ("text_encoder",), "encode": ("vae",), "decode": ("vae",)}  # "denoise": the experts


class ModelSlot:
    """A model loaded on first `get()` and freed by `unload()`; counts its loads and their seconds."""

    def __init__(self, name: str, load: Callable[[], nn.Module], prefetch: Callable[[], object] | None = None):
        self.name = name
        self._load = load
        self._prefetch = prefetch
        self.module: nn.Module | None = None
        self.loads = 0
        self.load_seconds = 0.0

    def get(self) -> nn.Module:
        if self.module is None:
            start = time.perf_counter()
            self.module = self._load()
            self.load_seconds += time.perf_counter() - start
            self.loads += 1
        return self.module

    def prefetch(self) -> None:
        """Start reading the model's files into the page cache (no-op when loaded or not supported)."""
        if self.module is None and self._prefetch is not None:
            self._prefetch()

    def unload(self) -> None:
        if self.module is not None:
            device = next(self.module.parameters()).device
            self.module = None
            free_device_memory(device)

    @property
    def loaded(self) -> bool:
        return self.module is not None


class ResidencyPolicy:
    """Loads, keeps, prefetches and frees the pipeline's models as `plan` says.

    - text encoder: freed after the text phase unless the plan keeps it (streamed: always freed,
      its blocks were consumed on the way through the device).
    - VAE: the experts are freed before it loads when they do not fit beside it; freed after
      encode/decode unless the plan keeps it.
    - experts: when both do not fit, the other expert is freed before one loads (never two in
      memory at once) and the next one in the schedule is read into the page cache while this one
      computes, so the swap loads from RAM; freed after denoising unless both are kept.
    """

    def __init__(
        self,
        plan: MemoryPlan,
        text_encoder: ModelSlot | None = None,
        vae: ModelSlot | None = None,
        experts: dict[str, ModelSlot] | None = None,
    ) -> None:
        """Slots left out are not managed (e.g. a second GPU that only holds copies of the experts)."""
        self.plan = plan
        self.text_encoder, self.vae, self.experts = text_encoder, vae, experts or {}
        named = {"text_encoder": text_encoder, "vae": vae, **self.experts}
        self._slots = {name: slot for name, slot in named.items() if slot is not None}
        self._prefetched: set[str] = set()  # experts whose files are being read ahead and are not loaded yet

    def slot(self, name: str) -> ModelSlot:
        if name not in self._slots:
            raise KeyError(f"this residency policy manages no model {name!r} (it has {', '.join(self._slots)})")
        return self._slots[name]

    def use(self, name: str, upcoming: Sequence[str] = ()) -> nn.Module:
        """About to run model `name`: make room for it, load it, and read ahead what runs next.

        `upcoming` lists the models the caller runs after this one, in order (the rest of the
        denoising schedule); the caller must drop its own reference to the previous model first,
        or a freed expert stays in memory.
        """
        slot = self.slot(name)
        if name == "vae" and not self.plan.experts_beside_vae:
            self._unload(self.experts)
        if name in self.experts and not self.plan.keep_both_experts:
            self._unload(other for other in self.experts if other != name)
        module = slot.get()
        self._prefetched.discard(name)
        if name in self.experts and not self.plan.keep_both_experts:
            for later in dict.fromkeys(upcoming):
                if later != name and later not in self._prefetched and not self.experts[later].loaded:
                    self.experts[later].prefetch()
                    self._prefetched.add(later)
        return module

    def phase_done(self, phase: str) -> None:
        """Phase `phase` ("text", "encode", "denoise", "decode") finished: free what the plan does not keep."""
        if phase == "denoise":
            if not self.plan.keep_both_experts:
                self._unload(self.experts)
            return
        for name in PHASE_MODELS[phase]:
            if name in self._slots and not self._keeps(name):
                self.slot(name).unload()

    def fit(self, tokens: int, pixels: int) -> bool:
        """Re-decide the plan for a job of `tokens` DiT tokens and `pixels` per frame and apply it to
        the models already loaded; returns True when the plan changed."""
        if not self.plan.fit(tokens, pixels):
            return False
        for slot in self.experts.values():
            if slot.loaded:
                slot.module.set_ffn_chunk_tokens(self.plan.ffn_chunk_tokens)
        if not self.plan.keep_both_experts and sum(slot.loaded for slot in self.experts.values()) > 1:
            self._unload(list(self.experts)[1:])  # keep the first (high-noise) expert: it runs first
        return True

    def _keeps(self, name: str) -> bool:
        if name == "text_encoder":
            return self.plan.keep_text_encoder and not self.plan.stream_text_encoder
        if name == "vae":
            return self.plan.keep_vae
        return self.plan.keep_both_experts

    def _unload(self, names: Iterable[str]) -> None:
        for name in names:
            self.slot(name).unload()
