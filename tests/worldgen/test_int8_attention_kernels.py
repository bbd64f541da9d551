"""The INT8 self-attention's Triton kernels (worldgen/kernels/int8_attention_triton.py) under Triton's interpreter,
on CPU tensors, against the reference math of `int8.int8_attention` (worldgen/kernels/int8.py): each head's Q and
K blocks quantized to the reference's int8 values and scales (bit for bit, K's smoothing within the interpreter's
bf16 rounding),
and the attention within the reference's distance of it, keys past the last whole tile masked out of the softmax;
Hopper's tiles (float32 accumulation, V in bf16) and the consumer cards' (fp16 accumulation, V in fp16). The
speed is the GPU's to measure (bench/bench_int8.py; docs/benchmarks.md, "Session 30")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_INTERPRETED = """
import torch
from worldgen.kernels import int8, int8_attention_triton as A
from tests.worldgen.numerics import rel_l2
g = torch.Generator().manual_seed(0)
# 200 queries, 300 keys: neither a whole number of 128-token blocks nor of 64-key tiles; 2 heads of 64
q, k, v = ((torch.randn(1, n, 2, 64, generator=g) * s).to(torch.bfloat16) for n, s in ((200, 2), (300, 2), (300, 1)))
k = k + torch.randn(1, 1, 2, 64, generator=g).to(torch.bfloat16) * 4  # a common offset: what smoothing removes
for smooth in (False, True):
    q8, scale = A.quantize_blocks(k, smooth)
    ref = k - k.float().mean(dim=1, keepdim=True).to(k.dtype) if smooth else k
    for h in range(2):
        rq, rs = int8.quantize_rows(ref[0, :, h], A.QK_BLOCK)
        if not smooth:
            assert torch.equal(q8[0, h], rq) and torch.equal(scale[0, h], rs.view(-1)), h
        else:  # the subtraction rounded to bf16: by truncation here (the interpreter), to nearest on a GPU
            assert (q8[0, h].int() - rq.int()).abs().max() <= 1, h
            assert torch.allclose(scale[0, h], rs.view(-1), rtol=2**-7, atol=0), h
int8._failed.add("attention")  # the reference math (no Triton)
exact = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)))
exact = exact.transpose(1, 2).reshape(1, 200, 128)
half = [t.half() for t in (q, k, v)]  # the interpreter multiplies no bf16 matrices (numpy has no bf16): Hopper's in fp16
cases = {(9, 0): half, (8, 6): [q, k, v]}  # the consumer cards' tiles turn V to fp16 themselves
want = {card: int8.int8_attention(*inputs) for card, inputs in cases.items()}
# 257 keys (a last tile of 1 key) and queries near 0 (a flat softmax): phantom keys scored 0 would weigh as much as
# real ones and pull every row towards 0
cut = {card: [t * 0.05 if i == 0 else t[:, :257] for i, t in enumerate(inputs)] for card, inputs in cases.items()}
short = {card: int8.int8_attention(*inputs) for card, inputs in cut.items()}
reference = rel_l2(want[(8, 6)].float(), exact)  # the reference math's own distance from exact attention
int8._failed.discard("attention")
for card, inputs in cases.items():
    got = A.attention(*inputs, card)
    assert got.shape == (1, 200, 128) and got.dtype == inputs[0].dtype
    # the same quantized scores; the base-2 softmax and P V's 16-bit rounding differ (fp16 accumulation: more)
    assert rel_l2(got.float(), want[card].float()) < (2e-3 if card == (9, 0) else 2e-2), card
    assert rel_l2(got.float(), exact) < 1.2 * reference, card
    got = A.attention(*cut[card], card)
    assert rel_l2(got.float(), short[card].float()) < (2e-3 if card == (9, 0) else 2e-2), card
assert torch.equal(int8.int8_attention(*half), A.attention(*half, (9, 0)))  # int8_attention takes the kernels here
print("interpreted attention: ok")
"""


def test_the_int8_attention_kernels_give_the_reference_numbers_under_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INTERPRETED)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
