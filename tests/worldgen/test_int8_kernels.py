"""The INT8 path's kernels and weights on the CPU (worldgen/kernels/int8.py, int8_triton.py): the per-token
quantization's reference math against a plain PyTorch computation (round half to even included); the Triton
kernels under Triton's interpreter against that reference; a Linear's bf16 weight dropped once its int8 one is
made and restored bit for bit when another compute is asked for (from the checkpoint's file, or a CPU copy);
the switch that builds our Triton kernels for sm_80 on a newer card."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.worldgen.numerics import rel_l2
from worldgen.kernels import int8, quantized_weights, triton_lang
from worldgen.models.dit import Linear
from worldgen.runtime.checkpoint import load_expert

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_quantization_is_plain_pytorch_math():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 200, generator=g) * 5
    x[0] = 0.0  # an all-zero row: the scale's floor, no division by zero
    x[1, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1: the halves round to even (0, 2, -2)
    x[1, 4:] = 0.25
    q, scale = int8.quantize_tokens(x)
    want_scale = torch.stack([row.abs().max().clamp(min=1e-12) / 127.0 for row in x])
    assert torch.equal(scale.view(-1), want_scale) and scale[1].item() == 1.0
    assert q.dtype == torch.int8 and q.abs().max().item() == 127
    assert q[0].abs().sum() == 0 and q[1, :4].tolist() == [127, 0, 2, -2] and (q[1, 4:] == 0).all()
    quotients = x / scale  # float32 division, as the kernel's; then Python's round(), half to even too
    want = torch.tensor([[round(v) for v in row] for row in quotients.tolist()])
    assert torch.equal(q.long(), want.clamp(-127, 127))
    assert torch.equal(q, int8.quantize_rows(x)[0])


def test_the_feed_forward_input_is_quantized_after_its_gelu(monkeypatch):
    monkeypatch.setattr(int8, "MIN_ROWS", 1)
    lin = Linear(96, 32)
    lin.compute = "int8"
    x = torch.randn(2, 8, 96)
    rows = int8.gelu_then_quantize(x, lin)
    assert isinstance(rows, int8.Int8Rows) and rows.lead == (2, 8)
    q, s = int8.quantize_rows(F.gelu(x, approximate="tanh").view(-1, 96))
    assert torch.equal(rows.data, q) and torch.equal(rows.scale, s)
    assert lin(rows).shape == (2, 8, 32)  # a Linear takes the quantized rows as they are
    lin.compute = "exact"
    assert torch.equal(int8.gelu_then_quantize(x, lin), F.gelu(x, approximate="tanh"))


_INTERPRETED_CHECKS = """
import torch, torch.nn.functional as F
from worldgen.kernels import int8, int8_triton as K
g = torch.Generator().manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    x = (torch.randn(37, 300, generator=g) * 3).to(dtype)
    x[4] = 0
    q, s = K.quantize_rows(x)
    rq, rs = int8.quantize_rows(x)
    assert torch.equal(q, rq) and torch.equal(s, rs), dtype
x = (torch.randn(37, 300, generator=g) * 3).to(torch.bfloat16)
q, s = K.quantize_rows(x, gelu=True)
rq, rs = int8.quantize_rows(F.gelu(x, approximate="tanh"))
# the kernel's tanh GELU and PyTorch's differ by float32 ulps: a bf16 step at most, then one int8 step at most
assert (q.int() - rq.int()).abs().max() <= 1 and torch.allclose(s, rs, rtol=2 ** -7, atol=0)
a = torch.randint(-127, 128, (40, 96), generator=g, dtype=torch.int8)
w = torch.randint(-127, 128, (72, 96), generator=g, dtype=torch.int8)
xs, ws, b = torch.rand(40, 1, generator=g), torch.rand(72, 1, generator=g), torch.randn(72, generator=g)
acc = a.int() @ w.int().T
want = (acc.float() * xs) * ws.view(1, -1) + b
assert torch.equal(K.dequantize(acc, xs, ws, b, torch.float32), want)
assert torch.equal(K.dequantize(acc, xs, ws, None, torch.float32), (acc.float() * xs) * ws.view(1, -1))
for tma in (False, True):  # pointer loads (every card) and TMA descriptors (Hopper), rows past the end included
    small = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2, "TMA": tma}
    K.gemm_config = lambda capability, small=small: dict(small)  # the interpreter runs every tile in numpy: small ones
    assert torch.equal(K.gemm(a, w, xs, ws, b, torch.float32, (9, 0)), want), tma
from worldgen.kernels import fused_triton
x = torch.randn(2, 5, 300, generator=g) * 2  # the residual stream, float32; the norm's int8 rows bit for bit
shift, scale = torch.randn(2, 1, 300, generator=g) * 0.1, torch.randn(2, 1, 300, generator=g) * 0.1
norm = (None, None, None, shift, scale, None, None, 1e-6, torch.bfloat16)
_, (q, s) = fused_triton.residual_norm(x, *norm, "int8")
_, h = fused_triton.residual_norm(x, *norm, "")
rq, rs = int8.quantize_rows(h.reshape(-1, 300))
assert q.dtype == torch.int8 and torch.equal(q.view(-1, 300), rq) and torch.equal(s.view(-1, 1), rs)
print("interpreted kernels: ok")
"""


@pytest.mark.slow
def test_the_triton_kernels_give_the_reference_numbers_under_the_interpreter():
    """Triton's interpreter (numpy) runs the kernels on CPU tensors: the quantization bit for bit (alone and in
    the residual norm's kernel), the epilogue and the whole GEMM bit for bit in float32 (the interpreter rounds to bf16 by truncation, a GPU to nearest: bf16
    outputs are compared on the GPU, bench/bench_int8.py)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INTERPRETED_CHECKS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_a_linear_drops_its_weight_for_int8_and_gets_it_back_from_a_cpu_copy(monkeypatch):
    monkeypatch.setattr(int8, "MIN_ROWS", 8)
    lin = Linear(64, 48)
    weight = lin.weight.detach().clone()
    lin.compute = "int8"
    x = torch.randn(20, 64)
    with torch.no_grad():
        exact = F.linear(x, weight, lin.bias)
        many = lin(x)
    assert lin.weight.numel() == 0 and quantized_weights.dropped(lin)  # only the int8 weight is held now
    assert 0 < rel_l2(many, exact) < 1.6e-2
    with torch.no_grad():  # a few rows after the drop: W8A16 from the int8 weight, close to exact
        few = lin(x[:3])
    deq = quantized_weights.held(lin).dequantize(torch.float32)
    assert torch.allclose(few, F.linear(x[:3], deq, lin.bias), atol=1e-6)
    model = torch.nn.Sequential(lin)
    assert quantized_weights.restore_exact_weights(model) == 1
    held = quantized_weights.held(lin)
    assert torch.equal(lin.weight, weight) and held is None and not quantized_weights.dropped(lin)


def test_a_loaded_model_gets_its_exact_weights_back_from_the_checkpoint(golden, monkeypatch):
    monkeypatch.setattr(int8, "MIN_ROWS", 1)
    folder = golden / "v2" / "fast" / "ckpt_1p3b" / "transformers"
    dit = load_expert(folder, "cpu", torch.float32)
    before = {k: v.clone() for k, v in dit.state_dict().items()}
    linears = [m for m in dit.modules() if isinstance(m, Linear)]
    assert linears and all(m.exact_from_file for m in linears)
    dit.set_compute("int8")
    with torch.no_grad():
        x = torch.randn(1, 40, dit.cfg.dim)
        for block in dit.blocks:
            block.ffn[0](x)
            block.self_attn.q(x)
    gone = [m for m in linears if quantized_weights.dropped(m)]
    assert len(gone) == 2 * len(dit.blocks) and all(getattr(m, "_exact_on_cpu", None) is None for m in gone)
    dit.set_compute("exact")  # read back from the checkpoint's file: bit for bit
    after = dit.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(quantized_weights.dropped(m) or quantized_weights.held(m) is not None for m in linears)


def test_the_sm80_switch_builds_for_sm80_and_loads_the_ptx(monkeypatch):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from worldgen.kernels import int8_triton

    monkeypatch.setattr(triton_lang, "FORCED_TARGET", 80)
    assert triton_lang.capability(0) == (8, 0)  # our dispatch decides as on an A100: no e4m3
    assert int8_triton.gemm_config(triton_lang.capability(0))["BLOCK_K"] == 64
    from worldgen.kernels import fused_triton

    assert not fused_triton.e4m3_kernels(triton_lang.capability(0))
    kernel, signature = int8_triton._gemm_kernel, int8_triton.SIGNATURES["_gemm_kernel"][0]  # every card's tiles
    types = iter(signature.types.split())
    source = ASTSource(
        fn=kernel,
        signature={n: "constexpr" if n in signature.constexprs else next(types) for n in kernel.arg_names},
        constexprs=signature.constexprs,
    )
    options = {k: v for k, v in signature.options.items() if k != "enable_fp_fusion"}
    h200 = GPUTarget("cuda", 90, 32)  # the card's target, as a launch on an H200 asks
    native = triton.compile(source, target=h200, options=options)
    assert "wgmma" in native.asm["ptx"]  # Hopper's code path
    monkeypatch.setattr(triton.knobs.runtime, "override_arch", "sm80")  # what force_target(80) sets
    forced = triton.compile(source, target=h200, options=options)
    assert "wgmma" not in forced.asm["ptx"] and "mma.sync" in forced.asm["ptx"]  # Ampere's, on the H200
    assert forced.metadata.arch == "sm80"
    # Triton 3.7 writes that code path's PTX and cubin for the card itself: the cubin loads as it is
    assert triton_lang.binary_for(forced, (9, 0)) == forced.asm["cubin"]
    older = type("Compiled", (), {"asm": {"ptx": "//\n.version 8.0\n.target sm_80\n", "cubin": b"elf"}})()
    assert triton_lang.binary_for(older, (9, 0)) == b"//\n.version 8.0\n.target sm_80\n\0"  # PTX, for the driver
    assert triton_lang.binary_for(older, (8, 0)) == b"elf"
    monkeypatch.setenv(triton_lang.TARGET_SWITCH, "hopper")
    with pytest.raises(ValueError, match="sm80"):
        triton_lang._forced_target()


def test_q_k_and_v_share_one_quantization_of_their_input(monkeypatch):
    """`int8.shared_input` (the self-attention's normed input, `Block.residual_norm`): quantized once for the three
    Linears that read it, each giving what it gives from the bf16 input; left as it is where no W8A8 GEMM runs."""
    monkeypatch.setattr(int8, "MIN_ROWS", 8)
    torch.manual_seed(0)
    linears = [Linear(64, 48) for _ in range(3)]
    for linear in linears:
        linear.compute = "int8"
    x = torch.randn(2, 20, 64)
    rows = int8.shared_input(x, linears[0])
    assert isinstance(rows, int8.Int8Rows) and rows.shape == x.shape
    with torch.no_grad():
        assert all(torch.equal(linear(rows), linear(x)) for linear in linears)
    assert int8.shared_input(rows, linears[0]) is rows
    few = torch.randn(1, 3, 64)
    assert int8.shared_input(few, linears[0]) is few  # too few rows: the exact GEMM's input
    linears[0].compute = "exact"
    assert int8.shared_input(x, linears[0]) is x


@pytest.mark.cuda
def test_the_reference_quantization_gives_the_cpus_bits_on_cuda():
    """On CUDA PyTorch divides by a Python number as a product with its reciprocal (an ulp off for some rows): the
    reference divides by a tensor, so a weight quantized on the GPU is the one the CPU and our kernels make."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4096, 512, generator=g) * torch.logspace(-3, 2, 4096)[:, None]
    for block in (None, 128):
        q, scale = int8.quantize_rows(x, block)
        q_cuda, scale_cuda = int8.quantize_rows(x.cuda(), block)
        assert torch.equal(scale_cuda.cpu(), scale) and torch.equal(q_cuda.cpu(), q)


@pytest.mark.cuda
def test_the_whole_gemm_gives_the_int_mm_and_epilogue_bits_on_cuda(monkeypatch):
    """Our one-kernel GEMM (the card's tiles, TMA on Hopper, and every card's pointer loads) against cuBLASLt's
    int32 product and the one-pass epilogue: the same bf16 bits, rows past the last full tile included, and from
    the third call on through the direct launcher (a TMA descriptor is part of the call's variant key)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from worldgen.kernels import int8_triton

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    card = torch.cuda.get_device_capability()
    configs = {str(c): c for c in (int8_triton.gemm_config((8, 0)), int8_triton.gemm_config(card))}
    for rows, n, k in ((6032, 1536, 1536), (6032, 8960, 1536), (300, 72, 96)):
        a = torch.randint(-127, 128, (rows, k), generator=g, device=dev, dtype=torch.int8)
        w = torch.randint(-127, 128, (n, k), generator=g, device=dev, dtype=torch.int8)
        xs = torch.rand(rows, 1, generator=g, device=dev) / 100
        ws = torch.rand(n, 1, generator=g, device=dev) / 100
        b = torch.randn(n, generator=g, device=dev).to(torch.bfloat16)
        want = int8_triton.dequantize(torch._int_mm(a, w.t()), xs, ws, b, torch.bfloat16)
        for config in configs.values():
            monkeypatch.setattr(int8_triton, "gemm_config", lambda capability, config=config: dict(config))
            direct = triton_lang.counts.direct
            for _ in range(3):
                got = int8_triton.gemm(a, w, xs, ws, b, torch.bfloat16, card)
                assert torch.equal(got, want), (rows, n, k, config)
            assert triton_lang.counts.direct > direct, config
