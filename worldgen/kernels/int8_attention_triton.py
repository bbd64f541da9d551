"""The INT8 path's self-attention on CUDA: SageAttention's scheme (`worldgen.kernels.int8.int8_attention`, whose
PyTorch math is its reference and the CPU's path) in our own Triton kernels, tuned per card.

- `_quantize_blocks_kernel`: one head's block of `QK_BLOCK` tokens to int8 with one float32 scale (absmax / 127,
  rounded to nearest even: `int8.quantize_rows(x, block)`'s numbers), K's smoothing (the window's mean over the
  tokens, per head, subtracted in K's dtype as the reference does) in the same pass: K is read twice (its mean in
  PyTorch, then this pass), where the package's path read it three times and wrote it once (the mean, the
  subtraction written out, its quantizer).
- `_attention_kernel`: one block of queries of one head against the whole window, flash style: S = Q8 K8^T in
  int32 times the two block scales, an online softmax in float32 (exp2, the 1/sqrt(d) and log2(e) folded into one
  factor), P V in 16 bits. Keys past the window's end are masked out of the softmax (the package's kernel counts
  them with a score of 0 when the window is not a whole number of its 64-key blocks: 27,144 keys are not).

Why our own kernels and not the `sageattention` package's (1.0.6, Triton): on the H200 its kernel accumulates
each block's P V in fp16 (`out_dtype=float16`) and converts V to fp16 on every call, both tuned for Ampere's and
Ada's consumer cards, where fp16 accumulation runs at twice the rate. Hopper's tensor cores run fp32
accumulation at the same rate: at the 1.3B's shape (6,032 queries, 27,144 keys, 12 heads of 128) the package's
path took 2.96-3.04 ms a block (its kernel alone 2.69 ms), these kernels 2.41 ms (the attention kernel 2.22, K's
mean and quantization 0.20, Q's 0.07), cuDNN's FP8 attention (the fp8 path's) 1.95-2.41 ms; the 14B (40 heads)
8.80-9.16, 6.09 and 4.52-5.10 ms (docs/benchmarks.md, "Session 30"). So the tiles and the accumulation are chosen
per card (`attention_config`): Hopper's the best of a sweep of ten; Sage's own below it (an RTX 3090 or 4090:
fp16 accumulation, not measured here).
Both blocks of scales are `QK_BLOCK` tokens (the reference's `int8.BLOCK`), whatever the kernel's tiles.
"""

from __future__ import annotations

import math

import torch

from worldgen.kernels.int8_triton import on_device
from worldgen.kernels.triton_lang import Signature, launch, tl, triton

QK_BLOCK = 128  # tokens per Q and per K quantization block: the reference's (`int8.BLOCK`)
LOG2E = 1.4426950408889634

if triton is not None:

    @triton.jit(do_not_specialize=["length"])
    def _quantize_blocks_kernel(
        x_ptr, mean_ptr, q_ptr, s_ptr, length, x_batch, x_token, x_head, heads,
        HAS_MEAN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # x [B, L, H, D] (any strides but the last) -> q [B, H, L, D] int8, s [B, H, ceil(L / BLOCK)] float32
        blk, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        rows = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, HEAD_DIM)
        mask = rows[:, None] < length
        x = tl.load(
            x_ptr + batch * x_batch + head * x_head + rows[:, None] * x_token + cols[None, :], mask=mask, other=0.0
        )
        if HAS_MEAN:  # K's smoothing: x - mean in x's dtype, as the reference subtracts it
            mean = tl.load(mean_ptr + (batch * heads + head) * HEAD_DIM + cols)
            x = (x.to(tl.float32) - mean.to(tl.float32)[None, :]).to(x.dtype)
        x = tl.where(mask, x.to(tl.float32), 0.0)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-12), 127.0)
        q = (tl.math.div_rn(x, scale) + 12582912.0) - 12582912.0  # round half to even (see int8_triton)
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        out = q_ptr + (batch * heads + head) * length * HEAD_DIM + rows[:, None] * HEAD_DIM + cols[None, :]
        tl.store(out, q.to(tl.int8), mask=mask)
        tl.store(s_ptr + (batch * heads + head) * tl.cdiv(length, BLOCK) + blk, scale)

    @triton.jit(do_not_specialize=["q_len", "kv_len"])
    def _attention_kernel(
        q_ptr, k_ptr, v_ptr, qs_ptr, ks_ptr, out_ptr, q_len, kv_len, v_batch, v_token, v_head,
        o_batch, o_token, o_head, heads, factor,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QK_BLOCK: tl.constexpr,
        F16_ACC: tl.constexpr,
    ):  # fmt: skip
        # a program's queries are one quantization block (BLOCK_M == QK_BLOCK) and each key tile lies in one (BLOCK_N
        # divides QK_BLOCK): one scale each, scalars; pointers advance tile by tile (no per-tile index arithmetic)
        tl.static_assert(BLOCK_M == QK_BLOCK and QK_BLOCK % BLOCK_N == 0)
        pid_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        bh = batch * heads + head
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, HEAD_DIM)
        keys = tl.arange(0, BLOCK_N)
        q = tl.load(
            q_ptr + bh * q_len * HEAD_DIM + rows[:, None] * HEAD_DIM + cols[None, :], mask=rows[:, None] < q_len
        )
        q_scale = tl.load(qs_ptr + bh * tl.cdiv(q_len, QK_BLOCK) + pid_m) * factor  # 1/sqrt(d) * log2(e): base 2
        k_at = k_ptr + bh * kv_len * HEAD_DIM + keys[None, :] * HEAD_DIM + cols[:, None]
        ks_at = ks_ptr + bh * tl.cdiv(kv_len, QK_BLOCK)
        v_at = v_ptr + batch * v_batch + head * v_head + keys[:, None] * v_token + cols[None, :]
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        for start in range(0, kv_len, BLOCK_N):
            valid = keys < kv_len - start
            k = tl.load(k_at, mask=valid[None, :], other=0)
            s = tl.dot(q, k, out_dtype=tl.int32).to(tl.float32) * (q_scale * tl.load(ks_at + start // QK_BLOCK))
            if start + BLOCK_N > kv_len:  # the window's last, partial tile: its missing keys out of the softmax
                s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_at, mask=valid[:, None], other=0.0)
            if F16_ACC:  # consumer Ampere and Ada: fp16 accumulation at twice the rate (SageAttention's choice)
                acc += tl.dot(p.to(tl.float16), v, out_dtype=tl.float16).to(tl.float32)
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
            k_at += BLOCK_N * HEAD_DIM
            v_at += BLOCK_N * v_token
        out = acc / l_i[:, None]
        at = out_ptr + batch * o_batch + head * o_head + rows[:, None] * o_token + cols[None, :]
        tl.store(at, out.to(out_ptr.dtype.element_ty), mask=rows[:, None] < q_len)


def attention_config(capability: tuple[int, int]) -> dict[str, object]:
    """The attention kernel's tiles and accumulation for a card (measured: the module docstring)."""
    if tuple(capability) >= (9, 0):
        return {"BLOCK_M": 128, "BLOCK_N": 64, "F16_ACC": False, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": 128, "BLOCK_N": 64, "F16_ACC": True, "num_warps": 8, "num_stages": 4}


def quantize_blocks(x: torch.Tensor, smooth: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L, H, D] -> (int8 [B, H, L, D], float32 scales [B, H, ceil(L / QK_BLOCK)]), each head's blocks of
    `QK_BLOCK` tokens quantized as `int8.quantize_rows(x, QK_BLOCK)` does; `smooth`: x minus its mean over the
    tokens first (K's smoothing, the reference's numbers)."""
    b, length, heads, d = x.shape
    mean = x.mean(dim=1, dtype=torch.float32).to(x.dtype).contiguous() if smooth else x
    q = torch.empty((b, heads, length, d), dtype=torch.int8, device=x.device)
    scale = torch.empty((b, heads, triton.cdiv(length, QK_BLOCK)), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(length, QK_BLOCK), heads, b)
    launch(
        _quantize_blocks_kernel, grid, x, mean, q, scale, length, x.stride(0), x.stride(1), x.stride(2), heads,
        HAS_MEAN=smooth, HEAD_DIM=d, BLOCK=QK_BLOCK, num_warps=4,
    )  # fmt: skip
    return q, scale


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernels take these [B, L, n, d] inputs: on the device, 16-bit, a power-of-two head size."""
    d = q.shape[-1]
    same = q.dtype == k.dtype == v.dtype and q.dtype in (torch.bfloat16, torch.float16)
    strided = all(t.stride(-1) == 1 for t in (q, k, v))
    return triton is not None and on_device(q) and same and strided and d in (64, 128) and q.shape[2] == k.shape[2]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, capability: tuple[int, int]) -> torch.Tensor | None:
    """softmax(Q K^T / sqrt(d)) V for q [B, Lq, n, d], k and v [B, Lk, n, d], Q and K in int8 per block of
    `QK_BLOCK` tokens (K smoothed), P V in 16 bits -> [B, Lq, n * d] in q's dtype; None where the kernels do not
    take these (the caller's path runs). `capability`: the card's (or the forced one's, `triton_lang.capability`)."""
    if not takes(q, k, v):
        return None
    b, q_len, heads, d = q.shape
    kv_len = k.shape[1]
    config = attention_config(capability)
    q8, q_scale = quantize_blocks(q, smooth=False)
    k8, k_scale = quantize_blocks(k, smooth=True)
    if config["F16_ACC"] and v.dtype != torch.float16:
        v = v.to(torch.float16)
    out = torch.empty((b, q_len, heads, d), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(q_len, config["BLOCK_M"]), heads, b)
    launch(
        _attention_kernel, grid, q8, k8, v, q_scale, k_scale, out, q_len, kv_len, v.stride(0), v.stride(1),
        v.stride(2), out.stride(0), out.stride(1), out.stride(2), heads, LOG2E / math.sqrt(d),
        HEAD_DIM=d, QK_BLOCK=QK_BLOCK, **config,
    )  # fmt: skip
    return out.view(b, q_len, heads * d)


# The launches' variants (`triton_lang.Signature`): the models' heads of 128, bf16 activations; the attention's
# tiles and accumulation as each card gets them (Hopper's, and the one below it: fp16 V)
_QUANTIZE = "*bf16 *bf16 *i8 *fp32 i32 i32 i32 i32 i32"


def _attention_signature(capability: tuple[int, int]) -> Signature:
    config = attention_config(capability)
    options = {"num_warps": config.pop("num_warps"), "num_stages": config.pop("num_stages")}
    v = "*fp16" if config["F16_ACC"] else "*bf16"
    types = f"*i8 *i8 {v} *fp32 *fp32 *bf16 i32 i32 i32 i32 i32 i32 i32 i32 i32 fp32"
    return Signature(types, {"HEAD_DIM": 128, "QK_BLOCK": QK_BLOCK, **config}, options)


SIGNATURES = {
    "_quantize_blocks_kernel": (
        Signature(_QUANTIZE, {"HAS_MEAN": True, "HEAD_DIM": 128, "BLOCK": QK_BLOCK}, {"num_warps": 4}),
        Signature(_QUANTIZE, {"HAS_MEAN": False, "HEAD_DIM": 128, "BLOCK": QK_BLOCK}, {"num_warps": 4}),
    ),
    "_attention_kernel": (_attention_signature((9, 0)), _attention_signature((8, 6))),
}
