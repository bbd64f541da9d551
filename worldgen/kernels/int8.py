"""The INT8 compute path (`--compute int8`): W8A8 GEMMs and an 8-bit self-attention, for the GPUs our
users own that have no FP8 tensor cores (Ampere: RTX 30xx, A100, the A-series; sm_80/86), at their INT8
tensor-core rate (an RTX 3090: 284 dense TOPS against 35.6 TFLOP/s bf16 with float32 accumulation).

Linears (`int8_linear`): the weight quantized ONCE per load (`Int8Weight.of`, kept on the Linear) to int8
with one scale per output channel (absmax / 127, from the bf16 weight, or the NF4 weight dequantized as
the exact path does); the input quantized per token on the fly (absmax / 127: dynamic, nothing
calibrated) by one Triton pass (`int8_triton.quantize_rows`; the feed-forward's GELU in the same pass,
`gelu_then_quantize`, as the fp8 path does); on CUDA our Triton GEMM multiplies them (`int8_triton.gemm`: int8
x int8 -> int32 on the tensor cores, the two scales and the bias applied in float32 in the same kernel, the result
written in the compute dtype). On the CPU (and with `GEMM = "int_mm"`) `torch._int_mm` computes the integer
product (cuBLASLt's INT8 GEMM on CUDA; on the CPU the reference math, bit for bit) and one Triton pass
(`int8_triton.dequantize`) the rest. Why our own GEMM by default and not the library: on the H200 cuBLASLt ran
sm_80 kernels (`cutlass_80_tensorop_i16832gemm_s8`: Ampere's MMAs, not Hopper's) and its int32 output costs an
extra read and write of the product; ours, with the tiles `int8_triton.gemm_config` chose, took 0.06-0.78 ms
where it took 0.08-1.27 ms at the 1.3B's and the 14B's shapes (docs/benchmarks.md, "Session 30"), and with its
tiles read by TMA on Hopper 1.01-1.11x cuBLASLt's FP8 GEMM (Session 35); on the sm_80 code path the two were
level (Session 28). bench/bench_int8.py compares them on a card. `torch._scaled_mm`
(and torch 2.13's `F.scaled_mm`) refuses int8 operands (its row-wise rule: "a and b should be float8").
Only Linears over many tokens (`MIN_ROWS`, as the FP8 path) take it. After a residual norm (the self-attention's,
the cross-attention's and the feed-forward's inputs) the norm's kernel gives the int8 rows itself, as it gives
e4m3 ones on the fp8 path (`fused.residual_norm` with "int8": the same bf16 rows, quantized by this module's rule
in the same kernel, bit for bit): on the 1.3B that took ~2,150 of ~5,000 quantizing passes out of a 5-chunk
rollout (docs/benchmarks.md, "Session 35").

Weights: the int8 weight is made once and a dense Linear's bf16 weight dropped for it (the 1.3B: 2.6 GB of bf16
for 1.3 GB of int8), restored when another compute is set: `worldgen.kernels.quantized_weights`, the one
mechanism of int8 and fp8. An NF4 Linear keeps only its NF4 bytes (half the int8's size, and what the exact path
computes from) and makes its int8 weight from them on every call, as the fp8 path does (`NF4Linear.int8_weight`:
one Triton pass, the kernel of fp8's: 0.28 ms a 14B block on the H100): held beside the NF4 bytes, the 14B's int8 weights ran out of a 24 GiB budget.

This is the math of torchao's `Int8DynamicActivationInt8WeightConfig` and of LightX2V's int8 modes; we keep our
own code rather than torchao because its tensor subclasses do not compose with our NF4 Linears, fused RMSNorm/RoPE
kernels and CUDA-graph block replay, and its releases pin torch versions this project's CPU CI does not use.

Self-attention (`int8_attention`): SageAttention's scheme (Zhang et al., 2024): K smoothed (its mean over
the tokens subtracted, per head: each query's scores move by one constant, which softmax ignores), Q and
K quantized to int8 per block of `BLOCK` tokens (absmax / 127), S = Q8 K8^T in int32 times the two block
scales, softmax in float32, P V in the compute dtype (16-bit: PV in 8 bits is what costs accuracy). On
CUDA our Triton kernels run it (`int8_attention_triton`: tiles and accumulation per card; why not the
`sageattention` package's, measured, in its docstring), the package's where they cannot, elsewhere this
module's reference math (the same quantization, slower). On Hopper its Q K^T runs at the INT8 rate but its
P V at the bf16 one, where cuDNN's FP8 attention (the fp8 path's) runs both at the 8-bit rate:
bench/bench_int8.py times them.

The sm_80 code path on a newer card (`LINGBOT_ISAAC_TRITON_TARGET=sm80`, `triton_lang.force_target`): our
Triton kernels (and sageattention's) are lowered for sm_80 (mma.sync, no wgmma; the GEMM's Ampere tiles,
`triton_lang.capability`), cuBLASLt's GEMM stays the card's own.

An approximation of the reference, as `--compute fp8` is: the distance from exact is measured in the tests
(tests/worldgen/test_int8.py) and in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F

from worldgen.kernels import int8_attention_triton, int8_triton
from worldgen.kernels.quantized_weights import QuantizedWeight
from worldgen.kernels.triton_lang import capability

INT8_MAX = 127.0
MIN_ROWS = 256  # fewer rows than this: the exact GEMM is as fast (the FP8 path's threshold)
BLOCK = 128  # tokens per Q/K quantization block (SageAttention's for Q; finer blocks: closer, slower)
MIN_CAPABILITY = (8, 0)  # INT8 tensor-core GEMMs through torch._int_mm: Ampere and later
GEMM = "triton"  # "triton": int8_triton.gemm, all in one; "int_mm": cuBLASLt's INT8 GEMM + the Triton epilogue
_failed: set[str] = set()  # Triton kernels that failed once in this process: PyTorch from then on (said once)


def unsupported_reason(device: torch.device | str) -> str | None:
    """Why `--compute int8` cannot run on `device` (None: it can). The CPU runs the reference math."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return (
            f"--compute int8 needs INT8 tensor cores with cuBLASLt's INT8 GEMM (compute capability 8.0+: RTX 30xx, "
            f"A100); {torch.cuda.get_device_name(device)} is {major}.{minor}: use --compute exact"
        )
    return None


def quantize_rows(x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], float32 scales [M, 1]): one scale per row (absmax / 127), rounded to
    nearest even; the reference math (the weights', the attention's and the CPU's). `block`: one scale per
    `block` rows instead ([ceil(M / block), 1])."""
    x = x.float()
    # the scale divided by a tensor, not the number 127: on CUDA PyTorch divides by a Python number as a product with
    # its float32 reciprocal, one ulp off the IEEE quotient (on the CPU, and in our kernels) for some rows
    int8_max = x.new_full((), INT8_MAX)
    if block is None:
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / int8_max
        return torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    rows = x.shape[0]
    padded = F.pad(x, (0, 0, 0, -rows % block)).view(-1, block, x.shape[-1])
    scale = padded.abs().amax(dim=(1, 2), keepdim=True).clamp(min=1e-12) / int8_max
    data = torch.round(padded / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return data.view(-1, x.shape[-1])[:rows], scale.view(-1, 1)


def _triton(name: str, run, *args):
    """A Triton kernel's result, or None where it takes no such call or failed (once said, PyTorch from then on)."""
    if name in _failed or not int8_triton.available():
        return None
    try:
        return run(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (no compiler, a broken install: the reference math, said once)
        _failed.add(name)
        warnings.warn(f"the INT8 {name} Triton kernel failed ({exc}); PyTorch from now on", stacklevel=3)
        return None


def quantize_tokens(x: torch.Tensor, gelu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """An activation [M, K] per token -> (int8 [M, K], float32 [M, 1]): `quantize_rows`' numbers, in one Triton
    pass on CUDA (`int8_triton.quantize_rows`); `gelu`: of the tanh GELU of x (rounded to x's dtype first)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    done = _triton("gelu+quantize" if gelu else "quantize", int8_triton.quantize_rows, x, gelu)
    if done is not None:
        return done
    return quantize_rows(F.gelu(x, approximate="tanh") if gelu else x)


@dataclasses.dataclass
class Int8Rows:
    """An activation already quantized per token (`gelu_then_quantize`, `shared_input`), for the Linears it feeds."""

    data: torch.Tensor  # int8 [M, K]
    scale: torch.Tensor  # float32 [M, 1]
    lead: tuple[int, ...]  # the leading shape of the original [..., K]

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.lead, self.data.shape[-1])

    @classmethod
    def of(cls, data: torch.Tensor, scale: torch.Tensor) -> Int8Rows:
        """int8 [..., K] with float32 scales [..., 1] (`fused.residual_norm`'s quantized output) as rows."""
        k = data.shape[-1]
        return cls(data.view(-1, k), scale.view(-1, 1), tuple(data.shape[:-1]))


def shared_input(x, linear: torch.nn.Module):
    """x quantized per token once when `linear` (and the Linears sharing x: q, k and v) take the W8A8 GEMM, else x
    as it is (also an input quantized already): the same int8 rows each would make, made once."""
    if not isinstance(x, torch.Tensor) or not wants_int8(x, getattr(linear, "compute", "exact")):
        return x
    data, scale = quantize_tokens(x.reshape(-1, x.shape[-1]))
    return Int8Rows(data, scale, tuple(x.shape[:-1]))


def gelu_then_quantize(x: torch.Tensor, linear: torch.nn.Module) -> torch.Tensor | Int8Rows:
    """The feed-forward's tanh GELU of x, quantized in the same kernel when `linear` (the layer it feeds) takes
    the W8A8 GEMM (the fp8 path's `gelu_then_quantize`, in int8); else the GELU alone."""
    if not wants_int8(x, getattr(linear, "compute", "exact")):
        return F.gelu(x, approximate="tanh")
    data, scale = quantize_tokens(x.reshape(-1, x.shape[-1]), gelu=True)
    return Int8Rows(data, scale, tuple(x.shape[:-1]))


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


class Int8Weight(QuantizedWeight):
    """A Linear's weight as int8 [N, K] with one float32 scale per output channel [N, 1] (absmax / 127), made once
    and held in place of a dense Linear's bf16 weight (`worldgen.kernels.quantized_weights`)."""

    kind = "int8"
    quantize = staticmethod(quantize_rows)


def wants_int8(x: torch.Tensor | Int8Rows, compute: str) -> bool:
    """Whether this call takes the int8 path: int8 asked and enough rows to matter, or already quantized."""
    return isinstance(x, Int8Rows) or compute == "int8" and x.numel() // x.shape[-1] >= MIN_ROWS


def int8_linear(
    x: torch.Tensor | Int8Rows, linear: torch.nn.Module, dtype: torch.dtype, weight: Int8Weight | None = None
) -> torch.Tensor:
    """y = x @ W.T + b with x per token and W per output channel in int8, int32 accumulation, `dtype` out
    (x may be quantized already: `Int8Rows`). `weight`: the Linear's int8 weight made for this call (an NF4
    Linear's, `NF4Linear.int8_weight`); None: the one it holds (`Int8Weight.of`). Fewer than `MIN_ROWS` rows:
    the int8 weight dequantized, times x in `dtype` (W8A16)."""
    weight = Int8Weight.of(linear) if weight is None else weight
    bias = linear.bias
    if isinstance(x, Int8Rows):
        lead, (xq, x_scale) = x.lead, (x.data, x.scale)
    else:
        lead = x.shape[:-1]
        if x.numel() // x.shape[-1] < MIN_ROWS:
            return F.linear(x.to(dtype), weight.dequantize(dtype), None if bias is None else bias.to(dtype))
        xq, x_scale = quantize_tokens(x.reshape(-1, x.shape[-1]))
    return int8_gemm(xq, x_scale, weight, bias, dtype).view(*lead, weight.data.shape[0])


def int8_gemm(
    xq: torch.Tensor, x_scale: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """(xq [M, K] int8 @ weight.T) * x_scale * weight's scales (+ bias) in `dtype`: Triton's whole GEMM where
    `GEMM` says so, else `torch._int_mm` and the one-pass Triton epilogue; on the CPU the same math in PyTorch."""
    w_scale = weight.scale
    if GEMM == "triton" and xq.is_cuda:
        done = _triton("gemm", int8_triton.gemm, xq, weight.data, x_scale, w_scale, bias, dtype, capability(xq.device))
        if done is not None:
            return done
    acc = int_matmul(xq, weight.data)
    done = _triton("epilogue", int8_triton.dequantize, acc, x_scale, w_scale, bias, dtype) if acc.is_cuda else None
    if done is not None:
        return done
    out = acc.float() * x_scale * w_scale.view(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V for q [B, Lq, n, d], k and v [B, Lk, n, d] with Q and K in int8 (per
    block, K smoothed) and P V in the compute dtype; -> [B, Lq, n * d] in q's dtype."""
    b, lq, n, d = q.shape
    if int8_triton.on_device(q):  # CUDA (or Triton's interpreter): our kernels, else the package's, else PyTorch
        from worldgen.kernels.attention import OPTIONAL_MIN_KEYS, attention, installed

        if q.is_cuda and k.shape[1] < OPTIONAL_MIN_KEYS:
            return attention(q, k, v)  # a short window: SDPA, as for every optional kernel
        cap = capability(q.device) if q.is_cuda else (9, 0)
        if int8_attention_triton.takes(q, k, v):
            done = _triton("attention", int8_attention_triton.attention, q, k, v, cap)
            if done is not None:
                return done
        if q.is_cuda and installed("sage"):
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
