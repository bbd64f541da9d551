"""Self-attention kernels at the DiT's full size, side by side: time, TFLOP/s and distance.

One block's self-attention at the default frame is 40 heads of 128 over 32,760 tokens (22 TFLOP), and
40 of them are ~half of a forward. This script times every kernel this machine has for it, each
on the layout the DiT hands over ([B, L, heads, dim] views, no copies), and gives each output's
rel-L2 against PyTorch's SDPA in float32 on the same bf16 inputs:

  sdpa            F.scaled_dot_product_attention, PyTorch's own choice (what `--attention sdpa` runs)
  sdpa-<kernel>   the same, pinned to one of PyTorch's kernels (flash, cudnn, efficient)
  cudnn-bf16      cuDNN's fused attention through the cuDNN frontend package, each engine plan
  cudnn-fp8       cuDNN's FP8 attention (Q, K, V, P and O in e4m3, per-tensor scales), the kernel
                  `--compute fp8` uses (worldgen/kernels/cudnn_attention.py); timed with its
                  quantizations, alone, and each engine plan alone (with whether it gives plan 0's bits)
  fa4             FlashAttention 4 (the CuTe-DSL package, flash-attn-4), bf16

Kernels whose package is not installed are listed as such. Usage:
  python bench/bench_attention.py [--tokens N] [--repeats 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing import seconds_per_call  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH  # noqa: E402
from contracts.settings import FIELD_BY_NAME  # noqa: E402
from worldgen.models.dit_config import DiTConfig  # noqa: E402

# the DiT's tokens at the default frame: latent frames x (H/8/2) x (W/8/2) (VAE stride 8, 2x2 patches)
DEFAULT_TOKENS = ((FIELD_BY_NAME["frame_num"].default - 1) // 4 + 1) * (MODEL_HEIGHT // 16) * (MODEL_WIDTH // 16)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help=f"sequence length (default: {DEFAULT_TOKENS}, the default frame)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        help="keys and values per query row (default: --tokens; the Fast model's KV window: ~15,000)",
    )
    full = DiTConfig()  # the A14B expert's attention shape
    parser.add_argument("--heads", type=int, default=full.num_heads, help=f"heads (default: {full.num_heads})")
    parser.add_argument("--head-dim", type=int, default=full.head_dim, help=f"head size (default: {full.head_dim})")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per kernel (default: 10)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    dev = torch.device("cuda")
    torch.manual_seed(0)
    L, n, d = args.tokens, args.heads, args.head_dim
    S = args.keys or L
    flop = 4 * L * S * n * d
    # the DiT's layout: one [B, L, n*d] projection viewed as [B, L, n, d]; q and k are RMS-normed
    q = torch.randn(1, L, n, d, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(1, S, n, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"{L} queries x {S} keys x {n} heads x {d}: {flop / 1e12:.1f} TFLOP per call", flush=True)  # fmt: skip

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    with torch.no_grad():
        reference = F.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2)
        ).transpose(1, 2)
    results: dict[str, dict] = {}

    def record(name: str, fn, tflop: bool = True) -> None:
        try:
            with torch.no_grad():
                out = fn()
                t = seconds_per_call(fn, args.repeats)
            if not tflop:  # a step on the way (q's round trip through e4m3 against q)
                results[name] = {"ms": t * 1e3, "tflops": 0.0, "rel_l2": rel(out.float(), q.float())}
            else:
                results[name] = {"ms": t * 1e3, "tflops": flop / t / 1e12, "rel_l2": rel(out.float(), reference)}
            r = results[name]
            print(f"{name:<28} {r['ms']:7.2f} ms  {r['tflops']:6.0f} TFLOP/s  x40 = {40 * t:5.2f} s  "
                  f"rel-L2 {r['rel_l2']:.2e}", flush=True)  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (one kernel's failure is a figure too)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"{name:<28} failed: {results[name]['error']}", flush=True)
            traceback.print_exc(limit=2)

    record("sdpa", lambda: sdpa(q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip

        def pinned(backend=backend):
            with sdpa_kernel([backend]):
                return sdpa(q, k, v)

        record(f"sdpa-{name}", pinned)

    try:
        import cudnn

        print(f"cuDNN frontend {cudnn.__version__}, backend {cudnn.backend_version()}", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"cuDNN frontend not installed ({type(exc).__name__}: {exc})")
    else:
        from worldgen.kernels import cudnn_attention
        from worldgen.kernels.fp8 import QuantizedTensor, quantize_tensor

        try:
            for plan in cudnn_attention.plans(q, k, v):
                record(f"cudnn-bf16 {plan.name}", lambda plan=plan: plan(q, k, v))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        record("cudnn-bf16 (chosen plan)", lambda: cudnn_attention.bf16_attention(q, k, v))

        def fp8_whole():
            o = cudnn_attention.fp8_attention_quantized(quantize_tensor(q), quantize_tensor(k), quantize_tensor(v))
            return o.dequantize()

        record("cudnn-fp8 (with quantization)", fp8_whole)
        q8, k8, v8 = (quantize_tensor(t) for t in (q, k, v))
        record("cudnn-fp8 (kernel alone)", lambda: cudnn_attention.fp8_attention_quantized(q8, k8, v8).dequantize())
        # every engine plan of the FP8 graph (the rollouts run the first that runs): its time, and whether it
        # gives the first plan's bits (plans that sum in another order round differently)
        first = None
        for plan in cudnn_attention.plans(q8, k8, v8, kind="fp8"):
            record(f"cudnn-fp8 {plan.name}", lambda plan=plan: plan(q8, k8, v8).dequantize())
            try:
                with torch.no_grad():
                    out = plan(q8, k8, v8).data
            except Exception:  # noqa: BLE001  (its failure is recorded above)
                continue
            first = out if first is None else first
            print(f"  {plan.name}: the same bits as the first plan that ran: {torch.equal(out, first)}", flush=True)

        # the same FP8 kernel on other memory layouts of its inputs (views of the same [B, L, n, d] shape:
        # cuDNN reads the strides): heads-first, and heads-first with V stored key-major (its rows
        # contiguous along the sequence, the operand order FP8 tensor cores take for P @ V)
        def heads_first(t):
            return QuantizedTensor(t.data.transpose(1, 2).contiguous().transpose(1, 2), t.descale)

        def key_major(t):
            return QuantizedTensor(t.data.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2), t.descale)

        layouts = {
            "heads-first q, k, v": (heads_first(q8), heads_first(k8), heads_first(v8)),
            "heads-first q, k; key-major v": (heads_first(q8), heads_first(k8), key_major(v8)),
            "[B, L, n, d] q, k; key-major v": (q8, k8, key_major(v8)),
        }
        for name, (ql, kl, vl) in layouts.items():
            record(
                f"cudnn-fp8 {name}",
                lambda ql=ql, kl=kl, vl=vl: cudnn_attention.fp8_attention_quantized(ql, kl, vl).dequantize(),
            )
        record("quantize q, k, v (per tensor)", lambda: quantize_tensor(q).dequantize(), tflop=False)
        from worldgen.kernels.attention import fp8_attention

        def fp8_rows():
            return fp8_attention(q, k, v).dequantize()

        record("attention.fp8_attention", fp8_rows)
        for line in cudnn_attention.describe():
            print(f"  {line}")

    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # noqa: BLE001
        print(f"flash-attn-4 not installed ({type(exc).__name__}: {str(exc)[:200]})")
    else:

        def fa4():
            out = flash_attn_func(q, k, v)
            return out[0] if isinstance(out, tuple) else out

        record("fa4", fa4)

    if args.json:
        atomic.write_json(args.json, {"tokens": L, "heads": n, "head_dim": d, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
