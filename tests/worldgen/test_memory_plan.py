"""The per-job memory plan: what stays resident, for the sizes and budgets users run."""

from __future__ import annotations

import pytest
import torch

from worldgen.errors import InputError
from worldgen.memory import CUDA_CONTEXT_GIB, REFERENCE_PIXELS, REFERENCE_TOKENS, MemoryPlan, vae_peak_gib
from worldgen.pipeline import tokens_for

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
