"""The DiT's elementwise work (norms, modulation, RoPE, gated residuals), eager or fused on CUDA.

At 480x832x81 one block moves its float32 residual stream (32,760 x 5,120 = 671 MB) through about
thirty separate elementwise kernels (LayerNorm, `* (1 + scale)`, `+ shift`, the cast to bf16 that
each Linear repeats, RMSNorm's five passes, RoPE's six, the gated residuals): tens of GB of memory
traffic per block, about a quarter of the forward. Each function here is one of those groups, written
once in plain PyTorch (the reference's order of operations and roundings, so the CPU golden tests
see exactly the old code) and, on CUDA when `enable(True)`, one Triton kernel per group: hand-written
(below) or compiled by `torch.compile`. Inductor is told to emulate eager's bf16 roundings
(`emulate_precision_casts`), so the fused kernels round where the eager code does: the same
numerics class, only the order of float32 summation inside a reduction may differ. With
`KERNELS = "triton"` (the default) each call goes first to a hand-written Triton kernel of the same
group where one takes it (`worldgen.kernels.fused_triton`: no dynamo, no Inductor).

Only these small pure functions are compiled (not the blocks), so bitsandbytes' kernels, the
attention kernels and the chunked feed-forward stay outside any graph, and a compile failure
(no C compiler, no Triton) falls back to the eager function with a warning instead of failing a job.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

_enabled = True  # on by default: it only ever applies to CUDA tensors
_failed: set[str] = set()


def enable(on: bool) -> None:
    """Fuse on CUDA (the default) or not (process-wide: the kernels are shared by every model)."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


def modulated_layer_norm(
    x: torch.Tensor,
    shift: torch.Tensor | None,
    scale: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """LayerNorm(x) in float32 [* (1 + scale) + shift] -> out_dtype (what the next Linear casts to)."""
    h = F.layer_norm(
        x.float(),
        x.shape[-1:],
        None if weight is None else weight.float(),
        None if bias is None else bias.float(),
        eps,
    )
    if scale is not None:
        h = h * (1 + scale) + shift
    return h.to(out_dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, rounded to x's dtype, times the weight in x's dtype (the reference's order)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [B, L, n, d] with adjacent (even, odd) pairs as complex numbers, rotated in float32 -> dtype.

    Written with `out=` products so only one float32 copy of x and one result exist at a time
    (eager); the fused kernel never materialises either.
    """
    b, s, n, d = x.shape
    pairs = x.float().view(b, s, n, d // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = cos.view(1, s, 1, d // 2)
    sin = sin.view(1, s, 1, d // 2)
    out = torch.empty_like(pairs)
    torch.mul(real, cos, out=out[..., 0])
    out[..., 0].addcmul_(imag, sin, value=-1.0)
    torch.mul(real, sin, out=out[..., 1])
    out[..., 1].addcmul_(imag, cos)
    del pairs, real, imag
    return out.view(b, s, n, d).to(dtype)


def _rope_functional(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`rope` without `out=` (what gets compiled: the same products and sums, one kernel)."""
    b, s, n, d = x.shape
    pairs = x.float().view(b, s, n, d // 2, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    cos = cos.view(1, s, 1, d // 2)
    sin = sin.view(1, s, 1, d // 2)
    out = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return out.view(b, s, n, d).to(dtype)


def rms_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, num_heads: int
) -> torch.Tensor:
    """The q/k path of self-attention: RMSNorm over the full width, then RoPE per head -> x's dtype."""
    b, s, _ = x.shape
    return rope(rms_norm(x, weight, eps).view(b, s, num_heads, -1), cos, sin, x.dtype)


def _rms_norm_rope_functional(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, num_heads: int
) -> torch.Tensor:
    b, s, _ = x.shape
    return _rope_functional(rms_norm(x, weight, eps).view(b, s, num_heads, -1), cos, sin, x.dtype)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """x + y * gate (float32 residual stream; y in the compute dtype, gate float32)."""
    return x + y * gate if gate is not None else x + y


def camera_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """(1 + scale) * x + shift, with `1 + scale` in scale's dtype first, as the reference computes it."""
    return (1 + scale) * x + shift


E4M3_MAX = 448.0  # largest finite float8_e4m3fn (the FP8 KV cache's range)


def quantize_per_token(x: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (e4m3 data, one scale per row in scale_dtype: absmax / 448): the FP8 KV cache's write.
    Eager, this was six passes over a chunk's keys in float32 (copy, abs, amax, divide, cast); fused, one."""
    scale = (x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / E4M3_MAX).to(scale_dtype)
    return (x.float() / scale.float()).to(torch.float8_e4m3fn), scale


def quantize_per_token_into(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor) -> None:
    """`quantize_per_token` written into the FP8 KV cache's slots (`data`, `scale`: x's shape, one scale a
    row): on CUDA the kernel stores there itself, with no chunk-sized result copied in afterwards."""
    hand_written = _enabled and x.is_cuda and KERNELS == "triton"
    if hand_written and _hand_written("quantize_per_token_into", (x, data, scale), {}):
        return
    q, s = quantize_per_token(x, scale.dtype)
    data.copy_(q)
    scale.copy_(s)


def dequantize_per_token(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The FP8 KV cache's window in `dtype`: data * scale, rounded as the eager cast-then-multiply rounds."""
    return data.to(dtype) * scale.to(dtype)


def requantize_per_tensor(data: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 KV cache's window (per-row scales) -> e4m3 with one scale for all of it (what cuDNN's FP8
    attention takes), straight from the stored bytes: a row's largest magnitude is 448 x its scale, so
    the tensor's scale is the largest row scale, and no bf16 copy of the window is made or read back."""
    descale = scale.float().amax().clamp_min(1e-12)
    q = (data.float() * (scale.float() / descale)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, descale.view(1, 1, 1, 1)


RECOMPILE_LIMIT = 64  # compiled variants kept per function (dynamo's default, 8, is too few here)


def allow_recompiles() -> None:
    """Let each compiled function keep RECOMPILE_LIMIT variants. Each has a few legitimate ones (bias or
    gate present or None, float32 or bf16 inputs, each KV-window length of the FP8 path, the golden tiny
    model's shapes beside the real ones); past dynamo's default of 8 a `fullgraph` function fails and
    the job silently went eager for the rest of the process (seen on the H100: bench_fast --golden
    before the rollouts, docs/benchmarks.md "Session 7: Fast")."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)


# Inductor settings for these functions' kernels, on top of its defaults (a bench may try others:
# bench_fast.py --compile-options; set before the first compile). One Triton config a kernel, chosen
# by Inductor's heuristics, never by timing runs: on the H100 a fresh process's first Fast chunk went
# from 29.1 to 18.3 s (fp8) and 19.9-30.6 to 12.9 s (exact), warm chunks unchanged (docs/benchmarks.md,
# "Session 10"), and the kernels no longer depend on timing noise.
COMPILE_OPTIONS: dict[str, object] = {"triton.autotune_pointwise": False, "deterministic": True}


def compile_options() -> dict[str, object] | None:
    """COMPILE_OPTIONS this PyTorch's Inductor knows (one it lacks would fail every compile: left out)."""
    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    return {k: v for k, v in COMPILE_OPTIONS.items() if k in known} or None


@functools.cache
def _compiled(fn: Callable) -> Callable:
    import torch._inductor.config as inductor_config

    allow_recompiles()

    # keep eager's bf16 roundings inside fused kernels (otherwise inductor skips down/up casts)
    inductor_config.emulate_precision_casts = True
    # dynamic=None: specialised to the first shape, generalised (no more recompiles) when another comes
    return torch.compile(fn, fullgraph=True, options=compile_options())


# "triton" (the default): the hand-written kernel where it takes the call (every call the DiT makes),
# else compiled; "compile": every group compiled by torch.compile. Compiled ahead at load
# (`worldgen.pipelines.fast_warm_up`), the hand-written kernels need no dynamo and no Inductor: on the
# H100 a load took 7.6-8.7 s against 11.6-13.3 s, with the same warm chunks (docs/benchmarks.md,
# "Session 11: Fast").
KERNELS = "triton"
_hand_failed: set[str] = set()


def _hand_written(name: str, args: tuple, kwargs: dict):
    """`worldgen.kernels.fused_triton`'s kernel for `name` on these arguments; None when it has none for
    them (or Triton failed here once: said in a warning, the compiled function from then on)."""
    from worldgen.kernels import fused_triton  # imported late: Triton loads only when a CUDA call comes

    if name in _hand_failed or not fused_triton.available():
        return None
    try:
        return getattr(fused_triton, name)(*args, **kwargs)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (a Triton that cannot build it: the compiled function, said once)
        _hand_failed.add(name)
        warnings.warn(f"the Triton kernel {name} failed ({exc}); using the compiled function", stacklevel=3)
        return None


def _dispatch(fn: Callable, traced: Callable | None = None, varying: tuple[int, ...] = ()) -> Callable:
    """`fn` eager; on CUDA when enabled, `traced` (default `fn`: the same code) compiled. `varying`: the
    tensor arguments whose dim 1 changes between calls (a KV window's length, queries against text
    keys): compiled for any size from the first call, not once for the first size and again for all."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        first = args[0]
        if not (_enabled and first.is_cuda):
            return fn(*args, **kwargs)
        if KERNELS == "triton":
            out = _hand_written(fn.__name__, args, kwargs)
            if out is not None:
                return out
        if fn.__name__ in _failed:
            return fn(*args, **kwargs)
        for index in varying:
            torch._dynamo.maybe_mark_dynamic(args[index], 1)
        try:
            return _compiled(traced or fn)(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (no compiler / Triton: run eager, say so once)
            _failed.add(fn.__name__)
            warnings.warn(f"fused kernel {fn.__name__} failed to compile ({exc}); using eager PyTorch", stacklevel=2)
            return fn(*args, **kwargs)

    run.eager = fn
    return run


modulated_layer_norm = _dispatch(modulated_layer_norm)
rms_norm_rope = _dispatch(rms_norm_rope, _rms_norm_rope_functional)
rms_norm_fused = _dispatch(rms_norm, varying=(0,))
gated_residual = _dispatch(gated_residual)
camera_modulate = _dispatch(camera_modulate)
quantize_per_token = _dispatch(quantize_per_token)
dequantize_per_token = _dispatch(dequantize_per_token, varying=(0, 1))
requantize_per_tensor = _dispatch(requantize_per_tensor, varying=(0, 1))


def residual_norm(
    x: torch.Tensor,
    y: torch.Tensor | None,
    gate: torch.Tensor | None,
    cam: tuple[torch.Tensor, torch.Tensor] | None,
    shift: torch.Tensor | None,
    scale: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
    quantize: str = "",
) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """x [+ y * gate] [then the camera's (1 + scale) x + shift, `cam` = (scale, shift)] -> (that x, its
    `modulated_layer_norm`). Between two sublayers of a block the residual stream is updated and the
    next one's input made from it: on CUDA one hand-written kernel reads x once (it was two to four
    kernels, each reading and writing the float32 stream), and with `quantize` (bf16 only) it also
    gives the input as 8-bit rows with one float32 scale each instead of bf16: "fp8", e4m3 by
    `fp8.quantize_rows`' rule; "int8", int8 by `int8.quantize_rows`' (bit for bit: the same bf16 rows,
    quantized in the same kernel instead of in a pass of their own). Elsewhere (or where that kernel does not take the call) the steps one by one, never
    quantized: the caller quantizes what comes back as a tensor."""
    if _enabled and x.is_cuda and KERNELS == "triton":
        args = (x, y, gate, cam, shift, scale, weight, bias, eps, out_dtype, quantize)
        done = _hand_written("residual_norm", args, {})
        if done is not None:
            return done
    if y is not None:
        x = gated_residual(x, y, gate)
    if cam is not None:
        x = camera_modulate(x, *cam)
    return x, modulated_layer_norm(x, shift, scale, weight, bias, eps, out_dtype)
