"""The FP8 compute path (`--compute fp8`): each large Linear as one FP8 GEMM on FP8 tensor cores.

A Linear's weight is quantized to float8 e4m3 with one scale per output channel: a dense (bf16) Linear's once,
on its first FP8 call (`Fp8Weight.of`), its bf16 weight then dropped from the device and restored when another
compute is set (`worldgen.kernels.quantized_weights`, the int8 path's mechanism too: the 1.3B's blocks hold
1.6 GiB of e4m3 instead of 3.1 GiB of bf16); an NF4 Linear's on each call, straight from its NF4 bytes, which
stay what VRAM holds (`worldgen.kernels.nf4`: one Triton kernel, the numbers of dequantizing to bf16 first).
The input is quantized with one scale per token (computed on the fly from that token's largest magnitude:
"dynamic" scaling, nothing calibrated), and `torch._scaled_mm` multiplies the two on the FP8 tensor cores (twice
the bf16 rate on Hopper and Ada), accumulating in float32 and writing bf16. Both quantizations are one fused
Triton kernel each (`torch.compile`).

This is an approximation of the reference, not the reference: e4m3 keeps 3 mantissa bits, so
each GEMM's output moves by ~2-3% relative (docs/benchmarks.md has the measured distance of a full
forward and of the golden cases). Only Linears over many tokens (`MIN_ROWS`) take this path; the
time/text embeddings, the head and anything the reference computes in float32 stay exact.

Hardware: FP8 tensor cores exist on compute capability 8.9 (Ada: RTX 4090, L40) and 9.0+ (Hopper).
Ampere (RTX 3090, A100: 8.0/8.6) has none; there `--compute fp8` is refused and the only
lower-precision option left is INT8 attention (`--attention sage`, SageAttention).

Attention runs in FP8 too where cuDNN's FP8 attention is installed (the `nvidia-cudnn-frontend`
package; Hopper, see worldgen/kernels/cudnn_attention.py): Q, K and V are quantized with one scale per
tensor (`quantize_tensor`), and the e4m3 output goes straight into the output projection's FP8
GEMM. Elsewhere attention stays bf16 (SDPA), and `cudnn_attention.attention_note()` says why.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import torch

from contracts.engine_options import COMPUTES  # noqa: F401  (the one list; used by the pipeline)
from worldgen.errors import InputError
from worldgen.kernels import fused
from worldgen.kernels.quantized_weights import QuantizedWeight
from worldgen.kernels.triton_lang import Signature, launch, tl, triton  # None without Triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_ROWS = 256  # fewer rows than this: the bf16 GEMM is as fast and exact
FAST_ACCUM = True  # Hopper's fast FP8 accumulation (partial sums promoted to float32 less often)
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores (and Triton's e4m3): Ada and Hopper on


def unsupported_reason_of(devices: list[str] | tuple[str, ...]) -> str | None:
    """The first of `devices` that cannot run the FP8 path, and why (None: all can); a device
    PyTorch cannot even ask is a reason too. A worker reports this in its `ready`: the server
    refuses `compute = "fp8"` jobs at its door with these words."""
    for device in devices:
        try:
            reason = unsupported_reason(device)
        except (RuntimeError, AssertionError) as exc:  # no usable CUDA behind a cuda device
            reason = f"--compute fp8: {device} cannot be asked ({exc}); use --compute exact"
        if reason:
            return reason
    return None


def unsupported_reason(device: torch.device | str) -> str | None:
    """None when `device` can run the FP8 path, else why not (one sentence, with what to use instead)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (
            f"--compute fp8 needs an NVIDIA GPU with FP8 tensor cores (Ada RTX 40xx / L40, Hopper H100); "
            f"this job runs on {device.type}: use --compute exact"
        )
    if not hasattr(torch, "_scaled_mm"):
        return f"--compute fp8: this PyTorch ({torch.__version__}) has no torch._scaled_mm; use --compute exact"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"--compute fp8: {name} (compute capability {major}.{minor}) has no FP8 tensor cores; they start "
            f"with Ada (8.9). On Ampere use --compute exact; the only lower-precision option there is INT8 "
            f"attention (--attention sage, approximate)"
        )
    return None


def check_dtype(dtype: torch.dtype | str | None) -> None:
    """Refuse fp8 with a compute dtype other than bf16: only bf16 calls take the FP8 GEMM
    (`wants_fp8`), so the run would stay exact while its provenance record said fp8."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else None
    if name not in (None, "bfloat16"):
        raise InputError(
            f"--compute fp8 runs bf16 matmuls as FP8 GEMMs; this engine computes in {name}: use --dtype bf16 "
            "with fp8, or --compute exact"
        )


def check_supported(device: torch.device | str) -> None:
    reason = unsupported_reason(device)
    if reason:
        raise InputError(reason)


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (float8 [M, K], float32 [M, 1] scales) with x ~= q * scale, row by row."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@functools.cache
def _compiled_quantize():
    fused.allow_recompiles()
    # dynamic: one kernel for every Linear's shape (activations and weights alike)
    return torch.compile(_quantize_rows, dynamic=True, fullgraph=True)


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(
        x_ptr, q_ptr, s_ptr, n_cols, x_stride, q_stride, fp8_max, BLOCK: tl.constexpr, GELU: tl.constexpr
    ):
        # one program per row, the whole row in registers: x is read once (the compiled reduction
        # reads it twice: once for the maximum, once to scale)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if GELU:  # the feed-forward's tanh GELU first, rounded to bf16 where eager PyTorch rounds it
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            x = (0.5 * x * (2.0 * tl.sigmoid(2.0 * inner))).to(tl.bfloat16).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / fp8_max
        q = tl.minimum(tl.maximum(x / scale, -fp8_max), fp8_max)
        tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + row, scale)


def _triton_quantize_rows(x: torch.Tensor, gelu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    q = torch.empty((rows, cols), device=x.device, dtype=FP8)
    scale = torch.empty((rows, 1), device=x.device, dtype=torch.float32)
    block = triton.next_power_of_2(cols)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    launch(
        _quantize_rows_kernel, (rows,), x, q, scale, cols, x.stride(0), q.stride(0), FP8_MAX,
        BLOCK=block, GELU=gelu, num_warps=warps,
    )  # fmt: skip
    return q, scale


# The launch's variants (`triton_lang.Signature`): a 5,120-wide input, and the feed-forward's 13,824-wide
# hidden with its GELU (e4m3 out: compute capability 8.9+, as the FP8 path itself)
SIGNATURES = {
    "_quantize_rows_kernel": (
        Signature("*bf16 *fp8e4nv *fp32 i32 i32 i32 fp32", {"BLOCK": 8192, "GELU": False}, {"num_warps": 8}),
        Signature("*bf16 *fp8e4nv *fp32 i32 i32 i32 fp32", {"BLOCK": 16384, "GELU": True}, {"num_warps": 16}),
    ),
}  # fmt: skip


KERNEL = "triton"  # "triton" (hand-written, one read) or "compile" (torch.compile'd); eager on the CPU
_failed: set[str] = set()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (float8, per-row float32 scales): one fused kernel on CUDA, eager elsewhere."""
    # one input type for the kernels (a Parameter or a float32 tensor would each recompile)
    x = x.detach().to(torch.bfloat16).contiguous() if x.is_cuda else x
    kernels = []
    if x.is_cuda:
        if KERNEL == "triton" and triton is not None and x.shape[-1] <= 32768:
            kernels.append(("triton", _triton_quantize_rows))
        kernels.append(("compile", lambda t: _compiled_quantize()(t)))
    for name, kernel in kernels:
        if name in _failed:
            continue
        try:
            return kernel(x)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (no Triton / compiler: the next kernel, said once)
            _failed.add(name)
            warnings.warn(f"the {name} FP8 quantization kernel failed ({exc}); trying the next one", stacklevel=2)
    return _quantize_rows(x)


class Fp8Weight(QuantizedWeight):
    """A dense Linear's weight as e4m3 [N, K] with one float32 scale per output channel [N, 1] (`quantize_rows`:
    the numbers quantizing it on every call gave), made once and held in place of its bf16 weight
    (`worldgen.kernels.quantized_weights`)."""

    kind = "fp8"
    quantize = staticmethod(quantize_rows)


def _quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax().float().clamp(min=1e-12)
    descale = amax / FP8_MAX
    return (x.float() / descale).clamp(-FP8_MAX, FP8_MAX).to(FP8), descale.view(1, 1, 1, 1)


@functools.cache
def _compiled_quantize_tensor():
    fused.allow_recompiles()
    # two kernels (the tensor's largest magnitude, then the scaled cast), no host synchronisation
    return torch.compile(_quantize_tensor, dynamic=False, fullgraph=True)


@dataclasses.dataclass
class QuantizedTensor:
    """A tensor in e4m3 with one scale for all of it: value ~= data * descale."""

    data: torch.Tensor  # float8, the original's shape
    descale: torch.Tensor  # float32 [1, 1, 1, 1], on the tensor's device

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (self.data.float() * self.descale.view(())).to(dtype)


def quantize_tensor(x: torch.Tensor) -> QuantizedTensor:
    """x -> e4m3 with one dynamic scale (its largest magnitude maps to 448): what cuDNN's FP8
    attention takes for Q, K and V. One fused pair of kernels on CUDA, eager elsewhere."""
    if x.is_cuda and fused.KERNELS == "triton":
        out = fused._hand_written("quantize_tensor", (x,), {})
        if out is not None:
            return QuantizedTensor(*out)
    if x.is_cuda and "tensor" not in _failed:
        try:
            return QuantizedTensor(*_compiled_quantize_tensor()(x))
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (no Triton / compiler: eager, said once)
            _failed.add("tensor")
            warnings.warn(f"the compiled FP8 tensor quantization failed ({exc}); using eager", stacklevel=2)
    return QuantizedTensor(*_quantize_tensor(x))


@dataclasses.dataclass
class QuantizedRows:
    """An activation already quantized (`quantize_input`), for several Linears that share an input."""

    data: torch.Tensor  # float8 [M, K]
    scale: torch.Tensor  # float32 [M, 1]
    lead: tuple[int, ...]  # the leading shape of the original [..., K]

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.lead, self.data.shape[-1])

    @classmethod
    def of(cls, data: torch.Tensor, scale: torch.Tensor) -> QuantizedRows:
        """e4m3 [..., K] with float32 scales [..., 1] (a fused kernel's output) as rows."""
        k = data.shape[-1]
        return cls(data.view(-1, k), scale.view(-1, 1), tuple(data.shape[:-1]))


def takes_fp8(x: torch.Tensor, linear: torch.nn.Module) -> bool:
    """Whether `linear` would run x (or an input of x's rows) as an FP8 GEMM (`wants_fp8`)."""
    dtype = getattr(linear, "compute_dtype", None) or linear.weight.dtype
    return wants_fp8(x, getattr(linear, "compute", "exact"), dtype, linear.out_features)


def quantize_input(x: torch.Tensor | QuantizedRows, linear: torch.nn.Module) -> torch.Tensor | QuantizedRows:
    """x quantized once when `linear` (and the Linears sharing x) would take the FP8 path, else x (also
    when x is quantized already)."""
    if isinstance(x, QuantizedRows) or not takes_fp8(x, linear):
        return x
    data, scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    return QuantizedRows(data, scale, tuple(x.shape[:-1]))


def gelu_then_quantize(x: torch.Tensor, linear: torch.nn.Module) -> torch.Tensor | QuantizedRows:
    """The feed-forward's tanh GELU of x, quantized in the same kernel when `linear` (the layer it
    feeds) takes the FP8 path: the bf16 GELU output is never written out and read back."""
    fuse = takes_fp8(x, linear) and x.dtype == torch.bfloat16
    if not (fuse and triton is not None and x.shape[-1] <= 32768 and "gelu" not in _failed):
        return quantize_input(torch.nn.functional.gelu(x, approximate="tanh"), linear)
    try:
        data, scale = _triton_quantize_rows(x.reshape(-1, x.shape[-1]).contiguous(), gelu=True)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (no Triton / compiler: GELU, then the quantizer)
        _failed.add("gelu")
        warnings.warn(f"the fused GELU + FP8 quantization kernel failed ({exc}); unfused from now on", stacklevel=2)
        return quantize_input(torch.nn.functional.gelu(x, approximate="tanh"), linear)
    return QuantizedRows(data, scale, tuple(x.shape[:-1]))


def fp8_linear(
    x: torch.Tensor | QuantizedRows,
    weight: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """y = x @ weight.T + bias with both operands in FP8 (per-token x scales, per-channel weight
    scales), float32 accumulation, bf16 out. x [..., K] (any float dtype, or already quantized),
    weight [N, K] (quantized here), or already quantized as (e4m3 [N, K], float32 [N, 1] scales)."""
    if isinstance(x, QuantizedRows):
        lead, xq, x_scale = x.lead, x.data, x.scale
    else:
        lead = x.shape[:-1]
        xq, x_scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    wq, w_scale = weight if isinstance(weight, tuple) else quantize_rows(weight)
    out = torch._scaled_mm(
        xq,
        wq.t(),  # column-major [K, N], as the FP8 GEMM wants its second operand
        scale_a=x_scale,
        scale_b=w_scale.view(1, -1),
        bias=None if bias is None else bias.to(torch.bfloat16),
        out_dtype=torch.bfloat16,
        use_fast_accum=FAST_ACCUM,
    )
    return out.view(*lead, wq.shape[0])


def wants_fp8(x: torch.Tensor, compute: str, dtype: torch.dtype, out_features: int = 16) -> bool:
    """Whether this call takes the FP8 GEMM: fp8 asked, a CUDA bf16 call, enough rows to matter, and both of
    the GEMM's widths multiples of 16 (`torch._scaled_mm`'s rule: every real model's are; a tiny one's may not)."""
    return (
        compute == "fp8"
        and dtype == torch.bfloat16
        and x.is_cuda
        and x.numel() // x.shape[-1] >= MIN_ROWS
        and x.shape[-1] % 16 == 0
        and out_features % 16 == 0
    )
