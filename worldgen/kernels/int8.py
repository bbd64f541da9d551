"""The INT8 compute path (`--compute int8`): W8A8 GEMMs and an 8-bit self-attention, for the GPUs our
users own that have no FP8 tensor cores (Ampere: RTX 30xx, A100, the A-series; sm_80/86), at their INT8
tensor-core rate (an RTX 3090: 284 dense TOPS against 35.6 TFLOP/s bf16 with float32 accumulation).

Linears (`int8_linear`): the weight quantized ONCE per load (`Int8Weight.of`, kept on the Linear) to int8
with one scale per output channel (absmax / 127, from the bf16 weight, or the NF4 weight dequantized as
the exact path does); the input quantized per token on the fly (absmax / 127: dynamic, nothing
calibrated); `torch._int_mm` multiplies them (int8 x int8 -> int32: cuBLASLt's INT8 GEMM on CUDA, the same
integer product on the CPU, so the CPU runs this path's reference math bit for bit); the two scales and
the bias are applied in float32, the result written in the compute dtype. Only Linears over many tokens
(`MIN_ROWS`, as the FP8 path) take it. This is the math of torchao's
`Int8DynamicActivationInt8WeightConfig` and of LightX2V's int8 modes; we keep our own ~40 lines rather
than torchao because its tensor subclasses do not compose with our NF4 Linears, fused RMSNorm/RoPE
kernels and CUDA-graph block replay, and its releases pin torch versions this project's CPU CI does not
use. Measured against torchao and SageAttention on the lent H200: docs/benchmarks.md (when measured).

Self-attention (`int8_attention`): SageAttention's scheme (Zhang et al., 2024): K smoothed (its mean over
the tokens subtracted, per head: each query's scores move by one constant, which softmax ignores), Q and
K quantized to int8 per block of `BLOCK` tokens (absmax / 127), S = Q8 K8^T in int32 times the two block
scales, softmax in float32, P V in the compute dtype (16-bit: PV in 8 bits is what costs accuracy). On
CUDA the `sageattention` package's Triton kernels run it where installed (`pip install sageattention`;
sm_80+); elsewhere this module's reference math (the same numbers, slower).

An approximation of the reference, as `--compute fp8` is: the distance from exact is measured in the tests
(tests/worldgen/test_int8.py) and in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

INT8_MAX = 127.0
MIN_ROWS = 256  # fewer rows than this: the exact GEMM is as fast (the FP8 path's threshold)
BLOCK = 128  # tokens per Q/K quantization block (SageAttention's for Q; finer blocks: closer, slower)
MIN_CAPABILITY = (8, 0)  # INT8 tensor-core GEMMs through torch._int_mm: Ampere and later


def unsupported_reason(device: torch.device | str) -> str | None:
    """Why `--compute int8` cannot run on `device` (None: it can). The CPU runs the reference math."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (
            f"--compute int8 needs INT8 tensor cores with cuBLASLt's INT8 GEMM (compute capability 8.0+: RTX 30xx, "
            f"A100); {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}: use --compute exact"
        )
    return None


def quantize_rows(x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], float32 scales [M, 1]): one scale per row (absmax / 127), rounded to
    nearest even. `block`: one scale per `block` rows instead ([ceil(M / block), 1])."""
    x = x.float()
    if block is None:
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / INT8_MAX
        return torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    rows = x.shape[0]
    padded = F.pad(x, (0, 0, 0, -rows % block)).view(-1, block, x.shape[-1])
    scale = padded.abs().amax(dim=(1, 2), keepdim=True).clamp(min=1e-12) / INT8_MAX
    data = torch.round(padded / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return data.view(-1, x.shape[-1])[:rows], scale.view(-1, 1)


def int_matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8 @ b_t.T ([N, K] int8) -> int32 [M, N]: `torch._int_mm` where its shape rules hold
    (CUDA: M > 16, K and N multiples of 8), else the integer product in int32 (exact either way)."""
    m, k = a.shape
    if not a.is_cuda or (m > 16 and k % 8 == 0 and b_t.shape[0] % 8 == 0):
        try:
            return torch._int_mm(a, b_t.t())
        except RuntimeError:  # a shape or layout this build's kernel refuses: the same integers below
            pass
    return a.int() @ b_t.int().t()


@dataclasses.dataclass
class Int8Weight:
    """A Linear's weight as int8 [N, K] with one float32 scale per output channel [N, 1]."""

    data: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def of(cls, linear: torch.nn.Module) -> Int8Weight:
        """The Linear's int8 weight, made on its first int8 call and kept (once per load): from its bf16
        weight, or its NF4 weight dequantized as the exact path computes with it."""
        cached = getattr(linear, "_int8_weight", None)
        if cached is None:
            weight = linear.dequantized_weight() if hasattr(linear, "dequantized_weight") else linear.weight
            cached = cls(*quantize_rows(weight.detach()))
            linear._int8_weight = cached
        return cached


def wants_int8(x: torch.Tensor, compute: str) -> bool:
    """Whether this call takes the INT8 GEMM: int8 asked, enough rows to matter."""
    return compute == "int8" and x.numel() // x.shape[-1] >= MIN_ROWS


def int8_linear(x: torch.Tensor, linear: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """y = x @ W.T + b with x per token and W per output channel in int8, int32 accumulation, `dtype` out."""
    weight = Int8Weight.of(linear)
    lead = x.shape[:-1]
    xq, x_scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = int_matmul(xq, weight.data).float() * x_scale * weight.scale.view(1, -1)
    if linear.bias is not None:
        out = out + linear.bias.float()
    return out.to(dtype).view(*lead, weight.data.shape[0])


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V for q [B, Lq, n, d], k and v [B, Lk, n, d] with Q and K in int8 (per
    block, K smoothed) and P V in the compute dtype; -> [B, Lq, n * d] in q's dtype."""
    b, lq, n, d = q.shape
    if q.is_cuda:
        from worldgen.kernels.attention import attention, installed

        if installed("sage"):
            return attention(q, k, v, "sage")
    k = k - k.float().mean(dim=1, keepdim=True).to(k.dtype)  # smoothing: softmax ignores a per-query constant
    out = torch.empty(b, lq, n, d, dtype=q.dtype, device=q.device)
    for i in range(b):
        for h in range(n):
            qq, qs = quantize_rows(q[i, :, h], BLOCK)
            kq, ks = quantize_rows(k[i, :, h], BLOCK)
            scores = int_matmul(qq, kq).float()
            scores *= qs.repeat_interleave(BLOCK, dim=0)[:lq] * ks.repeat_interleave(BLOCK, dim=0)[: k.shape[1]].T
            p = torch.softmax(scores / math.sqrt(d), dim=-1)
            out[i, :, h] = (p.to(v.dtype) @ v[i, :, h]).to(q.dtype)
    return out.reshape(b, lq, n * d)
