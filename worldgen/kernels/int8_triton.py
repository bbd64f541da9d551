"""The INT8 path's hand-written Triton kernels (`worldgen.kernels.int8` decides when they run; its PyTorch
functions are their reference, and the CPU's path).

- `quantize_rows`: per-token int8 quantization of an activation in one pass (one program a row, the row in
  registers: read once in bf16, written once in int8, one float32 scale), optionally after the feed-forward's
  tanh GELU (`gelu=True`: the bf16 GELU output is never written out and read back). The unfused PyTorch it
  replaces made five float32 passes over every input (cast, |x|, max, divide, round, clamp, cast).
- `dequantize`: the epilogue of `torch._int_mm` (int32 [M, N] -> x_scale[m] * w_scale[n] * acc + bias[n], in
  the compute dtype) in one pass: it read the int32 product once and wrote bf16 once, where PyTorch's four
  elementwise ops wrote and read float32 four times.
- `gemm`: the whole W8A8 GEMM in Triton, int8 x int8 -> int32 on the tensor cores (wgmma on Hopper, its tiles
  read by TMA; mma.sync on Ampere and Ada, pointer loads) with that epilogue fused: the int32 product never
  reaches memory. The default (`int8.GEMM = "triton"`): quicker than cuBLASLt through `torch._int_mm` and the
  epilogue at every shape measured (bench/bench_int8.py compares them; `gemm_config`).

Numerics: exactly the reference's. The scale is max|x| / 127 (IEEE division: `tl.math.div_rn`, not Triton's
default approximate one), each value divided by it (IEEE) and rounded to nearest even (the float32 magic-number
rounding: exact for |v| < 2^22, and Triton's interpreter has no libdevice `rint`), clamped to
+-127; the epilogue multiplies in the reference's order, `(acc * x_scale) * w_scale + bias`, with no FMA
contraction (`enable_fp_fusion=False`), so its output is bit for bit what PyTorch computes.
"""

from __future__ import annotations

import os

import torch

from worldgen.kernels.triton_lang import Signature, launch, tl, triton

try:  # Hopper's TMA descriptors made on the host (Triton 3.4+)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - no Triton, or an older one: the pointer loads everywhere
    TensorDescriptor = None

INT8_MAX = 127.0
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # the tests run the kernels on CPU tensors
MAX_ROW = 32768  # widest row `quantize_rows` holds in registers (the 14B's feed-forward hidden is 13,824)


def available() -> bool:
    return triton is not None


def on_device(t: torch.Tensor) -> bool:
    """Whether the kernels can take `t`: a CUDA tensor, or any tensor under Triton's interpreter."""
    return triton is not None and (t.is_cuda or _INTERPRETED)


if triton is not None:

    @triton.jit
    def _quantize_int8_kernel(
        x_ptr, q_ptr, s_ptr, n_cols, x_stride, q_stride, BLOCK: tl.constexpr, GELU: tl.constexpr
    ):  # fmt: skip
        # one program per row, the whole row in registers: x read once
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if GELU:  # the feed-forward's tanh GELU first, rounded to bf16 where eager PyTorch rounds it
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            x = (0.5 * x * (2.0 * tl.sigmoid(2.0 * inner))).to(tl.bfloat16).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12), 127.0)
        # round half to even for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits, so the add rounds to
        # nearest even (IEEE) and the subtraction is exact (no reassociation: Triton compiles without fast-math)
        q = (tl.math.div_rn(x, scale) + 12582912.0) - 12582912.0
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(q_ptr + row * q_stride + cols, q.to(tl.int8), mask=mask)
        tl.store(s_ptr + row, scale)

    @triton.jit(do_not_specialize=["rows"])
    def _dequantize_kernel(
        acc_ptr, xs_ptr, ws_ptr, b_ptr, out_ptr, rows, n_cols,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (r[:, None] < rows) & (c[None, :] < n_cols)
        acc = tl.load(acc_ptr + r[:, None] * n_cols + c[None, :], mask=mask, other=0).to(tl.float32)
        xs = tl.load(xs_ptr + r, mask=r < rows, other=0.0)
        ws = tl.load(ws_ptr + c, mask=c < n_cols, other=0.0)
        out = acc * xs[:, None] * ws[None, :]
        if HAS_BIAS:
            out = out + tl.load(b_ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + r[:, None] * n_cols + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["rows"])
    def _gemm_kernel(
        a_in, w_in, xs_ptr, ws_ptr, b_ptr, out_ptr, rows, n_cols, k_cols,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, TMA: tl.constexpr,
    ):  # fmt: skip
        # a [M, K] int8 row-major, w [N, K] int8 row-major (K-major for both: what 8-bit MMAs take), out [M, N];
        # TMA: a_in and w_in are tensor descriptors of them (Hopper's bulk copies, rows past the end read as 0),
        # else pointers to them. Programs in groups of GROUP_M row tiles, so the weight tiles a group reads stay in L2
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(rows, BLOCK_M), tl.cdiv(n_cols, BLOCK_N)
        group = pid // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        size_m = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * tiles_n)) % size_m
        pid_n = (pid % (GROUP_M * tiles_n)) // size_m
        r = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        if TMA:
            for start in range(0, k_cols, BLOCK_K):
                a = a_in.load([pid_m * BLOCK_M, start])
                w = w_in.load([pid_n * BLOCK_N, start])
                acc = tl.dot(a, w.T, acc, out_dtype=tl.int32)
        else:
            k = tl.arange(0, BLOCK_K)
            a_at = a_in + r[:, None] * k_cols + k[None, :]
            w_at = w_in + c[None, :].to(tl.int64) * k_cols + k[:, None]
            for start in range(0, k_cols, BLOCK_K):
                a = tl.load(a_at, mask=(r[:, None] < rows) & (k[None, :] < k_cols - start), other=0)
                w = tl.load(w_at, mask=(c[None, :] < n_cols) & (k[:, None] < k_cols - start), other=0)
                acc = tl.dot(a, w, acc, out_dtype=tl.int32)
                a_at += BLOCK_K
                w_at += BLOCK_K
        xs = tl.load(xs_ptr + r, mask=r < rows, other=0.0)
        ws = tl.load(ws_ptr + c, mask=c < n_cols, other=0.0)
        out = acc.to(tl.float32) * xs[:, None] * ws[None, :]
        if HAS_BIAS:
            out = out + tl.load(b_ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)[None, :]
        mask = (r[:, None] < rows) & (c[None, :] < n_cols)
        tl.store(out_ptr + r[:, None] * n_cols + c[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def _row_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def quantize_rows(x: torch.Tensor, gelu: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [M, K] (rows contiguous) -> (int8 [M, K], float32 [M, 1]), `int8.quantize_rows`' numbers (after the
    tanh GELU, rounded to bf16, with `gelu`); None where the kernel does not take x (the caller's PyTorch runs)."""
    if not (on_device(x) and x.dim() == 2 and x.dtype in _FLOATS and x.stride(1) == 1 and x.shape[1] <= MAX_ROW):
        return None
    if gelu and x.dtype != torch.bfloat16:
        return None
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.int8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(cols)
    launch(
        _quantize_int8_kernel, (rows,), x, q, scale, cols, x.stride(0), cols,
        BLOCK=block, GELU=gelu, num_warps=_row_warps(block),
    )  # fmt: skip
    return q, scale


def _epilogue_ok(x_scale, w_scale, bias, dtype) -> bool:
    scales = x_scale.dtype == w_scale.dtype == torch.float32 and x_scale.is_contiguous() and w_scale.is_contiguous()
    return scales and dtype in _FLOATS and (bias is None or (bias.dtype in _FLOATS and bias.is_contiguous()))


def dequantize(acc, x_scale, w_scale, bias, dtype) -> torch.Tensor | None:
    """int32 acc [M, N] -> (acc * x_scale [M, 1]) * w_scale [N, 1] (+ bias [N]) in `dtype`, one pass; None
    where the kernel does not take these (the caller's PyTorch runs)."""
    if not (on_device(acc) and acc.dtype == torch.int32 and acc.is_contiguous() and acc.dim() == 2):
        return None
    if not _epilogue_ok(x_scale, w_scale, bias, dtype):
        return None
    rows, cols = acc.shape
    out = torch.empty((rows, cols), dtype=dtype, device=acc.device)
    grid = (triton.cdiv(rows, 32), triton.cdiv(cols, 128))
    launch(
        _dequantize_kernel, grid, acc, x_scale, w_scale, acc if bias is None else bias, out, rows, cols,
        HAS_BIAS=bias is not None, BLOCK_M=32, BLOCK_N=128, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def gemm_config(capability: tuple[int, int]) -> dict[str, int | bool]:
    """The GEMM's tiles for a card. Hopper (sm_90+): 128x128 tiles with 128-deep K steps in three stages, read by
    TMA (`TMA`: tensor descriptors); on the H200 at 6,032 rows that was the quickest of six tile shapes and two
    ways of loading at every shape of the 1.3B and the 14B, 0.032-0.72 ms against 0.039-0.79 ms for the pointer
    loads with 64-deep steps, and level with cuBLASLt's FP8 GEMM (0.032-0.71 ms) at most shapes (docs/benchmarks.md,
    "Session 35"). Below it: 128x128 tiles with 64-deep K steps in four stages, pointer loads (64 KiB of shared
    memory: an RTX 3090 has 99 KiB, and no TMA), the quickest of ten tile shapes in Session 30's sweep."""
    if capability >= (9, 0) and TensorDescriptor is not None:
        return {
            "BLOCK_M": 128,
            "BLOCK_N": 128,
            "BLOCK_K": 128,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 3,
            "TMA": True,
        }
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4, "TMA": False}


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA can read t [R, K] int8 row-major: 16-byte aligned start and rows (Hopper's descriptor rules)."""
    return t.data_ptr() % 16 == 0 and t.shape[1] % 16 == 0


def gemm(a, w, x_scale, w_scale, bias, dtype, capability: tuple[int, int]) -> torch.Tensor | None:
    """a [M, K] int8 @ w [N, K] int8 with the dequantizing epilogue fused -> [M, N] in `dtype`; None where the
    kernel does not take these. `capability`: the card's (or the forced one's, `triton_lang.capability`)."""
    if not (on_device(a) and a.dtype == w.dtype == torch.int8 and a.is_contiguous() and w.is_contiguous()):
        return None
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1] or not _epilogue_ok(x_scale, w_scale, bias, dtype):
        return None
    (rows, k_cols), n_cols = a.shape, w.shape[0]
    out = torch.empty((rows, n_cols), dtype=dtype, device=a.device)
    config = gemm_config(capability)
    config["TMA"] = config.get("TMA", False) and _tma_ok(a) and _tma_ok(w)
    a_in, w_in = a, w
    if config["TMA"]:
        a_in = TensorDescriptor.from_tensor(a, [config["BLOCK_M"], config["BLOCK_K"]])
        w_in = TensorDescriptor.from_tensor(w, [config["BLOCK_N"], config["BLOCK_K"]])
    grid = (triton.cdiv(rows, config["BLOCK_M"]) * triton.cdiv(n_cols, config["BLOCK_N"]),)
    launch(
        _gemm_kernel, grid, a_in, w_in, x_scale, w_scale, a if bias is None else bias, out, rows, n_cols, k_cols,
        HAS_BIAS=bias is not None, **config, enable_fp_fusion=False,
    )  # fmt: skip
    return out


# The launches' variants (`triton_lang.Signature`): the 14B's widths (a 5,120-wide input; the feed-forward's
# 13,824-wide hidden with its GELU), bf16 in and out, a bf16 bias; the GEMM with pointer loads (every card's tiles)
# and with Hopper's TMA descriptors (its tiles; below sm_90 Triton builds them as plain loads, never reached there)
_GEMM = "*i8 *i8 *fp32 *fp32 *bf16 *bf16 i32 i32 i32"


def _gemm_signature(capability: tuple[int, int]) -> Signature:
    config = gemm_config(capability)
    options = {"num_warps": config.pop("num_warps"), "num_stages": config.pop("num_stages"), "enable_fp_fusion": False}
    types = _GEMM
    if config["TMA"]:  # the descriptors' element type and block, as Triton specialises a TensorDescriptor
        m, n, k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        types = f"tensordesc<i8[{m},{k}]> tensordesc<i8[{n},{k}]>" + _GEMM.removeprefix("*i8 *i8")
    return Signature(types, {"HAS_BIAS": True, **config}, options)


SIGNATURES = {
    "_quantize_int8_kernel": (
        Signature("*bf16 *i8 *fp32 i32 i32 i32", {"BLOCK": 8192, "GELU": False}, {"num_warps": 8}),
        Signature("*bf16 *i8 *fp32 i32 i32 i32", {"BLOCK": 16384, "GELU": True}, {"num_warps": 16}),
    ),
    "_dequantize_kernel": (
        Signature("*i32 *fp32 *fp32 *bf16 *bf16 i32 i32", {"HAS_BIAS": True, "BLOCK_M": 32, "BLOCK_N": 128},
                  {"num_warps": 4, "enable_fp_fusion": False}),
    ),
    "_gemm_kernel": (_gemm_signature((8, 0)), _gemm_signature((9, 0))),
}  # fmt: skip
