"""The residency policy's decisions, on the real tiny checkpoint's models: what is loaded, freed and
read ahead at each hook, under the 16 and 24 GiB plans users run (the plans made for the full-size
NF4 experts; the models moved are the tiny ones)."""

from __future__ import annotations

import pytest
import torch

from worldgen.pipelines.base import tokens_for
from worldgen.pipelines.loader import load_pipeline
from worldgen.runtime.checkpoint import find_checkpoint, load_expert, load_vae
from worldgen.runtime.memory import MemoryPlan, plan_memory
from worldgen.runtime.residency import ModelSlot, ResidencyPolicy
from worldgen.runtime.tiny import ensure_tiny_checkpoint

NF4_EXPERT_GIB = 8.9
SCHEDULE = ["high", "high", "high", "low", "low", "low"]  # the experts of a 6-step denoise, in order


def budget_plan(gib: float, **kw) -> MemoryPlan:
    return plan_memory("cuda", gib, expert_gib=NF4_EXPERT_GIB, checkpoint_kind="nf4", gpu_total_gib=80.0, **kw)


class TinyModels:
    """Slots over the tiny checkpoint's real models that log each load (with what else was loaded
    at that moment) and each prefetch."""

    def __init__(self) -> None:
        layout = find_checkpoint(ensure_tiny_checkpoint("bf16"))
        self.events: list[tuple] = []
        self.experts = {
            name: ModelSlot(
                name,
                lambda n=name, f=folder: self._log_load(n, lambda: load_expert(f, "cpu", torch.float32)),
                prefetch=lambda n=name: self.events.append(("prefetch", n)),
            )
            for name, folder in layout.experts.items()
        }
        self.vae = ModelSlot("vae", lambda: self._log_load("vae", lambda: load_vae(layout, "cpu")))
        self.text_encoder = ModelSlot("t5", lambda: self._log_load("t5", lambda: torch.nn.Linear(4, 4)))

    def _log_load(self, name: str, load):
        self.events.append(("load", name, self.loaded()))
        return load()

    def loaded(self) -> tuple[str, ...]:
        return tuple(n for n, s in self.experts.items() if s.loaded)

    def policy(self, plan: MemoryPlan) -> ResidencyPolicy:
        return ResidencyPolicy(plan, self.text_encoder, self.vae, self.experts)

    def denoise(self, policy: ResidencyPolicy) -> None:
        """What `Pipeline.denoise` asks of the policy, step by step."""
        for i, which in enumerate(SCHEDULE):
            model = policy.use(which, upcoming=SCHEDULE[i + 1 :])
            assert model is self.experts[which].module
            del model
        policy.phase_done("denoise")


@pytest.fixture
def tiny() -> TinyModels:
    return TinyModels()


def test_under_16_gib_the_first_expert_is_freed_before_the_second_loads_and_the_next_is_prefetched(tiny):
    plan = budget_plan(16)
    assert not plan.keep_both_experts
    tiny.denoise(tiny.policy(plan))
    # high loads alone, low is read ahead once while high computes, low loads with nothing beside it
    assert tiny.events == [("load", "high", ()), ("prefetch", "low"), ("load", "low", ())]
    assert tiny.loaded() == ()  # nothing kept after the phase: the next job reloads (from the page cache)
    tiny.events.clear()
    tiny.denoise(tiny.policy(plan))
    assert tiny.events == [("load", "high", ()), ("prefetch", "low"), ("load", "low", ())]


def test_under_24_gib_both_experts_stay_resident(tiny):
    policy = tiny.policy(budget_plan(24))
    tiny.denoise(policy)
    assert tiny.events == [("load", "high", ()), ("load", "low", ("high",))]  # no swap, no read-ahead
    assert tiny.loaded() == ("high", "low")
    tiny.denoise(policy)  # the next job: nothing to load
    assert len(tiny.events) == 2 and tiny.experts["high"].loads == tiny.experts["low"].loads == 1


def test_experts_are_freed_before_the_vae_when_they_do_not_fit_beside_it(tiny):
    plan = budget_plan(24)
    assert not plan.experts_beside_vae and plan.keep_vae
    policy = tiny.policy(plan)
    tiny.denoise(policy)
    vae = policy.use("vae")
    assert tiny.loaded() == () and tiny.vae.loaded and isinstance(vae, torch.nn.Module)
    policy.phase_done("decode")
    assert tiny.vae.loaded  # 24 GiB keeps the VAE


def test_without_a_budget_everything_stays(tiny):
    policy = tiny.policy(MemoryPlan.unlimited("cpu"))
    policy.use("text_encoder")
    policy.phase_done("text")
    tiny.denoise(policy)
    policy.use("vae")
    policy.phase_done("decode")
    assert tiny.text_encoder.loaded and tiny.vae.loaded and tiny.loaded() == ("high", "low")
    assert ("prefetch", "low") not in tiny.events


def test_a_streamed_text_encoder_is_freed_after_the_text_phase(tiny):
    policy = tiny.policy(budget_plan(24, text_encoder_on_cpu=True))
    policy.use("text_encoder")
    policy.phase_done("text")
    assert not tiny.text_encoder.loaded


def test_fit_to_a_bigger_job_frees_the_second_expert_and_rechunks_the_first(tiny):
    policy = tiny.policy(budget_plan(24))
    tiny.denoise(policy)
    assert policy.fit(tokens_for(81, 720, 1280), 720 * 1280)  # 720p under 24: one expert at a time
    assert tiny.loaded() == ("high",)
    assert tiny.experts["high"].module.blocks[0].ffn_chunk_tokens == policy.plan.ffn_chunk_tokens == 8192
    assert not policy.fit(tokens_for(81, 720, 1280), 720 * 1280)  # same size again: nothing changes


def test_a_swapping_plan_gives_the_same_video_as_keeping_everything():
    """The policy moves models, never numbers: the tiny pipeline under a 16 GiB plan (experts swapped,
    freed after denoising) gives the video it gives with every model resident."""
    resident = load_pipeline("tiny", device="cpu", use_text_cache=False)
    swapping = load_pipeline("tiny", device="cpu", use_text_cache=False)
    plan = budget_plan(16, text_encoder_on_cpu=True)
    swapping.residency = ResidencyPolicy(plan, swapping.text_encoder, swapping.vae, swapping.experts)
    context, negative = resident.encode_text(["a robot arm over a table", "blurry"])
    settings = swapping_settings()
    image = torch.rand(64, 64, 3).mul(255).to(torch.uint8).numpy()
    videos = [
        pipe.generate(image, None, settings=settings, context=context, negative_context=negative)
        for pipe in (resident, swapping)
    ]
    assert swapping.plan is plan and not plan.keep_both_experts
    assert [s.loads for s in swapping.experts.values()] == [1, 1]
    assert not any(s.loaded for s in swapping.experts.values())
    assert all(s.loaded for s in resident.experts.values())
    torch.testing.assert_close(videos[1], videos[0], rtol=1e-4, atol=1e-5)


def swapping_settings():
    from contracts.settings import GenerationSettings

    return GenerationSettings(size="64*64", frame_num=5, steps=4, boundary=0.9, shift=5.0)


def test_a_policy_over_the_experts_alone_manages_a_second_gpus_copies(tiny):
    """A second GPU holds only copies of the experts (worldgen.pipelines.multi_gpu): its policy swaps them the same
    way and its phase hooks for models it does not hold do nothing."""
    policy = ResidencyPolicy(budget_plan(16), experts=tiny.experts)
    policy.phase_done("text")
    policy.phase_done("decode")
    tiny.denoise(policy)
    assert tiny.events == [("load", "high", ()), ("prefetch", "low"), ("load", "low", ())]
    with pytest.raises(KeyError, match="no model 'vae'"):
        policy.use("vae")


def test_models_a_job_drops_are_freed_without_the_cycle_collector():
    """`free_device_memory` no longer runs `gc.collect()` at each phase: a dropped model must be freed by
    reference counting alone. The tiny pipeline's job under a swapping 16 GiB plan (umT5 streamed and
    dropped after the text phase, each expert dropped before the other loads), with the collector off.
    The process's first job runs with it on: torch's first `normal_` on the meta device imports a module
    and leaves that first umT5 in a reference cycle (once a process; the next ones are freed at once)."""
    import gc
    import weakref

    pipe = load_pipeline("tiny", device="cpu", use_text_cache=False)
    plan = budget_plan(16, text_encoder_on_cpu=True)
    pipe.residency = ResidencyPolicy(plan, pipe.text_encoder, pipe.vae, pipe.experts)
    loaded: dict[str, list[weakref.ref]] = {}
    for slot in (pipe.text_encoder, *pipe.experts.values()):
        load = slot._load
        slot._load = lambda load=load, name=slot.name: _remembered(load(), loaded.setdefault(name, []))
    image = torch.rand(64, 64, 3).mul(255).to(torch.uint8).numpy()
    pipe.generate(image, "a robot arm over a table", settings=swapping_settings())
    gc.collect()
    assert len(loaded) == 3 and all(ref() is None for refs in loaded.values() for ref in refs)
    loaded.clear()
    gc.disable()
    try:
        pipe.generate(image, "a robot arm over a table", settings=swapping_settings())
        dropped = [name for name, refs in loaded.items() for ref in refs if ref() is not None]
    finally:
        gc.enable()
    assert len(loaded) == 3 and not any(s.loaded for s in pipe.experts.values())
    assert dropped == []  # each was freed the moment its slot let go of it


def _remembered(module: torch.nn.Module, refs: list) -> torch.nn.Module:
    import weakref

    refs.append(weakref.ref(module))
    return module
