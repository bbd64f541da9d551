"""The per-job memory plan: what stays resident, for the sizes and budgets users run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worldgen.errors import InputError
from worldgen.pipelines.base import tokens_for
from worldgen.runtime.cuda_memory import apply_memory_cap, use_expandable_segments
from worldgen.runtime.memory import (
    CUDA_CONTEXT_GIB,
    REFERENCE_PIXELS,
    REFERENCE_TOKENS,
    MemoryPlan,
    plan_memory,
    vae_peak_gib,
)

NF4_EXPERT_GIB = 8.9  # one synthetic full-size NF4 expert folder
TOKENS_720P, PIXELS_720P = tokens_for(81, 720, 1280), 720 * 1280


def plan(budget: float) -> MemoryPlan:
    return MemoryPlan(
        torch.device("cpu"), vram_budget_gb=budget, usable_gib=budget - CUDA_CONTEXT_GIB, expert_gib=NF4_EXPERT_GIB
    )


def test_480p_under_24_keeps_both_experts_and_whole_vae_frames():
    p = plan(24)
    p.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)
    assert p.keep_both_experts and not p.batch_guidance
    assert p.vae_tile_pixels is None
    assert not p.experts_beside_vae  # 2 x 8.9 GiB of experts leave no room for the decode: freed first


def test_480p_under_16_swaps_experts():
    p = plan(16)
    p.fit(REFERENCE_TOKENS, REFERENCE_PIXELS)
    assert not p.keep_both_experts and p.ffn_chunk_tokens == 8192
    assert p.vae_tile_pixels is None


def test_720p_under_24_swaps_experts_and_tiles_the_vae():
    p = plan(24)
    assert TOKENS_720P == 75_600
    assert p.fit(TOKENS_720P, PIXELS_720P)  # changed from the default
    assert not p.keep_both_experts
    assert p.vae_tile_pixels is not None and p.vae_tile_pixels < PIXELS_720P
    assert vae_peak_gib(p.vae_tile_pixels) <= p.usable_gib
    assert "tiles" in p.describe() and "75,600 tokens" in p.describe()


def test_a_job_too_big_for_the_budget_names_the_fix():
    p = plan(16)
    with pytest.raises(InputError, match="--size or --frame-num"):
        p.fit(tokens_for(161, 720, 1280), PIXELS_720P)


def test_no_budget_changes_nothing():
    p = MemoryPlan.unlimited("cpu")
    assert not p.fit(TOKENS_720P, PIXELS_720P)
    assert p.keep_both_experts and p.vae_tile_pixels is None


def test_plan_memory_is_pure_it_plans_for_a_gpu_without_touching_cuda():
    """The planner decides from numbers only: a 24 GiB plan for an 80 GiB "cuda" device is made on a
    CPU-only torch, and nothing is capped until `apply_memory_cap` is called."""
    p = plan_memory("cuda:0", 24, 64, expert_gib=NF4_EXPERT_GIB, checkpoint_kind="nf4", gpu_total_gib=80.0)
    assert p.device == torch.device("cuda:0") and p.usable_gib == 24 - CUDA_CONTEXT_GIB
    assert p.keep_both_experts and p.stream_text_encoder and not p.keep_text_encoder
    assert p.ram_budget_gb == 64 and "480p" in p.notes[0] and "nf4" in p.notes[0]
    assert p.job == f"{REFERENCE_TOKENS:,} tokens, {REFERENCE_PIXELS:,} pixels per frame"
    q = plan_memory("cuda:0", 16, expert_gib=NF4_EXPERT_GIB, gpu_total_gib=80.0)
    assert not q.keep_both_experts and q.ffn_chunk_tokens == 8192


def test_plan_memory_without_a_budget_keeps_everything():
    for device, budget in (("cpu", 16), ("cuda", None)):
        p = plan_memory(device, budget, expert_gib=NF4_EXPERT_GIB)
        assert p.usable_gib is None and p.vram_budget_gb is None
        assert p.keep_both_experts and p.keep_vae and p.keep_text_encoder and not p.stream_text_encoder


def test_plan_memory_text_encoder_on_cpu_streams_it():
    p = plan_memory("cuda", None, text_encoder_on_cpu=True)
    assert p.text_encoder_device == torch.device("cpu") and p.stream_text_encoder and not p.keep_text_encoder


def test_plan_memory_refuses_what_cannot_fit_naming_the_fix():
    with pytest.raises(InputError, match="more than this GPU has"):
        plan_memory("cuda", 100, expert_gib=NF4_EXPERT_GIB, gpu_total_gib=80.0)
    with pytest.raises(InputError, match="lingbot-isaac quantize"):
        plan_memory("cuda", 24, expert_gib=34.0, checkpoint_kind="bf16", gpu_total_gib=80.0)


def test_apply_memory_cap_without_a_budget_touches_nothing():
    apply_memory_cap(plan_memory("cpu", 16))  # a CPU plan has no cap: would raise on a CPU-only torch otherwise
    apply_memory_cap(MemoryPlan.unlimited("cuda"))


@pytest.mark.cuda
def test_the_allocator_cap_is_the_budget_less_the_cuda_context():
    """Under --vram-budget B this process may reserve B less the context, as on a card of B GiB."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the cap is the CUDA allocator's)")
    budget = 6.0
    apply_memory_cap(MemoryPlan(torch.device("cuda"), vram_budget_gb=budget, usable_gib=budget - CUDA_CONTEXT_GIB))
    try:
        torch.cuda.empty_cache()
        # what earlier tests of this process still hold counts against the cap as well (0.35 GiB in a
        # run of the GPU test files on the H200, which made the 'fits' allocation fail)
        room = (budget - CUDA_CONTEXT_GIB) * 2**30 - torch.cuda.memory_reserved()
        fits = torch.empty(int(room - 0.2 * 2**30), dtype=torch.uint8, device="cuda")
        del fits
        torch.cuda.empty_cache()
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(room + 0.2 * 2**30), dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def test_a_users_own_allocator_settings_win(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    assert use_expandable_segments() is False
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    assert use_expandable_segments() is False


def test_expandable_segments_are_set_through_torch_and_leave_the_environment_to_the_user(monkeypatch):
    """The setting goes through PyTorch's runtime setter: the environment variable, read once when the allocator
    first parses its settings, did nothing when set after CUDA was touched (docs/benchmarks.md, "Session 36"), and
    writing it ourselves would read back as the user's own choice (so the setter was skipped)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert use_expandable_segments() is True
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ


@pytest.mark.cuda
def test_expandable_segments_hold_when_cuda_was_touched_first():
    """In a fresh process that asks the GPU's name first (as bench_fast does before it loads): its segments are
    expandable (the environment variable set at that point left them fixed: a 24 GiB Fast fp8 job then ran out of
    memory with 2.67 GiB reserved but unallocated)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the segments are the CUDA allocator's)")
    script = (
        "import torch\n"
        "torch.cuda.get_device_name(0)\n"
        "from worldgen.runtime.cuda_memory import use_expandable_segments\n"
        "assert use_expandable_segments()\n"
        "x = torch.empty(1 << 26, device='cuda')\n"
        "print(all(s['is_expandable'] for s in torch.cuda.memory_snapshot()))\n"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


def test_to_device_on_the_cpu_is_a_plain_copy_of_the_values():
    from worldgen.runtime.cuda_memory import to_device

    noise = torch.randn(16, 8, 4, 6)
    chunk = noise[:, 2:6]  # a strided view, as the Fast loop's chunk of noise
    moved = to_device(chunk, torch.device("cpu"))
    assert torch.equal(moved, chunk)


@pytest.mark.cuda
def test_to_device_copies_a_strided_chunk_through_pinned_memory_without_waiting():
    """The values arrive (once the stream gets there), from a pinned block of the chunk's own size, not the span its
    strides reach; the host does not wait for work queued before the copy."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from worldgen.runtime.cuda_memory import to_device

    noise = torch.randn(16, 40, 58, 104)
    chunk = noise[:, 8:12]
    busy = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    for _ in range(20):  # ~0.1 s of queued work before the copy
        busy = busy @ busy / 8192
    products_done = torch.cuda.Event()
    products_done.record()
    moved = to_device(chunk, torch.device("cuda"))
    waited = products_done.query()  # a pageable copy would have waited for the products: done by now
    assert torch.equal(moved.cpu(), chunk) and not waited


def test_releasing_the_pinned_cache_without_cuda_does_nothing():
    from worldgen.runtime.cuda_memory import release_pinned_cache

    if torch.cuda.is_available():
        pytest.skip("the CPU's answer (a GPU machine has pinned memory to release)")
    assert release_pinned_cache() is None


@pytest.mark.cuda
def test_the_pinned_cache_goes_back_and_blocks_in_use_stay():
    """PyTorch's host allocator keeps a freed pinned block for reuse at its size; released, it is gone from the
    process (its bytes out of the allocator's count) and a block still in use is left as it was."""
    from worldgen.runtime.cuda_memory import release_pinned_cache

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (pinned memory is CUDA's)")
    release_pinned_cache()
    kept = torch.full((2**20,), 7, dtype=torch.uint8, pin_memory=True)  # 1 MiB, in use throughout
    freed = torch.empty(64 * 2**20, dtype=torch.uint8, pin_memory=True)
    del freed  # cached by PyTorch, not returned
    held = torch.cuda.memory.host_memory_stats()["allocated_bytes.current"]
    assert release_pinned_cache() == pytest.approx(64 / 1024, abs=1e-3)
    assert torch.cuda.memory.host_memory_stats()["allocated_bytes.current"] == held - 64 * 2**20
    assert kept.is_pinned() and bool((kept == 7).all())
