"""The hand-written Triton kernels of the fused groups (`worldgen.kernels.fused_triton`) against the eager
functions they replace (`worldgen.kernels.fused`), at the DiT's widths, on CUDA: float32 results equal
but for float32 rounding, bf16 and e4m3 results at most one step of their format apart (a row's sum in
another order) and only rarely; on the CPU they take no call."""

from __future__ import annotations

import pytest
import torch

from worldgen.kernels import fp8, fused, fused_triton, int8

E4M3 = torch.float8_e4m3fn


def _close(got: torch.Tensor, want: torch.Tensor, step: float, rare: float = 0.01) -> None:
    """Few elements differ at all (< `rare`), none by more than two rounding steps (`step`, relative) of the
    tensor's largest magnitude (an element that is a cancelling sum differs by its operands' step), and the
    whole is within a quarter step (rel-L2): what a row's sums in another order give, not a wrong index."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.float(), want.float()
    diff = (g - w).abs()
    assert diff.max().item() <= 2 * step * w.abs().max().item(), f"largest difference {diff.max().item():.3e}"
    assert (diff > 0).float().mean().item() < rare
    assert (diff.norm() / w.norm()).item() < step / 4


@pytest.fixture(scope="module")
def inputs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the kernels run on CUDA)")
    if not fused_triton.available():
        pytest.skip("needs Triton")
    g = torch.Generator("cuda").manual_seed(0)

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    b, tokens, dim, heads = 1, 300, 5120, 40
    return {
        "x": randn(b, tokens, dim, scale=3.0),
        "shift": randn(b, 1, dim), "scale": randn(b, 1, dim, scale=0.1),
        "w": randn(dim, dtype=torch.bfloat16), "bias": randn(dim, dtype=torch.bfloat16),
        "xb": randn(b, tokens, dim, scale=2.0, dtype=torch.bfloat16),
        "cos": torch.rand(tokens, dim // heads // 2, generator=g, device="cuda"),
        "sin": torch.rand(tokens, dim // heads // 2, generator=g, device="cuda"),
        "cam_scale": randn(1, tokens, dim, scale=0.1, dtype=torch.bfloat16),
        "cam_shift": randn(1, tokens, dim, dtype=torch.bfloat16),
        "k": randn(1, tokens, heads, dim // heads, scale=3.0, dtype=torch.bfloat16),
        "heads": heads,
    }  # fmt: skip


BF16_STEP, E4M3_STEP = 2.0**-7, 2.0**-3


@pytest.mark.cuda
def test_norms_and_modulation_match_the_eager_functions(inputs):
    i = inputs
    for shift, scale, w, bias in ((i["shift"], i["scale"], None, None), (None, None, i["w"], i["bias"])):
        args = (i["x"], shift, scale, w, bias, 1e-6, torch.bfloat16)
        _close(fused_triton.modulated_layer_norm(*args), fused.modulated_layer_norm.eager(*args), BF16_STEP)
    args = (i["xb"], i["w"], i["cos"], i["sin"], 1e-6, i["heads"])
    _close(fused_triton.rms_norm_rope(*args), fused.rms_norm_rope.eager(*args), BF16_STEP, rare=0.05)
    _close(fused_triton.rms_norm(i["xb"], i["w"], 1e-6), fused.rms_norm_fused.eager(i["xb"], i["w"], 1e-6), BF16_STEP)


@pytest.mark.cuda
def test_residuals_match_the_eager_functions(inputs):
    i = inputs
    y = i["xb"]
    # float32 out: the same products and sums, a fused multiply-add at most (float32 rounding)
    for gate in (i["scale"], None):
        got, want = fused_triton.gated_residual(i["x"], y, gate), fused.gated_residual.eager(i["x"], y, gate)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    got = fused_triton.camera_modulate(i["x"], i["cam_scale"], i["cam_shift"])
    want = fused.camera_modulate.eager(i["x"], i["cam_scale"], i["cam_shift"])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def _step_by_step(x, y, gate, cam, shift, scale, w, bias, quantize):
    """`fused.residual_norm` as the eager functions compute it, quantized by `fp8.quantize_rows`' rule."""
    if y is not None:
        x = fused.gated_residual.eager(x, y, gate)
    if cam is not None:
        x = fused.camera_modulate.eager(x, *cam)
    h = fused.modulated_layer_norm.eager(x, shift, scale, w, bias, 1e-6, torch.bfloat16)
    return x, fp8._quantize_rows(h.reshape(-1, h.shape[-1])) if quantize else h


@pytest.mark.cuda
def test_a_residual_then_a_norm_in_one_kernel_matches_the_steps_one_by_one(inputs):
    i = inputs
    cam = (i["cam_scale"], i["cam_shift"])
    cases = {  # the block's three: norm1 (+ FP8 rows), attention + camera + norm3, cross-attention + norm2
        "norm1": (None, None, None, i["shift"], i["scale"], None, None),
        "norm3": (i["xb"], i["scale"], cam, None, None, i["w"], i["bias"]),
        "norm2": (i["xb"], None, None, i["shift"], i["scale"], None, None),
    }
    for name, case in cases.items():
        for quantize in ("", "fp8"):
            x, h = fused_triton.residual_norm(i["x"], *case, 1e-6, torch.bfloat16, quantize)
            x_want, h_want = _step_by_step(i["x"], *case, quantize)
            torch.testing.assert_close(x, x_want, rtol=1e-6, atol=1e-5, msg=name)
            if case[0] is None and case[2] is None:
                assert x is i["x"]  # nothing added: the stream itself, not a copy
            if quantize:
                (q, scale), (q_want, scale_want) = h, h_want
                assert q.shape == i["x"].shape and scale.shape == (*i["x"].shape[:-1], 1)
                _close(scale.view(-1, 1), scale_want, BF16_STEP)
                _close(q.view(-1, q.shape[-1]), q_want, E4M3_STEP, rare=0.02)
            else:
                _close(h, h_want, BF16_STEP)
    # the dispatcher takes it on CUDA; off, the same steps through the other kernels
    got = fused.residual_norm(i["x"], *cases["norm3"], 1e-6, torch.bfloat16, "fp8")
    assert isinstance(got[1], tuple) and not fused._hand_failed
    fused.enable(False)
    try:
        x, h = fused.residual_norm(i["x"], *cases["norm3"], 1e-6, torch.bfloat16, "fp8")
    finally:
        fused.enable(True)
    assert h.dtype == torch.bfloat16  # never quantized there: the caller quantizes
    torch.testing.assert_close(x, got[0], rtol=1e-6, atol=1e-5)


@pytest.mark.cuda
def test_the_int8_rows_of_a_residual_norm_are_its_bf16_rows_quantized(inputs):
    """The INT8 path's input made in the norm's kernel: bit for bit `int8.quantize_rows` of the bf16 rows the same
    kernel gives unquantized (the pass of its own it replaces)."""
    i = inputs
    cam = (i["cam_scale"], i["cam_shift"])
    for case in (
        (None, None, None, i["shift"], i["scale"], None, None),
        (i["xb"], i["scale"], cam, None, None, i["w"], i["bias"]),
    ):
        x, (q, scale) = fused_triton.residual_norm(i["x"], *case, 1e-6, torch.bfloat16, "int8")
        x_bf16, h = fused_triton.residual_norm(i["x"], *case, 1e-6, torch.bfloat16, "")
        q_want, scale_want = int8.quantize_rows(h.reshape(-1, h.shape[-1]))
        assert q.dtype == torch.int8 and torch.equal(x, x_bf16)
        assert torch.equal(q.view(-1, q.shape[-1]), q_want) and torch.equal(scale.view(-1, 1), scale_want)


@pytest.mark.cuda
def test_the_fp8_cache_and_attention_quantizers_match_the_eager_functions(inputs):
    k = inputs["k"]
    q, scale = fused_triton.quantize_per_token(k, torch.bfloat16)
    q_eager, scale_eager = fused.quantize_per_token.eager(k, torch.bfloat16)
    _close(scale, scale_eager, BF16_STEP)
    _close(q, q_eager, E4M3_STEP)
    _close(fused_triton.dequantize_per_token(q_eager, scale_eager, torch.bfloat16),
           fused.dequantize_per_token.eager(q_eager, scale_eager, torch.bfloat16), BF16_STEP)  # fmt: skip
    (rq, descale), (rq_eager, descale_eager) = (
        fused_triton.requantize_per_tensor(q_eager, scale_eager),
        fused.requantize_per_tensor.eager(q_eager, scale_eager),
    )
    assert torch.equal(descale, descale_eager)
    _close(rq, rq_eager, E4M3_STEP)
    (tq, tdescale), (tq_eager, tdescale_eager) = fused_triton.quantize_tensor(k), fp8._quantize_tensor(k)
    assert torch.equal(tdescale, tdescale_eager)
    _close(tq, tq_eager, E4M3_STEP)


@pytest.mark.cuda
def test_the_tensor_quantizer_gives_the_eager_bytes_at_a_window_of_the_1_3b(inputs):
    """`quantize_tensor` (its largest magnitude in programs that loop, then the cast) bit for bit against
    `fp8._quantize_tensor` on the GPU at the 1.3B's 18-frame window (27,144 tokens, 12 heads: more blocks than
    programs), its descale included: a last-bit difference there moved 54,024 of a query's 9.3M bytes."""
    g = torch.Generator("cuda").manual_seed(1)
    for shape in ((1, 27144, 12, 128), (1, 6032, 12, 128), (1, 7, 3, 128)):
        x = torch.randn(shape, generator=g, device="cuda").bfloat16()
        (q, descale), (want_q, want_descale) = fused_triton.quantize_tensor(x), fp8._quantize_tensor(x)
        assert torch.equal(descale, want_descale), shape
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), shape


@pytest.mark.cuda
def test_the_fp8_cache_write_lands_in_its_slots_and_nowhere_else(inputs):
    """`fused.quantize_per_token_into` (the KV cache's write, straight into the slots) stores the same bytes
    as `quantize_per_token` returns, in slots [a, b) of a larger store, and leaves every other slot alone."""
    k = inputs["k"]
    tokens = k.shape[1]
    store = torch.full((1, 3 * tokens, *k.shape[2:]), 7.0, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.full((1, 3 * tokens, k.shape[2], 1), 5.0, device="cuda", dtype=torch.bfloat16)
    fused.quantize_per_token_into(k, store[:, tokens : 2 * tokens], scales[:, tokens : 2 * tokens])
    q, scale = fused_triton.quantize_per_token(k, torch.bfloat16)
    assert torch.equal(store[:, tokens : 2 * tokens].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(scales[:, tokens : 2 * tokens], scale)
    for outside in (slice(0, tokens), slice(2 * tokens, None)):
        assert store[:, outside].float().eq(7.0).all() and scales[:, outside].eq(5.0).all()
    with_eager = torch.zeros_like(store)
    fused.enable(False)
    try:
        fused.quantize_per_token_into(k, with_eager[:, :tokens], scales[:, :tokens])
    finally:
        fused.enable(True)
    _close(with_eager[:, :tokens], q, E4M3_STEP)


@pytest.mark.cuda
def test_the_dispatcher_takes_the_hand_written_kernel_on_cuda_when_asked(inputs, monkeypatch):
    i = inputs
    args = (i["x"], i["shift"], i["scale"], None, None, 1e-6, torch.bfloat16)
    monkeypatch.setattr(fused, "KERNELS", "triton")
    assert torch.equal(fused.modulated_layer_norm(*args), fused_triton.modulated_layer_norm(*args))
    assert not fused._hand_failed


def test_on_the_cpu_no_kernel_takes_a_call():
    x = torch.randn(1, 4, 8)
    assert fused_triton.modulated_layer_norm(x, None, None, None, None, 1e-6, torch.float32) is None
    assert fused_triton.gated_residual(x, x, None) is None
    assert fused_triton.residual_norm(x, x, None, None, None, None, None, None, 1e-6, torch.bfloat16, "fp8") is None
    got, h = fused.residual_norm(x, x, None, None, None, None, None, None, 1e-6, torch.float32, "fp8")
    assert torch.equal(got, x + x) and h.dtype == torch.float32  # the steps, unquantized
    assert fused_triton.quantize_tensor(x) is None
    assert torch.equal(fused.gated_residual(x, x, None), x + x)  # the eager function


def _variants(kernel) -> int:
    """Variants of a Triton kernel compiled (or being compiled) in this process, on every device."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


@pytest.mark.cuda
def test_compiling_ahead_compiles_a_variant_for_every_token_count_and_runs_nothing(inputs):
    from worldgen.kernels import triton_lang

    i, kernel = inputs, fused_triton._layer_norm_kernel
    x, half = i["x"], torch.float16  # float16 out: a variant no other test launches
    with triton_lang.compiling_ahead() as ahead:
        unwritten = fused_triton.modulated_layer_norm(x[:, :7].contiguous(), None, None, i["w"], i["bias"], 1e-6, half)
        assert unwritten.shape == (1, 7, x.shape[-1]) and len(ahead.futures) == 1
    compiled = _variants(kernel)
    got = fused_triton.modulated_layer_norm(x, None, None, i["w"], i["bias"], 1e-6, half)  # 300 tokens, not 7
    assert _variants(kernel) == compiled  # launched without compiling another variant
    _close(got, fused.modulated_layer_norm.eager(x, None, None, i["w"], i["bias"], 1e-6, half), 2.0**-10)


_INTERPRETED_TENSOR_SCALE = """
import torch
from worldgen.kernels import fp8, fused_triton
fused_triton._takes_e4m3 = lambda t: True  # no card to ask under the interpreter
g = torch.Generator().manual_seed(0)
for n in (1, 4095, 4096 * 9 + 17):  # one block, a partial one, more blocks than programs (each program loops)
    x = (torch.randn(1, n, generator=g) * 3).to(torch.bfloat16)
    x[0, n // 2] = -40.0 if n > 1 else x[0, 0]  # the largest magnitude negative: |x|, not max(x)
    q, descale = fused_triton.quantize_tensor(x)
    want_q, _ = fp8._quantize_tensor(x)
    # PyTorch on CUDA divides by a number as a multiplication by its float32 reciprocal (the kernel's rule, checked
    # against fp8._quantize_tensor on the GPU), on the CPU as a division: the descale may differ in its last bit
    want_descale = x.abs().amax().float().clamp(min=1e-12) * torch.tensor(1 / 448, dtype=torch.float32)
    assert descale.shape == (1, 1, 1, 1) and torch.equal(descale.view(()), want_descale), (n, descale, want_descale)
    # the interpreter's e4m3 cast rounds a value that rounds up into the next binade down to the lower one:
    # the bytes are compared on the GPU (test_the_fp8_cache_and_attention_quantizers_match_the_eager_functions)
    assert (q.float() - want_q.float()).abs().max() <= want_q.float().abs().max() / 2, n
zero = torch.zeros(1, 64, dtype=torch.bfloat16)
assert torch.equal(fused_triton.quantize_tensor(zero)[1].view(()), torch.tensor(1e-12) * torch.tensor(1 / 448))
print("interpreted tensor scale: ok")
"""


@pytest.mark.slow
def test_the_tensor_scale_is_the_eager_ones_under_the_interpreter():
    """`quantize_tensor`'s largest magnitude (programs that loop over blocks, one atomic each) and its descale
    bit for bit against `fp8._quantize_tensor`, on CPU tensors through Triton's interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_TENSOR_SCALE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
