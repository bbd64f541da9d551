"""FP8 attention (`--compute fp8`): per-tensor e4m3 quantization, where the kernel runs and where it
falls back, and the model's output where it cannot run (CPU: the exact path, unchanged).

cuDNN's FP8 kernel itself needs a Hopper GPU: `test_cudnn_fp8_attention_is_close_to_sdpa` runs it
where one is present (bench/bench_attention.py measures it at full size)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.conftest import REPO
from worldgen.errors import InputError
from worldgen.kernels import attention as attention_module
from worldgen.kernels.attention import attention, attention_rows, fp8_attention, resolve_backend
from worldgen.kernels.cudnn_attention import attention_note, fp8_unsupported_reason
from worldgen.kernels.fp8 import FP8, FP8_MAX, QuantizedRows, QuantizedTensor, gelu_then_quantize, quantize_tensor
from worldgen.runtime.checkpoint import load_expert


def test_quantize_tensor_maps_the_largest_magnitude_to_the_e4m3_maximum():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 4, 16, generator=gen) * torch.logspace(-1, 1, 16)  # columns of different sizes
    q = quantize_tensor(x)
    assert q.data.dtype == FP8 and q.data.shape == x.shape
    assert q.descale.shape == (1, 1, 1, 1) and q.descale.dtype == torch.float32
    assert q.data.float().abs().max().item() == FP8_MAX
    back = q.dequantize(torch.float32)
    err = ((back - x).norm() / x.norm()).item()
    assert 0 < err < 0.05  # e4m3 keeps 3 mantissa bits: a few percent, never exact


def test_quantize_tensor_of_zeros_stays_finite():
    q = quantize_tensor(torch.zeros(1, 8, 2, 4))
    assert torch.isfinite(q.descale).all() and q.dequantize(torch.float32).abs().max().item() == 0


def test_fp8_attention_falls_back_off_hopper():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 300, 2, 16, generator=gen).bfloat16() for _ in range(3))
    assert fp8_attention(q, k, v) is None  # CPU: the caller runs `attention` (SDPA) instead
    reason = fp8_unsupported_reason(torch.device("cpu"))
    assert "NVIDIA GPU" in reason
    note = attention_note("cpu")
    assert "attention stays bf16" in note and reason in note


def test_a_model_asked_for_fp8_on_the_cpu_computes_exactly_as_before(golden):
    """No FP8 kernel runs on the CPU, so the fp8 setting must leave every output bit unchanged."""
    io = load_file(golden / "dit" / "io.safetensors")
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)
    inputs = (io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None], io["cam"])
    with torch.no_grad():
        exact = model(*inputs)
        model.set_compute("fp8")
        assert all(block.self_attn.compute == "fp8" for block in model.blocks)
        approximate = model(*inputs)
    assert torch.equal(exact, approximate)


def test_gelu_then_quantize_is_the_plain_gelu_where_no_fp8_gemm_follows():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(300, 32, generator=gen)
    linear = torch.nn.Linear(32, 8)
    linear.compute = "fp8"  # asked for, but a CPU float32 call never takes the FP8 GEMM
    out = gelu_then_quantize(x, linear)
    assert not isinstance(out, QuantizedRows)
    assert torch.equal(out, F.gelu(x, approximate="tanh"))


def test_flash_without_a_flashattention_package_names_both_installs():
    if attention_module.installed("flash"):
        pytest.skip("a FlashAttention package is installed here")
    with pytest.raises(InputError, match="flash-attn-4"):
        resolve_backend("flash")


def test_doctor_says_which_attention_kernels_this_machine_runs():
    result = subprocess.run(
        [sys.executable, "-m", "lingbot_cli", "doctor"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.splitlines()
    (auto,) = [line for line in lines if line.strip().startswith("attention auto =")]
    expected = resolve_backend("auto")
    assert f"= {expected}, base and Fast models" in auto
    (fp8_line,) = [line for line in lines if line.strip().startswith("fp8 ")]
    assert "FP8 tensor cores" in fp8_line if not torch.cuda.is_available() else "--compute fp8" in fp8_line


@pytest.mark.cuda
def test_cudnn_fp8_attention_is_close_to_sdpa():
    if not torch.cuda.is_available() or fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("needs a Hopper GPU and the cuDNN frontend (pip install nvidia-cudnn-frontend)")
    gen = torch.Generator("cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 2048, 4, 128, device="cuda", generator=gen).bfloat16() for _ in range(3))
    o = fp8_attention(q, k, v)
    assert isinstance(o, QuantizedTensor) and o.data.dtype == FP8 and o.data.shape == q.shape
    rows = attention_rows(o)
    assert isinstance(rows, QuantizedRows) and rows.lead == (1, 2048) and rows.data.data_ptr() == o.data.data_ptr()
    out = rows.data.float() * rows.scale
    ref = attention(q.float(), k.float(), v.float()).view(-1, 4 * 128)
    assert ((out - ref).norm() / ref.norm()).item() < 0.1
    held = torch.empty_like(o.data)  # a caller's buffer (the block graphs') gets the same bytes
    again = fp8_attention(q, k, v, out=held)
    assert again.data is held and torch.equal(held.view(torch.uint8), o.data.view(torch.uint8))
    assert torch.equal(again.descale, o.descale)


_FP8_ATTENTION_DIGEST = """
import hashlib, torch
from worldgen.kernels import cudnn_attention
from worldgen.kernels.fp8 import quantize_tensor
gen = torch.Generator("cuda").manual_seed(5)
q, k, v = (quantize_tensor(torch.randn(1, n, 40, 128, device="cuda", generator=gen).bfloat16()) for n in (4524, 15080, 15080))
o = cudnn_attention.fp8_attention_quantized(q, k, v)
print(hashlib.sha1(o.data.view(torch.uint8).cpu().numpy()).hexdigest(), cudnn_attention.describe())
"""


@pytest.mark.cuda
@pytest.mark.slow
def test_cudnn_fp8_attention_gives_every_process_the_same_bits():
    """The plan is the heuristics' first, not the fastest timed: the plans give other bits, and a choice by
    timing can change from process to process (`worldgen.kernels.cudnn_attention`'s docstring). The Fast
    model's shapes: one chunk's 4,524 queries over its 15,080-key window, 40 heads of 128."""
    if not torch.cuda.is_available() or fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("needs a Hopper GPU and the cuDNN frontend (pip install nvidia-cudnn-frontend)")
    runs = [
        subprocess.run(
            [sys.executable, "-c", _FP8_ATTENTION_DIGEST], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        for _ in range(3)
    ]
    assert all(run.returncode == 0 for run in runs), [run.stderr[-2000:] for run in runs]
    digests = {run.stdout.split()[0] for run in runs}
    assert len(digests) == 1, [run.stdout for run in runs]
