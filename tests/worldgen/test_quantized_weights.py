"""A dense Linear's 8-bit weight held in place of its bf16 one (worldgen/kernels/quantized_weights.py), for fp8 as
for int8 (tests/worldgen/test_int8_kernels.py has int8's): made once with the numbers of the per-call quantization
it replaces, the bf16 weight freed and restored bit for bit when another compute is set, few-row calls W8A16.
The FP8 GEMM itself needs a GPU (`fp8.wants_fp8` asks for CUDA): here the weights are made as its first call makes
them (`Fp8Weight.of`), on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from contracts.model_families import V2_FAST
from contracts.settings import GenerationSettings
from tests.worldgen.numerics import rel_l2
from worldgen.kernels import fp8, int8, quantized_weights
from worldgen.kernels.fp8 import Fp8Weight
from worldgen.models.dit import Linear
from worldgen.pipelines.fast_plan import FastOptions
from worldgen.runtime.checkpoint import load_expert


def _linear() -> Linear:
    torch.manual_seed(0)
    return Linear(64, 48).to(torch.bfloat16)


def test_a_linear_drops_its_weight_for_fp8_and_gets_it_back_from_a_cpu_copy():
    lin = _linear()
    weight = lin.weight.detach().clone()
    made = Fp8Weight.of(lin)
    q, scale = fp8.quantize_rows(weight)  # what every FP8 call computed before: the same numbers, once
    assert made.data.dtype == fp8.FP8 and torch.equal(made.data.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(made.scale, scale)
    assert Fp8Weight.of(lin) is made  # kept on the Linear
    assert lin.weight.numel() == 0 and quantized_weights.dropped(lin)  # only the e4m3 weight is held now
    assert lin.weight.dtype == torch.bfloat16  # the compute dtype the Linear reads from it stays
    lin.compute = "fp8"
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():  # too few rows for the FP8 GEMM (and no GPU): W8A16 from the e4m3 weight
        few = lin(x)
    assert torch.equal(few, F.linear(x, made.dequantize(torch.bfloat16), lin.bias))
    assert 0 < rel_l2(few.float(), F.linear(x.float(), weight.float(), lin.bias.float())) < 0.05
    with pytest.raises(RuntimeError, match="holds a fp8 weight and is asked for a int8 one"):
        int8.Int8Weight.of(lin)
    model = torch.nn.Sequential(lin)
    assert quantized_weights.restore_exact_weights(model, keep="fp8") == 0  # fp8 again: its weights stay
    assert quantized_weights.held(lin) is made
    assert quantized_weights.restore_exact_weights(model, keep="exact") == 1
    assert torch.equal(lin.weight, weight) and quantized_weights.held(lin) is None
    assert not quantized_weights.dropped(lin) and lin._exact_on_cpu is None


def test_a_weight_made_while_compiling_ahead_is_not_kept(monkeypatch):
    """Inside `triton_lang.compiling_ahead` a Triton launch writes nothing: the dry call's weight is not kept and
    the bf16 one stays (the job's first call makes the real one)."""
    monkeypatch.setattr(quantized_weights, "deferring", lambda: True)
    lin = _linear()
    assert Fp8Weight.of(lin) is not None
    assert quantized_weights.held(lin) is None and lin.weight.numel() == 64 * 48


def test_a_model_switched_to_fp8_and_back_computes_exactly_as_before(golden):
    """The tiny DiT in bf16: its fp8 weights made (as its FP8 GEMMs' first calls make them), its bf16 weights
    dropped; the few-row W8A16 forward on the CPU is close to exact, not equal; set back to exact, the weights
    are read again from the checkpoint's file and every output bit is what it was."""
    io = load_file(golden / "dit" / "io.safetensors")
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = (io["x"][None].bfloat16(), torch.tensor([900]), [io["context"].bfloat16()], io["y"][None].bfloat16())
    inputs += (io["cam"].bfloat16(),)
    with torch.no_grad():
        exact = model(*inputs)
        model.set_compute("fp8")
        linears = [m for block in model.blocks for m in block.modules() if isinstance(m, Linear)]
        for linear in linears:
            Fp8Weight.of(linear)
        assert all(quantized_weights.dropped(m) and getattr(m, "_exact_on_cpu", None) is None for m in linears)
        model.set_compute("fp8")  # the same compute again (a job naming it): the e4m3 weights stay
        assert all(quantized_weights.dropped(m) for m in linears)
        dropped = model(*inputs)
        assert 0 < rel_l2(dropped.float(), exact.float()) < 0.1
        model.set_compute("exact")
        assert not any(quantized_weights.held(m) is not None for m in linears)
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert torch.equal(model(*inputs), exact)


@pytest.mark.cuda
def test_on_a_gpu_the_held_fp8_weight_gives_the_per_call_numbers():
    """The FP8 GEMM with the e4m3 weight made once is bit for bit the GEMM that quantized the bf16 weight on
    every call (what fp8 did before), and the bf16 weight is gone from the device after the first call."""
    if not torch.cuda.is_available() or fp8.unsupported_reason("cuda") is not None:
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability 8.9+)")
    torch.manual_seed(0)
    lin = Linear(1536, 8960).to("cuda", torch.bfloat16)
    lin.compute = "fp8"
    weight = lin.weight.detach().clone()
    x = torch.randn(2, 600, 1536, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        per_call = fp8.fp8_linear(x, weight, lin.bias)
        first, again = lin(x), lin(x)
        few = lin(x[:, :3])  # too few rows for the FP8 GEMM: W8A16 from the e4m3 weight
    assert torch.equal(first, per_call) and torch.equal(again, per_call)
    assert quantized_weights.dropped(lin) and lin.weight.numel() == 0
    deq = quantized_weights.held(lin).dequantize(torch.bfloat16)
    assert torch.equal(few, F.linear(x[:, :3], deq, lin.bias))
    assert quantized_weights.restore_exact_weights(torch.nn.Sequential(lin)) == 1 and torch.equal(lin.weight, weight)


@pytest.mark.parametrize("compute", ["fp8", "int8"])
def test_a_planned_job_makes_the_block_weights_the_plan_counts_before_its_first_forward(golden, compute):
    """`FastPipeline.plan_job` makes every 8-bit weight `resident_dit_gib` counts (the blocks' dense Linears) at
    once, the bf16 ones dropped before the job's tensors exist: the weights the first GEMMs would have made. A job
    too small for the 8-bit GEMMs (the plan counts bf16) and a model not loaded make none."""
    from tests.worldgen.test_small_budget import _plan_1_3b
    from worldgen.pipelines.fast_plan import make_block_weights

    weight_type = {"fp8": Fp8Weight, "int8": int8.Int8Weight}[compute]
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.bfloat16)
    linears = [m for block in model.blocks for m in block.modules() if isinstance(m, Linear)]
    bf16 = [m.weight.detach().clone() for m in linears]
    pipe, _ = _plan_1_3b(8.0, compute)  # the 1.3B's plan under 8 GiB (the tiny model stands in for its weights)
    slot = pipe.residency.slot("fast")
    pipe.plan_job(20, 58, 104, FastOptions.from_settings(GenerationSettings(model="fast"), 1508, V2_FAST))
    assert not any(quantized_weights.held(m) for m in linears)  # the DiT not loaded yet: nothing to make
    slot.module = model
    pipe.plan_job(20, 14, 16, FastOptions.from_settings(GenerationSettings(model="fast"), 56, V2_FAST))
    assert not any(quantized_weights.held(m) for m in linears)  # 224 tokens a chunk: bf16 GEMMs, weights
    pipe.plan_job(20, 58, 104, FastOptions.from_settings(GenerationSettings(model="fast"), 1508, V2_FAST))
    assert linears and all(quantized_weights.dropped(m) for m in linears)
    for linear, weight in zip(linears, bf16, strict=True):
        made = quantized_weights.held(linear)
        data, scale = weight_type.quantize(weight)
        assert isinstance(made, weight_type) and torch.equal(made.data.view(torch.uint8), data.view(torch.uint8))
        assert torch.equal(made.scale, scale)
    assert make_block_weights(model, compute) == 0  # made once
