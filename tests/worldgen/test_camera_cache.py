"""The camera modulation cache: the same output with it as without, recomputed for another camera,
freed with the job, and planned only where it fits (an 80 GB card, not a 24 GB one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.worldgen.test_memory_plan import NF4_EXPERT_GIB, plan
from tests.worldgen.test_pipeline import case  # noqa: F401  (the golden pipeline fixture)
from worldgen.models.camera_cache import CameraCache, cache_gib
from worldgen.pipelines.camera import camera_conditioning
from worldgen.runtime.checkpoint import load_expert
from worldgen.runtime.memory import REFERENCE_PIXELS, REFERENCE_TOKENS, camera_cache_gib, plan_memory


@pytest.fixture(scope="module")
def dit(golden):
    return load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)


@pytest.fixture(scope="module")
def io(golden):
    return load_file(golden / "dit" / "io.safetensors")


def test_a_cached_camera_gives_the_same_output_and_skips_its_layers(dit, io):
    cam = io["cam"]
    inputs = (io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None])
    with torch.no_grad():
        plain = dit(*inputs, cam)
        dit.camera_cache = cache = CameraCache()
        try:
            first = dit(*inputs, cam)  # fills the cache
            assert cache.holds(cam, len(dit.blocks)) and cache.nbytes() > 0
            calls = []
            hook = dit.blocks[0].cam_scale_layer.register_forward_hook(lambda *_: calls.append(1))
            second = dit(io["x"][None], torch.tensor([250]), [io["context"]], io["y"][None], cam)
            hook.remove()
            assert calls == []  # read back, not recomputed
            reference_t250 = None
            dit.camera_cache = None
            reference_t250 = dit(io["x"][None], torch.tensor([250]), [io["context"]], io["y"][None], cam)
            # another camera tensor (another job) replaces what the cache held
            dit.camera_cache = cache
            other = cam.flip(-1).contiguous()
            moved = dit(*inputs, other)
            assert cache.source is other
            dit.camera_cache = None
            moved_plain = dit(*inputs, other)
        finally:
            dit.camera_cache = None
    assert torch.equal(first, plain) and torch.equal(second, reference_t250) and torch.equal(moved, moved_plain)
    assert not torch.equal(moved, plain)


def test_a_cache_of_the_first_blocks_gives_the_same_output_and_keeps_the_tokens_for_the_rest(dit, io):
    cam = io["cam"]
    inputs = (io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None])
    calls = {0: [], 1: []}
    hooks = [dit.blocks[i].cam_scale_layer.register_forward_hook(lambda *_, i=i: calls[i].append(1)) for i in calls]
    try:
        with torch.no_grad():
            plain = dit(*inputs, cam)
            dit.camera_cache = cache = CameraCache(max_blocks=1)
            first = dit(*inputs, cam)
            assert set(cache.blocks) == {0} and cache.tokens is not None and cache.holds(cam, len(dit.blocks))
            calls[0].clear(), calls[1].clear()
            second = dit(io["x"][None], torch.tensor([250]), [io["context"]], io["y"][None], cam)
            seen = {i: len(c) for i, c in calls.items()}
            dit.camera_cache = None
            plain_t250 = dit(io["x"][None], torch.tensor([250]), [io["context"]], io["y"][None], cam)
    finally:
        dit.camera_cache = None
        for hook in hooks:
            hook.remove()
    assert seen == {0: 0, 1: 1}  # block 0 read back, block 1 computed from the kept tokens
    assert torch.equal(first, plain) and torch.equal(second, plain_t250)
    assert cache.nbytes() == sum(t.numel() * t.element_size() for t in (*cache.blocks[0], cache.tokens))


def test_a_slab_cache_holds_every_covered_block_in_one_tensor_and_frees_it_whole(dit, io):
    """A streamed Fast job frees its chunk's modulation before each decode: one allocation, not dozens."""
    cam = io["cam"]
    inputs = (io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None])
    with torch.no_grad():
        plain = dit(*inputs, cam)
        dit.camera_cache = cache = CameraCache(slab=True)
        try:
            first, second = dit(*inputs, cam), dit(*inputs, cam)
            slab = cache.slab
            assert slab.shape[:2] == (len(dit.blocks), 2)
            assert all(t.untyped_storage().data_ptr() == slab.untyped_storage().data_ptr()
                       for pair in cache.blocks.values() for t in pair)  # fmt: skip
            cache.clear()
            assert cache.slab.numel() == 0 and not cache.blocks
            again = dit(*inputs, cam)  # a new slab, the same numbers
        finally:
            dit.camera_cache = None
    assert torch.equal(first, plain) and torch.equal(second, plain) and torch.equal(again, plain)


def test_the_pipeline_caches_per_expert_gives_the_same_latent_and_frees_it(case):  # noqa: F811
    pipe, settings, example, io = case
    context, negative = pipe.encode_ids(io["ids"], io["mask"])
    poses, intrinsics = np.load(example / "poses.npy"), np.load(example / "intrinsics.npy")
    plucker = camera_conditioning(poses, intrinsics, 9, 48, 112).plucker
    expected = pipe.denoise(io["noise"], io["y"], context, negative, plucker, settings)
    seen: list[tuple[str, int]] = []
    pipe.plan.camera_cache = True
    try:

        def progress(phase, step, total):  # which expert holds a cache at each step
            if phase == "denoise" and step:
                seen.append(tuple(name for name, slot in pipe.experts.items()
                                  if slot.module is not None and slot.module.camera_cache is not None))  # fmt: skip

        cached = pipe.denoise(io["noise"], io["y"], context, negative, plucker, settings, progress)
    finally:
        pipe.plan.camera_cache = False
    assert torch.equal(cached, expected)
    assert set(seen) >= {("high",), ("high", "low")}  # the high expert's stays attached, emptied, after the boundary
    assert all(slot.module is None or slot.module.camera_cache is None for slot in pipe.experts.values())


def test_a_cancelled_job_frees_its_camera_cache(case):  # noqa: F811
    pipe, settings, example, io = case
    context, negative = pipe.encode_ids(io["ids"], io["mask"])
    plucker = camera_conditioning(
        np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), 9, 48, 112
    ).plucker

    class Cancelled(Exception):
        pass

    def progress(phase, step, total):
        if phase == "denoise" and step == 2:
            raise Cancelled

    pipe.plan.camera_cache = True
    try:
        with pytest.raises(Cancelled):
            pipe.denoise(io["noise"], io["y"], context, negative, plucker, settings, progress)
    finally:
        pipe.plan.camera_cache = False
    assert all(slot.module is None or slot.module.camera_cache is None for slot in pipe.experts.values())


def test_the_plan_caches_the_camera_only_where_it_fits():
    assert cache_gib(REFERENCE_TOKENS) == pytest.approx(25.0, abs=0.1)  # 40 blocks x 2 x 32,760 x 5,120 bf16
    for budget, expected in ((16, False), (24, False), (48, False), (80, True)):
        p = plan(budget)
        p.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)
        assert p.camera_cache is expected, budget
        assert ("camera modulation computed once" in p.describe()) is expected
    # the cache comes first; batched guidance only where it still fits beside it
    for budget, batched in ((54, False), (80, True)):
        p = plan(budget)
        p.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)
        assert p.keep_both_experts and p.camera_cache and p.batch_guidance is batched
        # the cache is freed before the VAE runs: the experts stay beside it, whole frames
        assert p.experts_beside_vae and p.vae_tile_pixels is None
    # no budget: decided from the card's own memory, with umT5 resident beside the experts
    big = plan_memory("cuda", None, expert_gib=NF4_EXPERT_GIB, gpu_total_gib=79.2, text_encoder_gib=10.6)
    small = plan_memory("cuda", None, expert_gib=NF4_EXPERT_GIB, gpu_total_gib=23.6, text_encoder_gib=10.6)
    assert big.camera_cache and not small.camera_cache
    assert not plan_memory("cpu", None, expert_gib=NF4_EXPERT_GIB).camera_cache
    assert camera_cache_gib(REFERENCE_TOKENS) > cache_gib(REFERENCE_TOKENS)
