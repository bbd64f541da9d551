"""The INT8 compute path (`--compute int8`, worldgen/kernels/int8.py) on the CPU: its reference math
(the integer products CUDA's INT8 GEMM computes), its distance from exact on the LingBot-World 2.0
golden loops against a bound measured here, and `--compute auto`'s choice.

Bounds (measured 2026-11-28 on this CPU, then 1.5x): a chunk's latent of the golden v2 causal-fast loops
with every Linear and the self-attention in 8 bits is 2.9e-3 to 3.3e-3 (rel-L2) from exact's -> 5e-3; a
512 -> 384 Linear of random weights 1.05e-2 -> 1.6e-2; attention over keys offset by 3 (smoothing at
work) 1.21e-2 -> 1.8e-2."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from contracts.model_families import V2_FAST
from contracts.settings import GenerationSettings
from tests.worldgen.numerics import rel_l2
from worldgen.kernels import int8, quantized_weights
from worldgen.kernels.compute_choice import auto_compute
from worldgen.models.dit import Linear
from worldgen.pipelines.fast import FastPipeline
from worldgen.pipelines.fast_plan import FastOptions
from worldgen.runtime.checkpoint import load_expert
from worldgen.runtime.residency import ModelSlot

LOOP_BOUND = 5e-3
GEMM_BOUND = 1.6e-2
ATTENTION_BOUND = 1.8e-2


@pytest.fixture
def every_linear(monkeypatch):
    """The tiny golden models' calls are few tokens: let every Linear take the 8-bit path (the knob the
    FP8 parity runs turn too)."""
    monkeypatch.setattr(int8, "MIN_ROWS", 1)


def test_the_gemm_is_the_integer_product_of_the_quantized_operands():
    g = torch.Generator().manual_seed(1)
    a, b = (
        torch.randint(-127, 128, (40, 64), generator=g, dtype=torch.int8),
        torch.randint(-127, 128, (24, 64), generator=g, dtype=torch.int8),
    )
    assert torch.equal(int8.int_matmul(a, b), a.int() @ b.int().T)
    lin = Linear(64, 24)
    x = torch.randn(300, 64, generator=g)
    xq, xs = int8.quantize_rows(x)
    wq, ws = int8.quantize_rows(lin.weight.detach())
    expected = (xq.double() @ wq.double().T) * xs.double() * ws.double().T + lin.bias.double()
    assert rel_l2(int8.int8_linear(x, lin, torch.float32).double(), expected) < 1e-6
    assert torch.equal(quantized_weights.held(lin).data, wq)  # made once, kept on the Linear


def test_a_linear_and_the_attention_are_close_to_exact():
    g = torch.Generator().manual_seed(0)
    lin = Linear(512, 384)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(384, 512, generator=g) / 512**0.5)
        lin.bias.copy_(torch.randn(384, generator=g) * 0.02)
    x = torch.randn(300, 512, generator=g)
    with torch.no_grad():
        exact = F.linear(x, lin.weight, lin.bias)  # before the int8 call, which drops the Linear's own weight
        assert 0 < rel_l2(int8.int8_linear(x, lin, torch.float32), exact) < GEMM_BOUND
    q = torch.randn(1, 300, 4, 64, generator=g)
    k, v = torch.randn(1, 500, 4, 64, generator=g) + 3.0, torch.randn(1, 500, 4, 64, generator=g)
    exact = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2).flatten(2)
    assert 0 < rel_l2(int8.int8_attention(q, k, v), exact) < ATTENTION_BOUND


@pytest.mark.parametrize("case", ["loop_global", "loop_rolling", "loop_1p3b"])
def test_the_golden_v2_loops_in_int8_stay_within_the_measured_bound(golden, every_linear, case):
    g = golden / "v2" / "fast"
    spec, io = json.loads((g / "case.json").read_text()), load_file(g / "inputs.safetensors")
    run = spec["cases"][case]
    settings = GenerationSettings(
        model="fast", shift=spec["shift"], attention_frames=max(run["local_attn_size"], 0), sink_frames=run["sink_size"]
    )
    options = FastOptions.from_settings(settings, spec["frame_seqlen"], V2_FAST)
    chunks = {}
    for compute in ("exact", "int8"):
        dit = load_expert(g / run["checkpoint"], "cpu", torch.float32)
        dit.set_compute(compute)
        pipe = FastPipeline(
            dit=ModelSlot("fast", lambda d=dit: d), dit_config=dit.cfg, tokenizer=None, text_encoder=None, vae=None,
            device=torch.device("cpu"), text_len=dit.cfg.text_len, name="golden v2", family=V2_FAST,
        )  # fmt: skip
        chunks[compute] = list(
            pipe.rollout_chunks(
                io["noise"], io["y"], io["context"], io["plucker"], options, renoise_draws=io["renoise"]
            )
        )
    distances = [rel_l2(a, b) for a, b in zip(chunks["int8"], chunks["exact"], strict=True)]
    assert all(1e-4 < d < LOOP_BOUND for d in distances), distances


def test_compute_auto_asks_the_device():
    compute, why = auto_compute("cpu")
    assert compute == "exact" and "cpu has no 8-bit tensor cores" in why
    assert int8.unsupported_reason("cpu") is None  # the CPU runs the reference math
