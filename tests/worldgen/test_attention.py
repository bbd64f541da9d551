"""Attention backend choice: SDPA here (no CUDA); optional kernels must be installed to be chosen."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import torch

from worldgen.errors import InputError
from worldgen.kernels import attention as attention_module
from worldgen.kernels.attention import OPTIONAL_MIN_KEYS, attention, resolve_backend


def _flash_usable() -> bool:
    return attention_module.installed("flash") and attention_module.import_error("flash") is None


def test_auto_is_sdpa_without_flash_attn():
    with warnings.catch_warnings():  # a FlashAttention that does not import warns (tested below)
        warnings.simplefilter("ignore")
        assert resolve_backend("auto") == ("flash" if _flash_usable() else "sdpa")
    assert resolve_backend("sdpa") == "sdpa"


@pytest.fixture
def broken_flash_attention(tmp_path, monkeypatch):
    """A FlashAttention 4 found on disk whose import fails, as one without its compiler's libraries did."""
    cute = tmp_path / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (cute / "__init__.py").write_text("raise ImportError('libcute_dsl_runtime.so: cannot open shared object file')\n")

    def flash_modules() -> dict:
        return {name: module for name, module in sys.modules.items() if name.split(".")[0] == "flash_attn"}

    real = flash_modules()  # a real FlashAttention imported by earlier tests: back in place afterwards
    for name in real:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    caches = (attention_module.import_error, attention_module._flash_attn_func)  # a real one's import, kept
    for cache in caches:
        cache.cache_clear()
    yield
    for name in flash_modules():
        del sys.modules[name]
    sys.modules.update(real)
    for cache in caches:
        cache.cache_clear()


def test_a_flash_attention_that_does_not_import_is_not_chosen(broken_flash_attention):
    assert attention_module.installed("flash")  # found on disk
    with pytest.warns(UserWarning, match="does not import .*libcute_dsl_runtime.*using PyTorch SDPA"):
        assert resolve_backend("auto") == "sdpa"
    with pytest.raises(InputError, match="--attention flash: .*does not import.*reinstall it"):
        resolve_backend("flash")


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
    """A job asked for FlashAttention whose package then fails (here: missing, or not importing) still runs,
    on SDPA."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if _flash_usable():
        pytest.skip("a working FlashAttention package is installed here: nothing fails")
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
    if not _flash_usable():
        why = attention_module.import_error("flash") if attention_module.installed("flash") else "not installed"
        pytest.skip(f"no working FlashAttention package here ({why})")
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
