"""The DiT's fused elementwise groups (`worldgen.kernels.fused`) as hand-written Triton kernels, on CUDA.

Why hand-written when `torch.compile` makes the same kernels: on the H100 a fresh process spent 11-13 s
of its first Fast chunk in dynamo and Inductor for 14 small graphs, most of it Python (tracing, lowering,
code generation, guards), and a second process still ~2 s loading them back (docs/benchmarks.md,
"Session 10: Fast"); every call also pays dynamo's guards. A Triton kernel is compiled once per process
in a fraction of a second, kept in Triton's disk cache (a second process loads it in milliseconds), and
launched without guards. The default (`fused.KERNELS = "triton"`) since they are compiled ahead, side
by side, when a Fast pipeline loads (`worldgen.kernels.triton_lang.compiling_ahead`): one after another
inside the first forwards, a fresh process was no faster than the compiled path (docs/benchmarks.md,
"Session 10: Fast"); compiled ahead, its load took 7.6-8.7 s against 11.6-13.3 s ("Session 11: Fast").

Numerics: each kernel rounds where the eager function rounds (a bf16 product, `1 + scale` in the
scale's dtype, the casts to the output dtype) and computes in float32 in between; a row's float32 sums
run in another order than PyTorch's, as Inductor's did. Each function takes the argument patterns the
DiT calls it with and returns None for any other (the caller then uses the compiled function).

Cards: the kernels that read or write e4m3 (the FP8 path's, and the FP8 KV cache's, which any card may take:
`--kv-cache fp8`, or `auto` on a small budget) run where the card has it, compute capability 8.9+ (Triton has
no e4m3 below: the kernel would not compile); below, these functions take no such call (`e4m3_kernels`: the
card decides) and the caller's PyTorch function runs, the numbers those kernels match.
"""

from __future__ import annotations

import functools
import os

import torch

from worldgen.kernels.triton_lang import Signature, capability, launch, tl, triton

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
E4M3_CAPABILITY = (8, 9)  # Triton's float8e4nv (e4m3): Ada (8.9) and Hopper (9.0) on, as FP8 tensor cores


# Triton's interpreter runs these kernels on CPU tensors (TRITON_INTERPRET=1: the tests, without a GPU)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    return triton is not None


def _on_device(t: torch.Tensor) -> bool:
    return t.is_cuda or _INTERPRETED


def e4m3_kernels(capability: tuple[int, int]) -> bool:
    """Whether a card of this compute capability runs this module's e4m3 kernels (the decision alone, no GPU asked)."""
    return tuple(capability) >= E4M3_CAPABILITY


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return capability(device)  # the card's, or the one forced (triton_lang.TARGET_SWITCH)


def _takes_e4m3(t: torch.Tensor) -> bool:
    """Whether `t`'s card runs the e4m3 kernels (Triton's interpreter, on CPU tensors, runs them all)."""
    return not t.is_cuda or e4m3_kernels(_capability(t.device))


def _rows_of(x: torch.Tensor) -> bool:
    return _on_device(x) and x.is_contiguous() and x.dim() >= 2


def _broadcast_strides(t: torch.Tensor, x: torch.Tensor) -> tuple[int, int] | None:
    """(batch stride, token stride) of `t` broadcast to x [B, L, D] (0 where broadcast); None when its
    last dim is not contiguous or it does not broadcast."""
    try:
        te = t.expand(x.shape)
    except RuntimeError:
        return None
    if te.stride(2) != 1 or not _on_device(t):
        return None
    return te.stride(0), te.stride(1)


if triton is not None:
    # token and row counts are not specialised on: a kernel's variants do not depend on the job's size
    # (`worldgen.kernels.triton_lang`: compiled ahead on a dry forward, launched on the real one)
    @triton.jit(do_not_specialize=["tokens"])
    def _layer_norm_kernel(
        x_ptr, y_ptr, gate_ptr, cam_a_ptr, cam_b_ptr, x_out_ptr, out_ptr, row_scale_ptr,
        shift_ptr, scale_ptr, w_ptr, b_ptr, n_cols, tokens,
        g_b, g_l, ca_b, ca_l, cb_b, cb_l, sh_b, sh_l, sc_b, sc_l, eps,
        RESIDUAL: tl.constexpr, GATE: tl.constexpr, CAMERA: tl.constexpr, MODULATE: tl.constexpr,
        AFFINE: tl.constexpr, QUANT: tl.constexpr, INT8: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # one row in registers: [x + y * gate] [camera: (1 + a) x + b, 1 + a in a's dtype] (the residual
        # stream's update, stored), then its LayerNorm [affine] [* (1 + scale) + shift], rounded to the
        # output dtype, or to bf16 and then to e4m3 with one float32 scale a row (fp8.quantize_rows' rule), or
        # with INT8 to int8 (int8.quantize_rows' rule: IEEE divisions, round half to even, +-127)
        row = tl.program_id(0).to(tl.int64)
        batch, token = row // tokens, row % tokens
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            y = tl.load(y_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            if GATE:
                y = y * tl.load(gate_ptr + batch * g_b + token * g_l + cols, mask=mask, other=0.0).to(tl.float32)
            x = x + y
        if CAMERA:
            a = tl.load(cam_a_ptr + batch * ca_b + token * ca_l + cols, mask=mask, other=0.0)
            one_plus = (1.0 + a.to(tl.float32)).to(a.dtype).to(tl.float32)
            x = one_plus * x + tl.load(cam_b_ptr + batch * cb_b + token * cb_l + cols, mask=mask, other=0.0).to(
                tl.float32
            )
        if RESIDUAL or CAMERA:
            tl.store(x_out_ptr + row * n_cols + cols, x, mask=mask)
        mean = tl.sum(x, axis=0) / n_cols
        centred = tl.where(mask, x - mean, 0.0)
        var = tl.sum(centred * centred, axis=0) / n_cols
        h = centred * tl.rsqrt(var + eps)
        if AFFINE:
            h = h * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            h = h + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if MODULATE:
            scale = tl.load(scale_ptr + batch * sc_b + token * sc_l + cols, mask=mask, other=0.0).to(tl.float32)
            shift = tl.load(shift_ptr + batch * sh_b + token * sh_l + cols, mask=mask, other=0.0).to(tl.float32)
            h = h * (1.0 + scale) + shift
        if QUANT:
            h = tl.where(mask, h.to(tl.bfloat16).to(tl.float32), 0.0)
            if INT8:  # 1.5 * 2^23 added and taken away: round half to even, as int8_triton's quantizer does
                row_scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12), 127.0)
                h = (tl.math.div_rn(h, row_scale) + 12582912.0) - 12582912.0
                h = tl.minimum(tl.maximum(h, -127.0), 127.0)
            else:
                row_scale = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-12) / 448.0
                h = tl.minimum(tl.maximum(h / row_scale, -448.0), 448.0)
            tl.store(row_scale_ptr + row, row_scale)
        tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["tokens"])
    def _rms_norm_kernel(
        x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, n_cols, tokens, half_head, eps,
        ROPE: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # the row as (even, odd) pairs: RoPE rotates each pair; the norm is over all of them. The row
        # is loaded and stored whole and split into pairs in registers: two stride-2 loads and stores
        # took 70 us a call at 4,524 x 5,120 against 45 (docs/benchmarks.md, "Session 14: Fast")
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, 2 * BLOCK)
        in_row = cols < n_cols
        even, odd = tl.split(tl.reshape(tl.load(x_ptr + row * n_cols + cols, mask=in_row, other=0.0), (BLOCK, 2)))
        even, odd = even.to(tl.float32), odd.to(tl.float32)
        rstd = tl.rsqrt((tl.sum(even * even, axis=0) + tl.sum(odd * odd, axis=0)) / n_cols + eps)
        dtype = out_ptr.dtype.element_ty
        # normed rounded to x's dtype, times the weight in x's dtype, rounded again (the reference's order)
        w_even, w_odd = tl.split(tl.reshape(tl.load(w_ptr + cols, mask=in_row, other=0.0), (BLOCK, 2)))
        w_even, w_odd = w_even.to(dtype).to(tl.float32), w_odd.to(dtype).to(tl.float32)
        even = ((even * rstd).to(dtype).to(tl.float32) * w_even).to(dtype).to(tl.float32)
        odd = ((odd * rstd).to(dtype).to(tl.float32) * w_odd).to(dtype).to(tl.float32)
        if ROPE:
            pairs = tl.arange(0, BLOCK)
            mask = pairs < n_cols // 2
            at = (row % tokens) * half_head + pairs % half_head
            cos = tl.load(cos_ptr + at, mask=mask, other=0.0)
            sin = tl.load(sin_ptr + at, mask=mask, other=0.0)
            rotated_even = even * cos - odd * sin
            odd = even * sin + odd * cos
            even = rotated_even
        tl.store(out_ptr + row * n_cols + cols, tl.interleave(even, odd).to(dtype), mask=in_row)

    @triton.jit(do_not_specialize=["tokens"])
    def _residual_kernel(
        x_ptr, y_ptr, a_ptr, b_ptr, out_ptr, numel, n_cols, tokens, a_b, a_l, b_b, b_l,
        CAMERA: tl.constexpr, HAS_A: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # gated residual: x + y * a (a: the gate, or none); camera: (1 + a) * x + b, 1 + a in a's dtype
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = at < numel
        row, col = at // n_cols, at % n_cols
        batch, token = row // tokens, row % tokens
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        if CAMERA:
            a = tl.load(a_ptr + batch * a_b + token * a_l + col, mask=mask, other=0.0)
            one_plus = (1.0 + a.to(tl.float32)).to(a.dtype).to(tl.float32)
            shift = tl.load(b_ptr + batch * b_b + token * b_l + col, mask=mask, other=0.0).to(tl.float32)
            out = one_plus * x + shift
        else:
            y = tl.load(y_ptr + at, mask=mask, other=0.0).to(tl.float32)
            if HAS_A:
                y = y * tl.load(a_ptr + batch * a_b + token * a_l + col, mask=mask, other=0.0).to(tl.float32)
            out = x + y
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["rows"])
    def _per_token_kernel(
        x_ptr, s_ptr, q_ptr, s_out_ptr, descale_ptr, rows, n_cols,
        MODE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # MODE 0 quantize (x -> e4m3, one scale a row), 1 dequantize (e4m3 * scale -> out dtype),
        # 2 requantize (e4m3 * row scale / tensor descale -> e4m3)
        each = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        live = each < rows
        r = each[:, None]
        c = tl.arange(0, BLOCK)[None, :]
        mask = (r < rows) & (c < n_cols)
        x = tl.load(x_ptr + r * n_cols + c, mask=mask, other=0.0).to(tl.float32)
        if MODE == 0:
            amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-12)
            scale = (amax / 448.0).to(s_out_ptr.dtype.element_ty)
            tl.store(s_out_ptr + each, scale, mask=live)
            q = tl.minimum(tl.maximum(x / scale.to(tl.float32)[:, None], -448.0), 448.0)
            tl.store(q_ptr + r * n_cols + c, q.to(q_ptr.dtype.element_ty), mask=mask)
        elif MODE == 1:
            dtype = q_ptr.dtype.element_ty
            scale = tl.load(s_ptr + each, mask=live, other=0.0).to(dtype).to(tl.float32)
            out = x.to(dtype).to(tl.float32) * scale[:, None]
            tl.store(q_ptr + r * n_cols + c, out.to(dtype), mask=mask)
        else:
            ratio = tl.load(s_ptr + each, mask=live, other=0.0).to(tl.float32) / tl.load(descale_ptr)
            q = tl.minimum(tl.maximum(x * ratio[:, None], -448.0), 448.0)
            tl.store(q_ptr + r * n_cols + c, q.to(q_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _abs_max_kernel(x_ptr, amax_ptr, numel, BLOCK: tl.constexpr):
        # a few programs a multiprocessor, each over every num_programs-th block: one atomic a program
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        largest = tl.zeros([BLOCK], dtype=tl.float32)
        for _ in range(0, tl.cdiv(numel - tl.program_id(0) * BLOCK, step)):
            x = tl.load(x_ptr + at, mask=at < numel, other=0.0).to(tl.float32)
            largest = tl.maximum(largest, tl.abs(x))
            at += step
        tl.atomic_max(amax_ptr, tl.max(largest, axis=0))

    @triton.jit
    def _scale_cast_kernel(x_ptr, q_ptr, amax_ptr, descale_ptr, numel, BLOCK: tl.constexpr):
        # the descale as fp8._quantize_tensor makes it on CUDA, where PyTorch divides a tensor by a number as a
        # multiplication by its float32 reciprocal; by every program, the first stores it
        descale = tl.maximum(tl.load(amax_ptr), 1e-12) * (1.0 / 448.0)
        if tl.program_id(0) == 0:
            tl.store(descale_ptr, descale)
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = at < numel
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        # IEEE division, as PyTorch divides by a tensor (Triton's `/` is the approximate one: 21 of 41.7M bytes moved)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, descale), -448.0), 448.0)
        tl.store(q_ptr + at, q.to(q_ptr.dtype.element_ty), mask=mask)


def _row_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def residual_norm(x, y, gate, cam, shift, scale, weight, bias, eps, out_dtype, quantize) -> tuple | None:
    """`fused.residual_norm` in one kernel: -> (x updated, h), h in out_dtype or, `quantize` "fp8" or "int8",
    (e4m3 or int8, float32 row scales)."""
    if not (_rows_of(x) and x.dim() == 3 and x.dtype == torch.float32 and out_dtype in _FLOATS):
        return None
    if (shift is None) != (scale is None) or (weight is None) != (bias is None):
        return None
    if quantize and (out_dtype != torch.bfloat16 or quantize == "fp8" and not _takes_e4m3(x)):
        return None
    cam_a, cam_b = (None, None) if cam is None else cam
    named = {"gate": gate, "cam_a": cam_a, "cam_b": cam_b, "shift": shift, "scale": scale}
    strides = {name: (0, 0) if t is None else _broadcast_strides(t, x) for name, t in named.items()}
    if any(st is None for st in strides.values()):
        return None
    if any(t is not None and t.dtype != torch.float32 for t in (gate, shift, scale)):
        return None
    if cam is not None and not (cam_a.dtype in _FLOATS and cam_b.dtype in _FLOATS):
        return None
    if y is not None and not (y.shape == x.shape and y.is_contiguous() and y.dtype in _FLOATS and _on_device(y)):
        return None
    if weight is not None and not (weight.is_contiguous() and bias.is_contiguous() and weight.dim() == 1):
        return None
    b, tokens, cols = x.shape
    x_out = x if y is None and cam is None else torch.empty_like(x)
    out = torch.empty(x.shape, dtype={"fp8": FP8, "int8": torch.int8}.get(quantize, out_dtype), device=x.device)
    row_scale = torch.empty((b, tokens, 1), dtype=torch.float32, device=x.device) if quantize else x
    block = triton.next_power_of_2(cols)
    launch(
        _layer_norm_kernel, (b * tokens,), x, x if y is None else y, x if gate is None else gate,
        x if cam is None else cam_a, x if cam is None else cam_b, x_out, out, row_scale,
        x if shift is None else shift, x if scale is None else scale, x if weight is None else weight,
        x if bias is None else bias, cols, tokens, *strides["gate"], *strides["cam_a"], *strides["cam_b"],
        *strides["shift"], *strides["scale"], eps,
        RESIDUAL=y is not None, GATE=gate is not None, CAMERA=cam is not None, MODULATE=scale is not None,
        AFFINE=weight is not None, QUANT=bool(quantize), INT8=quantize == "int8", BLOCK=block,
        num_warps=_row_warps(block),
    )  # fmt: skip
    return x_out, ((out, row_scale) if quantize else out)


def modulated_layer_norm(x, shift, scale, weight, bias, eps, out_dtype) -> torch.Tensor | None:
    done = residual_norm(x, None, None, None, shift, scale, weight, bias, eps, out_dtype, "")
    return None if done is None else done[1]


def _rms_norm(x, weight, cos, sin, eps, half_head) -> torch.Tensor | None:
    if not (_rows_of(x) and x.dtype in _FLOATS and x.shape[-1] % 2 == 0 and weight.is_contiguous()):
        return None
    cols = x.shape[-1]
    tokens = x.shape[-2]
    if cos is not None:
        ok = cos.dtype == sin.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
        if not (ok and tuple(cos.shape) == (tokens, half_head) and _on_device(cos)):
            return None
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols // 2)
    launch(
        _rms_norm_kernel, (x.numel() // cols,), x, weight, x if cos is None else cos, x if sin is None else sin, out, cols, tokens, max(half_head, 1), eps,
        ROPE=cos is not None, BLOCK=block, num_warps=_row_warps(block),
    )  # fmt: skip
    return out


def rms_norm(x, weight, eps) -> torch.Tensor | None:
    return _rms_norm(x, weight, None, None, eps, 0)


def rms_norm_rope(x, weight, cos, sin, eps, num_heads) -> torch.Tensor | None:
    if x.dim() != 3 or x.shape[-1] % (2 * num_heads):
        return None
    b, s, cols = x.shape
    out = _rms_norm(x, weight, cos, sin, eps, cols // num_heads // 2)
    return None if out is None else out.view(b, s, num_heads, -1)


def _residual(x, y, a, b, camera: bool) -> torch.Tensor | None:
    if not (_rows_of(x) and x.dim() == 3 and x.dtype == torch.float32):
        return None
    if not camera and not (y.shape == x.shape and y.is_contiguous() and y.dtype in _FLOATS and _on_device(y)):
        return None
    ab = bb = (0, 0)
    if a is not None:
        ab = _broadcast_strides(a, x)
        if ab is None:
            return None
    if camera:
        bb = _broadcast_strides(b, x)
        if bb is None or a.dtype not in _FLOATS or b.dtype not in _FLOATS:
            return None
    out = torch.empty_like(x)
    block = 2048
    launch(
        _residual_kernel, (triton.cdiv(x.numel(), block),), x, x if y is None else y, x if a is None else a, x if b is None else b, out, x.numel(), x.shape[2],
        x.shape[1], *ab, *bb, CAMERA=camera, HAS_A=a is not None, BLOCK=block, num_warps=8,
    )  # fmt: skip
    return out


def gated_residual(x, y, gate) -> torch.Tensor | None:
    if gate is not None and gate.dtype != torch.float32:
        return None
    return _residual(x, y, gate, None, camera=False)


def camera_modulate(x, scale, shift) -> torch.Tensor | None:
    return _residual(x, None, scale, shift, camera=True)


def _per_token(x, s, q, s_out, descale, mode: int) -> None:
    cols = x.shape[-1]
    rows = x.numel() // cols
    block = triton.next_power_of_2(cols)
    per = max(1, 4096 // block)
    launch(
        _per_token_kernel, (triton.cdiv(rows, per),), x, s, q, s_out, descale, rows, cols,
        MODE=mode, ROWS=per, BLOCK=block, num_warps=4,
    )  # fmt: skip


def quantize_per_token(x, scale_dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    scale = torch.empty((*x.shape[:-1], 1), dtype=scale_dtype, device=x.device)
    return (q, scale) if quantize_per_token_into(x, q, scale) else None


def quantize_per_token_into(x, data, scale) -> bool | None:
    if not (_rows_of(x) and x.dtype in _FLOATS and scale.dtype in _FLOATS and x.shape[-1] <= 4096):
        return None
    if not _takes_e4m3(x):
        return None
    shaped = data.shape == x.shape and tuple(scale.shape) == (*x.shape[:-1], 1)
    if not (shaped and data.dtype == FP8 and data.is_contiguous() and scale.is_contiguous()):
        return None
    _per_token(x, x, data, scale, x, 0)
    return True


def _window_ok(data: torch.Tensor, scale: torch.Tensor) -> bool:
    shaped = tuple(scale.shape) == (*data.shape[:-1], 1) and data.shape[-1] <= 4096
    fits = _rows_of(data) and scale.is_contiguous() and data.dtype == FP8 and shaped and scale.dtype in _FLOATS
    return fits and _takes_e4m3(data)


def dequantize_per_token(data, scale, dtype) -> torch.Tensor | None:
    if not (_window_ok(data, scale) and dtype in _FLOATS):
        return None
    out = torch.empty(data.shape, dtype=dtype, device=data.device)
    _per_token(data, scale, out, scale, scale, 1)
    return out


def requantize_per_tensor(data, scale) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not _window_ok(data, scale):
        return None
    descale = scale.float().amax().clamp_min(1e-12)
    q = torch.empty(data.shape, dtype=FP8, device=data.device)
    _per_token(data, scale, q, scale, descale, 2)
    return q, descale.view(1, 1, 1, 1)


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x -> (e4m3, float32 [1, 1, 1, 1] descale) with x's largest magnitude at 448 (fp8.quantize_tensor)."""
    if not (_on_device(x) and x.is_contiguous() and x.dtype in _FLOATS and x.numel() > 0 and _takes_e4m3(x)):
        return None
    # two kernels and a memset: the largest magnitude (atomics into `amax`), then the scaled cast. PyTorch's
    # aminmax and the five small ops that made the descale took 0.25 ms for the 1.3B's window of 27,144 tokens,
    # twice a block (K and V) in every forward (docs/benchmarks.md, "Session 37")
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    descale = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=x.device)
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    block, numel = 4096, x.numel()
    programs = min(triton.cdiv(numel, block), 4 * _multiprocessors(x.device))
    launch(_abs_max_kernel, (programs,), x, amax, numel, BLOCK=block, num_warps=8)
    launch(_scale_cast_kernel, (triton.cdiv(numel, block),), x, q, amax, descale, numel, BLOCK=block, num_warps=8)
    return q, descale


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if not torch.cuda.is_available() or device.type != "cuda":
        return 4  # Triton's interpreter (CPU tensors)
    return torch.cuda.get_device_properties(device).multi_processor_count


# The launches' variants (`triton_lang.Signature`), at the DiT's widths (5,120: a row's BLOCK 8,192 for the
# LayerNorm, 4,096 pairs for the RMSNorm; heads of 128 for the KV cache): the calls of a block (worldgen.models.dit)
# in bf16, float16 and float32, and the e4m3 ones (the FP8 path's, the FP8 KV cache's: 8.9+, `e4m3_kernels`)
_LN = "*fp32 {y} *fp32 {cam} {cam} *fp32 {out} *fp32 *fp32 *fp32 {w} {w} i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 fp32"
_LN_FLAGS = ("RESIDUAL", "GATE", "CAMERA", "MODULATE", "AFFINE", "QUANT", "INT8")
_LN_OPTIONS = {"num_warps": 8}


def _ln(flags: str, **dtypes: str) -> Signature:
    """A LayerNorm variant: `flags`, the constexprs set (the rest off); the pointers' types, float32 by default."""
    types = _LN.format(**{"y": "*fp32", "cam": "*fp32", "out": "*bf16", "w": "*fp32", **dtypes})
    constexprs = {name: name in flags.split() for name in _LN_FLAGS}
    return Signature(types, {**constexprs, "BLOCK": 8192}, _LN_OPTIONS)


_PER_TOKEN = {"ROWS": 32, "BLOCK": 128}
SIGNATURES = {
    "_layer_norm_kernel": (
        _ln("MODULATE"),  # a block's self-attention input
        _ln("RESIDUAL GATE CAMERA AFFINE", y="*bf16", cam="*bf16", w="*bf16"),  # the residual, the camera, norm3
        _ln("RESIDUAL MODULATE QUANT", y="*bf16", out="*fp8e4nv"),  # the feed-forward's e4m3 input
        _ln("RESIDUAL MODULATE QUANT INT8", y="*bf16", out="*i8"),  # its int8 input
        _ln("RESIDUAL GATE AFFINE", out="*fp32"),  # float32 compute
        _ln("RESIDUAL MODULATE", y="*fp16", out="*fp16"),  # float16 compute
    ),
    "_rms_norm_kernel": (
        Signature("*bf16 *bf16 *fp32 *fp32 *bf16 i32 i32 i32 fp32", {"ROPE": True, "BLOCK": 4096}, {"num_warps": 8}),
        Signature("*fp32 *fp32 *fp32 *fp32 *fp32 i32 i32 fp32", {"half_head": 1, "ROPE": False, "BLOCK": 4096}, {"num_warps": 8}),
        Signature("*fp16 *fp16 *fp32 *fp32 *fp16 i32 i32 i32 fp32", {"ROPE": True, "BLOCK": 4096}, {"num_warps": 8}),
    ),
    "_residual_kernel": (
        Signature("*fp32 *bf16 *fp32 *fp32 *fp32 i32 i32 i32 i32 i32 i32 i32", {"CAMERA": False, "HAS_A": True, "BLOCK": 2048}, {"num_warps": 8}),
        Signature("*fp32 *fp32 *bf16 *bf16 *fp32 i32 i32 i32 i32 i32 i32 i32", {"CAMERA": True, "HAS_A": True, "BLOCK": 2048}, {"num_warps": 8}),
        Signature("*fp32 *bf16 *fp32 *fp32 *fp32 i64 i32 i32 i32 i32 i32 i32", {"CAMERA": False, "HAS_A": False, "BLOCK": 2048}, {"num_warps": 8}),
    ),
    "_per_token_kernel": (  # the FP8 KV cache: write (quantize), read (dequantize), requantize per tensor
        Signature("*bf16 *bf16 *fp8e4nv *bf16 *bf16 i32 i32", {**_PER_TOKEN, "MODE": 0}, {"num_warps": 4}),
        Signature("*fp8e4nv *bf16 *bf16 *bf16 *bf16 i32 i32", {**_PER_TOKEN, "MODE": 1}, {"num_warps": 4}),
        Signature("*fp8e4nv *bf16 *fp8e4nv *bf16 *fp32 i32 i32", {**_PER_TOKEN, "MODE": 2}, {"num_warps": 4}),
    ),
    "_abs_max_kernel": (Signature("*bf16 *fp32 i32", {"BLOCK": 4096}, {"num_warps": 8}),),
    "_scale_cast_kernel": (Signature("*bf16 *fp8e4nv *fp32 *fp32 i32", {"BLOCK": 4096}, {"num_warps": 8}),),
}  # fmt: skip
