"""Attention backend choice: SDPA here (no CUDA); optional kernels must be installed to be chosen."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from worldgen.errors import InputError
from worldgen.kernels.attention import OPTIONAL_MIN_KEYS, attention, resolve_backend


def test_auto_is_sdpa_without_flash_attn():
    expected = "flash" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert resolve_backend("auto") == expected
    assert resolve_backend("sdpa") == "sdpa"


@pytest.mark.skipif(importlib.util.find_spec("sageattention") is not None, reason="sageattention is installed")
def test_asking_for_a_missing_kernel_names_the_install():
    with pytest.raises(InputError, match="pip install sageattention"):
        resolve_backend("sage")
    with pytest.raises(InputError, match="unknown"):
        resolve_backend("xformers")


def test_sdpa_matches_explicit_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 3, 8, generator=g) for _ in range(3))
    weights = torch.softmax(torch.einsum("blnd,bmnd->bnlm", q, k) / 8**0.5, dim=-1)
    expected = torch.einsum("bnlm,bmnd->blnd", weights, v).flatten(2)
    torch.testing.assert_close(attention(q, k, v), expected, rtol=1e-5, atol=1e-5)
    # optional kernels cannot take CPU float32: they fall back to the same SDPA result
    assert torch.equal(attention(q, k, v, "sage"), attention(q, k, v))


@pytest.mark.cuda
def test_an_optional_kernel_that_fails_on_the_gpu_falls_back_to_sdpa():
    """A job asked for FlashAttention whose package then fails (here: missing) still runs, on SDPA."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("a FlashAttention package is installed here: nothing fails")
    from worldgen.kernels import attention as module

    module._failed.discard("flash")
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(1, OPTIONAL_MIN_KEYS, 2, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    with pytest.warns(UserWarning, match="--attention flash failed"):
        out = attention(q, k, v, "flash")
    assert torch.equal(out, attention(q, k, v, "sdpa")) and "flash" in module._failed


@pytest.mark.cuda
def test_flash_attention_takes_long_key_sequences_and_sdpa_the_text():
    """With FlashAttention installed, the video's self-attention runs it (the same attention as SDPA, other
    rounding); cross-attention's 512 text keys stay on SDPA, where it is faster (docs/benchmarks.md)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("no FlashAttention package installed")
    from worldgen.kernels import attention as module

    module._failed.discard("flash")
    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(1, 300, 4, 128, device="cuda", generator=g).bfloat16()
    for keys in (512, OPTIONAL_MIN_KEYS + 8):
        k, v = (torch.randn(1, keys, 4, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
        flash, sdpa = attention(q, k, v, "flash"), attention(q, k, v, "sdpa")
        if keys < OPTIONAL_MIN_KEYS:
            assert torch.equal(flash, sdpa)
        else:
            torch.testing.assert_close(flash, sdpa, rtol=2e-2, atol=2e-3)
    assert "flash" not in module._failed
