"""Every hand-written Triton kernel of the engine compiles for the GPUs our users own, on the CPU: sm_80 (A100),
sm_86 (RTX 30xx, A-series), sm_89 (RTX 40xx, L40) and sm_90 (H100, H200), with Triton's own compiler and
`ptxas` (the triton wheel ships it; a dev dependency, so `make test` runs this).

The kernels are found, not listed: every `JITFunction` of the `worldgen.kernels` modules, each compiled from its
module's `SIGNATURES` (`worldgen.kernels.triton_lang.Signature`: one per variant its launches make), so a new
kernel without an entry fails here. A variant with e4m3 (Triton's fp8e4nv) compiles on 8.9+ only; on sm_80 and
sm_86 it is shown not to compile and not to be reached: the card decides (`compute_choice.auto_choice`, the FP8
path's `fp8.unsupported_reason`, the FP8 KV cache's `fused_triton.e4m3_kernels`), not the installed packages.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs Triton (a dev dependency: `make test` installs it)")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import worldgen.kernels  # noqa: E402
from worldgen.kernels import compute_choice, fp8, fused_triton  # noqa: E402
from worldgen.kernels.triton_lang import Signature  # noqa: E402

TARGETS = (80, 86, 89, 90)  # compute capabilities, major * 10 + minor
E4M3_TARGETS = (89, 90)
WARP_SIZE = 32


def engine_kernels() -> dict[str, tuple[JITFunction, tuple[Signature, ...] | None]]:
    """'module.kernel' -> (the kernel, its module's SIGNATURES entry or None) for every @triton.jit function
    defined in a module of worldgen.kernels."""
    found = {}
    for info in pkgutil.iter_modules(worldgen.kernels.__path__, "worldgen.kernels."):
        module = importlib.import_module(info.name)
        signatures = getattr(module, "SIGNATURES", {})
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and value.fn.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = (value, signatures.get(name))
    return found


KERNELS = engine_kernels()


def compile_for(kernel: JITFunction, signature: Signature, capability: int):
    """Triton's compile of one variant for a CUDA target, the way a launch compiles it (no GPU needed)."""
    constexpr_params = {p.name for p in kernel.params if p.is_constexpr}
    missing = constexpr_params - set(signature.constexprs)
    assert not missing, f"{kernel.__name__}: no value for the constexprs {sorted(missing)}"
    runtime = [name for name in kernel.arg_names if name not in signature.constexprs]
    types = signature.types.split()
    assert len(types) == len(runtime), f"{kernel.__name__}: {len(types)} types for the arguments {runtime}"
    full = {
        name: "constexpr" if name in signature.constexprs else types[runtime.index(name)] for name in kernel.arg_names
    }
    source = ASTSource(fn=kernel, signature=full, constexprs=signature.constexprs)
    return triton.compile(source, target=GPUTarget("cuda", capability, WARP_SIZE), options=dict(signature.options))


def assert_built_for(compiled, capability: int) -> None:
    assert {"ptx", "cubin"} <= set(compiled.asm), sorted(compiled.asm)
    assert compiled.asm["cubin"], "an empty cubin"
    target = re.search(r"^\.target (sm_\d+a?)", compiled.asm["ptx"], re.MULTILINE)
    assert target and re.fullmatch(rf"sm_{capability}a?", target[1]), target and target[1]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """A fresh Triton cache: every variant really compiled here, none loaded from an earlier run's disk cache."""
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path_factory.getbasetemp() / "triton-cache"))


def test_every_kernel_of_the_engine_has_signatures():
    assert len(KERNELS) >= 10, sorted(KERNELS)  # channel_norm, conv_bias, fp8, fused_triton (5), nf4 (2)
    without = [name for name, (_, signatures) in KERNELS.items() if not signatures]
    assert not without, f"kernels without a SIGNATURES entry in their module (triton_lang.Signature): {without}"
    for module in {name.rsplit(".", 1)[0] for name in KERNELS}:
        named = set(importlib.import_module(module).SIGNATURES)
        stale = named - {name.rsplit(".", 1)[1] for name in KERNELS if name.startswith(module + ".")}
        assert not stale, f"{module}.SIGNATURES names no kernel of the module: {sorted(stale)}"


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_kernel_compiles_for_the_cards_our_users_own(name):
    kernel, signatures = KERNELS[name]
    started = time.perf_counter()
    for signature in signatures or ():
        for capability in TARGETS:
            if signature.e4m3 and capability not in E4M3_TARGETS:
                # Triton has no e4m3 there: the variant must never be reached on such a card
                with pytest.raises(triton.CompilationError, match="fp8e4nv"):
                    compile_for(kernel, signature, capability)
                continue
            assert_built_for(compile_for(kernel, signature, capability), capability)
    assert time.perf_counter() - started < 60, "compiling took longer than it should on two cores"


def test_the_card_decides_that_no_e4m3_kernel_is_reached_below_8_9():
    assert any(s.e4m3 for _, signatures in KERNELS.values() for s in signatures or ())
    for capability in ((8, 0), (8, 6), (8, 7)):
        assert compute_choice.auto_choice(capability) == "int8"  # never fp8: the FP8 path's kernels
        assert not fused_triton.e4m3_kernels(capability)  # the FP8 KV cache runs its PyTorch functions
        assert capability < fp8.MIN_CAPABILITY  # `--compute fp8` is refused there (fp8.unsupported_reason)
    for capability in ((8, 9), (9, 0), (10, 0), (12, 0)):
        assert compute_choice.auto_choice(capability) == "fp8"
        assert fused_triton.e4m3_kernels(capability)
    assert compute_choice.auto_choice((8, 9), scaled_mm=False) == "int8"
    assert compute_choice.auto_choice((7, 5)) == compute_choice.auto_choice((6, 1)) == "exact"


def test_below_8_9_the_fused_functions_launch_no_e4m3_kernel(monkeypatch):
    """The FP8 KV cache's functions (any card may take that cache) and the FP8 path's ask the card first."""
    cuda = type("CudaTensor", (), {"is_cuda": True, "device": torch.device("cuda", 0)})()
    for capability, takes in (((8, 6), False), ((8, 9), True)):
        monkeypatch.setattr(fused_triton, "_capability", lambda device, c=capability: c)
        assert fused_triton._takes_e4m3(cuda) == takes

    launched = []
    monkeypatch.setattr(fused_triton, "_INTERPRETED", True)  # CPU tensors count as on the device
    monkeypatch.setattr(fused_triton, "launch", lambda kernel, *args, **kwargs: launched.append(kernel))
    x, kv = torch.randn(1, 8, 64), torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    data, scale = torch.empty(kv.shape, dtype=fused_triton.FP8), torch.ones(1, 8, 2, 1, dtype=torch.bfloat16)
    calls = {
        "quantize_per_token_into": lambda: fused_triton.quantize_per_token_into(kv, data, scale),
        "dequantize_per_token": lambda: fused_triton.dequantize_per_token(data, scale, torch.bfloat16),
        "requantize_per_tensor": lambda: fused_triton.requantize_per_tensor(data, scale),
        "quantize_tensor": lambda: fused_triton.quantize_tensor(kv),
        "residual_norm, quantized": lambda: fused_triton.residual_norm(
            x, None, None, None, None, None, None, None, 1e-6, torch.bfloat16, "fp8"
        ),
    }
    for capability, takes in (((8, 6), False), ((8, 0), False), ((9, 0), True)):
        monkeypatch.setattr(fused_triton, "_takes_e4m3", lambda t, c=capability: fused_triton.e4m3_kernels(c))
        for name, call in calls.items():
            launched.clear()
            out = call()
            kernels = 2 if name == "quantize_tensor" else 1  # its largest magnitude, then the cast
            assert (out is not None, len(launched)) == (takes, kernels * takes), (name, capability)
    for rows in ("", "int8"):  # an exact call, and the INT8 path's quantized one, launch below 8.9 too
        launched.clear()
        assert fused_triton.residual_norm(x, None, None, None, None, None, None, None, 1e-6, torch.bfloat16, rows)
        assert launched == [fused_triton._layer_norm_kernel]


def test_a_wrong_signature_fails():
    """The check can fail: a type missing, a constexpr missing, a pointer of the wrong element type."""
    kernel = fused_triton._scale_cast_kernel
    good = Signature("*bf16 *fp8e4nv *fp32 *fp32 i32", {"BLOCK": 4096}, {"num_warps": 8})
    assert_built_for(compile_for(kernel, good, 90), 90)
    with pytest.raises(AssertionError, match="types for the arguments"):
        compile_for(kernel, Signature("*bf16 *fp8e4nv *fp32 i32", {"BLOCK": 4096}), 90)
    with pytest.raises(AssertionError, match="BLOCK"):
        compile_for(kernel, Signature("*bf16 *fp8e4nv *fp32 *fp32 i32"), 90)
    with pytest.raises(triton.CompilationError):  # a scalar where the kernel loads through a pointer
        compile_for(kernel, Signature("*bf16 *fp8e4nv fp32 *fp32 i32", {"BLOCK": 4096}), 90)
    with pytest.raises(AssertionError):  # built for another card than asked
        assert_built_for(compile_for(kernel, good, 89), 90)
