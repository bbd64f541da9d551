"""The compile cache lives under the project's cache root, and doctor says whether it is warm."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import pythonpath_with_repo
from worldgen.runtime import compile_cache


def test_the_compile_cache_is_under_the_cache_root_and_says_cold_then_warm(tmp_path, monkeypatch):
    monkeypatch.setenv("LINGBOT_ISAAC_CACHE", str(tmp_path))
    for name in (
        compile_cache.INDUCTOR_ENV,
        compile_cache.TRITON_ENV,
        compile_cache.FLASH_ENV,
        compile_cache.FLASH_SWITCH,
    ):
        monkeypatch.delenv(name, raising=False)
    inductor, triton, flash = compile_cache.use_persistent_cache()
    folders = (inductor, triton, flash)
    assert folders == tuple(tmp_path / "compile" / name for name in ("inductor", "triton", "flash-attn"))
    assert os.environ[compile_cache.TRITON_ENV] == str(triton)
    assert os.environ[compile_cache.FLASH_ENV] == str(flash) and os.environ[compile_cache.FLASH_SWITCH] == "1"
    assert compile_cache.cache_state().startswith("cold")
    (triton / "abc").mkdir(parents=True)
    (triton / "abc" / "kernel.cubin").write_bytes(b"\0" * 2048)
    assert compile_cache.cache_state().startswith("warm (1 compiled kernels")
    (flash / "fingerprint").mkdir(parents=True)  # FlashAttention 4's object files
    (flash / "fingerprint" / "fwd.o").write_bytes(b"\0" * 2048)
    (flash / "fingerprint" / "fwd.lock").write_bytes(b"")
    assert compile_cache.cache_state().startswith("warm (2 compiled kernels")
    monkeypatch.setenv(compile_cache.TRITON_ENV, str(tmp_path / "mine"))  # the user's own folder is kept
    assert compile_cache.use_persistent_cache()[1] == tmp_path / "mine"


def test_doctor_prints_the_compile_cache_state(tmp_path):
    env = {**os.environ, "LINGBOT_ISAAC_CACHE": str(tmp_path), "PYTHONPATH": pythonpath_with_repo()}
    env.pop(compile_cache.INDUCTOR_ENV, None)
    env.pop(compile_cache.TRITON_ENV, None)
    env.pop(compile_cache.FLASH_ENV, None)
    out = subprocess.run([sys.executable, "-m", "lingbot_cli", "doctor"], env=env, capture_output=True, text=True)
    assert (
        f"compile  cache cold (nothing compiled yet: the first job compiles its kernels) in {tmp_path / 'compile'}"
        in out.stdout
    ), out.stdout + out.stderr


def test_compiled_kernels_keep_more_variants_than_dynamos_default():
    import torch._dynamo.config as dynamo_config

    from worldgen.kernels import fused

    fused._compiled(fused.gated_residual.eager)  # building the compiled function (nothing compiles yet)
    assert dynamo_config.recompile_limit >= fused.RECOMPILE_LIMIT == 64


def test_fused_kernels_compile_with_one_triton_config_and_no_setting_this_torch_lacks(monkeypatch):
    import torch._inductor.config as inductor_config

    from worldgen.kernels import fused

    known = inductor_config.get_config_copy()
    options = fused.compile_options()
    # where this PyTorch has them: no pointwise autotuning, no timing runs to pick reduction configs
    assert {k: v for k, v in {"triton.autotune_pointwise": False, "deterministic": True}.items() if k in known} == (
        options or {}
    )
    monkeypatch.setitem(fused.COMPILE_OPTIONS, "no_such_inductor_setting", 1)  # a newer or older PyTorch's name
    assert "no_such_inductor_setting" not in (fused.compile_options() or {})
