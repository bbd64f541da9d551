"""The INT8 path's parts against the FP8 path's and bf16, at the LingBot-World 2.0 DiT's chunk shapes (issue 56).

One command, one table. For each model (1.3B: 6,032 tokens a chunk, dim 1,536, feed-forward 8,960, 12 heads of 128,
27,144 keys = the reference's 18-frame window; 14B: 6,240 tokens, dim 5,120, feed-forward 13,824, 40 heads of 128,
28,080 keys = the same window at its 1,560 tokens a frame) it times, per Linear shape (dim -> dim: q, k, v, o, the
cross-attention's q and o; dim -> ffn; ffn -> dim):
  bf16              F.linear
  fp8               fp8.quantize_rows (Triton) + torch._scaled_mm, the weight quantized ahead (the fp8 path)
  int8 unfused      the int8 path as it was: PyTorch's quantization, torch._int_mm, PyTorch's epilogue
  int8 int_mm       int8_triton.quantize_rows + torch._int_mm + int8_triton.dequantize (int8.GEMM = "int_mm")
  int8 triton       int8_triton.quantize_rows + int8_triton.gemm, the epilogue fused (int8.GEMM = "triton")
  int8 parts        the quantization alone (Triton / PyTorch), _int_mm alone, the epilogue alone (Triton / PyTorch)
and the self-attention of one block over the window: SDPA bf16, FlashAttention where installed, cuDNN's FP8 attention
(the fp8 path's, with its quantizations) where it runs, the int8 path's INT8 kernels (`int8_attention_triton`), and the
sageattention package's where installed.
Each row: milliseconds a call (median of CUDA-event timings), TFLOP/s (TOPS), and rel-L2 against float32 math on the
same inputs; the last column, per model, the DiT's GEMM time a forward (30 / 40 blocks) for each GEMM path.

  python3 bench/bench_int8.py [--models 1.3b,14b] [--repeats 20] [--json OUT]
  LINGBOT_ISAAC_TRITON_TARGET=sm80 python3 bench/bench_int8.py   # our Triton kernels on their sm_80 code path
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worldgen.kernels import fp8, int8, int8_triton, triton_lang  # noqa: E402

MODELS = {  # tokens a chunk, dim, feed-forward, heads, keys (the 18-frame window), blocks
    "1.3b": (6032, 1536, 8960, 12, 27144, 30),
    "14b": (6240, 5120, 13824, 40, 28080, 40),
}
LINEARS_PER_BLOCK = {"dim->dim": 6, "dim->ffn": 1, "ffn->dim": 1}  # with a KV cache: cross k/v once, not a chunk


def time_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float().flatten(), want.float().flatten()
    return ((got - want).norm() / want.norm()).item()


def unfused_int8(x, wq, ws, bias):
    xq, xs = int8.quantize_rows(x)
    out = int8.int_matmul(xq, wq).float() * xs * ws.view(1, -1)
    return (out + bias.float()).to(torch.bfloat16)


def int8_int_mm(x, w8, bias):
    xq, xs = int8_triton.quantize_rows(x)
    return int8_triton.dequantize(torch._int_mm(xq, w8.data.t()), xs, w8.scale, bias, torch.bfloat16)


def int8_triton_gemm(x, w8, bias, cap):
    xq, xs = int8_triton.quantize_rows(x)
    return int8_triton.gemm(xq, w8.data, xs, w8.scale, bias, torch.bfloat16, cap)


def gemm_rows(tokens: int, k: int, n: int, repeats: int) -> list[dict]:
    g = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(tokens, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    bias = (torch.randn(n, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    want = F.linear(x.float(), w.float(), bias.float())
    flops = 2 * tokens * k * n
    w8 = int8.Int8Weight(*int8.quantize_rows(w))
    f8 = fp8.quantize_rows(w)
    xq, xs = int8_triton.quantize_rows(x)
    acc = torch._int_mm(xq, w8.data.t())
    cap = triton_lang.capability(x.device)
    runs = {
        "bf16": lambda: F.linear(x, w, bias),
        "fp8": lambda: fp8.fp8_linear(x, f8, bias),
        "int8 unfused": lambda: unfused_int8(x, w8.data, w8.scale, bias),
        "int8 int_mm": lambda: int8_int_mm(x, w8, bias),
        "int8 triton": lambda: int8_triton_gemm(x, w8, bias, cap),
        "  quantize triton": lambda: int8_triton.quantize_rows(x),
        "  quantize pytorch": lambda: int8.quantize_rows(x),
        "  _int_mm": lambda: torch._int_mm(xq, w8.data.t()),
        "  epilogue triton": lambda: int8_triton.dequantize(acc, xs, w8.scale, bias, torch.bfloat16),
        "  epilogue pytorch": lambda: ((acc.float() * xs * w8.scale.view(1, -1)) + bias.float()).to(torch.bfloat16),
        "  gemm triton alone": lambda: int8_triton.gemm(xq, w8.data, xs, w8.scale, bias, torch.bfloat16, cap),
    }
    rows = []
    for name, fn in runs.items():
        try:
            ms = time_ms(fn, repeats)
            out = fn()
            out = out[0] if isinstance(out, tuple) else out
            full = not name.startswith("  ") or name.startswith("  gemm")
            rows.append({"path": name, "ms": ms, "tflops": flops / ms / 1e9 if full else None,
                         "rel_l2": rel_l2(out, want) if full else None})  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (a path this machine cannot run: said in its row)
            rows.append({"path": name, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
    return rows


def attention_rows(tokens: int, heads: int, keys: int, repeats: int) -> list[dict]:
    from worldgen.kernels import attention

    g = torch.Generator("cuda").manual_seed(1)
    q, k, v = (
        torch.randn(1, n, heads, 128, device="cuda", generator=g).to(torch.bfloat16) for n in (tokens, keys, keys)
    )
    k = k + 0.5  # a common offset, as real keys have (what SageAttention's smoothing removes)
    want = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v))).transpose(1, 2).flatten(2)
    flops = 4 * tokens * keys * heads * 128
    runs = {"sdpa bf16": lambda: attention.attention(q, k, v, "sdpa")}
    if attention.installed("flash") and attention.import_error("flash") is None:
        runs["flash bf16"] = lambda: attention.attention(q, k, v, "flash")
    if attention.fp8_attention_runs(q):
        runs["cudnn fp8 (the fp8 path)"] = lambda: attention.fp8_attention(q, k, v).dequantize().flatten(2)
    runs["int8 (the int8 path: int8_attention_triton)"] = lambda: int8.int8_attention(q, k, v)
    if attention.installed("sage"):
        from sageattention import sageattn

        runs["sageattention 1.0.6 package"] = lambda: sageattn(q, k, v, tensor_layout="NHD").flatten(2)
    rows = []
    for name, fn in runs.items():
        try:
            ms = time_ms(fn, repeats)
            rows.append({"path": name, "ms": ms, "tflops": flops / ms / 1e9, "rel_l2": rel_l2(fn(), want)})
        except Exception as exc:  # noqa: BLE001
            rows.append({"path": name, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="1.3b,14b")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_int8 needs a CUDA GPU")
    forced = triton_lang.FORCED_TARGET
    print(f"{torch.cuda.get_device_name()} (capability {torch.cuda.get_device_capability()}), torch {torch.__version__}, "
          f"triton {triton_lang.triton.__version__}; our Triton kernels built for "
          f"{f'sm_{forced} (forced)' if forced else 'this card'}")  # fmt: skip
    report = {}
    for model in args.models.split(","):
        tokens, dim, ffn, heads, keys, blocks = MODELS[model]
        shapes = {"dim->dim": (dim, dim), "dim->ffn": (dim, ffn), "ffn->dim": (ffn, dim)}
        per_forward: dict[str, float] = {}
        for shape, (k, n) in shapes.items():
            print(f"\n{model} GEMM {shape}: [{tokens} x {k}] @ [{k} x {n}]  (x{LINEARS_PER_BLOCK[shape]} a block)")
            print(f"  {'path':28s} {'ms':>8s} {'TFLOP/s':>8s} {'rel-L2':>9s}")
            rows = gemm_rows(tokens, k, n, args.repeats)
            report[f"{model} {shape}"] = rows
            for r in rows:
                if "error" in r:
                    print(f"  {r['path']:28s} {r['error']}")
                    continue
                tf = f"{r['tflops']:8.0f}" if r["tflops"] else " " * 8
                rl = f"{r['rel_l2']:9.2e}" if r["rel_l2"] is not None else ""
                print(f"  {r['path']:28s} {r['ms']:8.3f} {tf} {rl}")
                if not r["path"].startswith("  "):
                    per_forward[r["path"]] = per_forward.get(r["path"], 0.0) + r["ms"] * LINEARS_PER_BLOCK[shape]
        print(f"\n{model} self-attention: {tokens} queries over {keys} keys, {heads} heads of 128")
        rows = attention_rows(tokens, heads, keys, args.repeats)
        report[f"{model} attention"] = rows
        for r in rows:
            if "error" in r:
                print(f"  {r['path']:28s} {r['error']}")
            else:
                print(f"  {r['path']:28s} {r['ms']:8.3f} {r['tflops']:8.0f} {r['rel_l2']:9.2e}")
        print(f"\n{model}: a forward's block GEMMs ({blocks} blocks) per path, ms")
        for path, ms in per_forward.items():
            print(f"  {path:28s} {ms * blocks:8.1f}")
        report[f"{model} gemms a forward (ms)"] = {p: ms * blocks for p, ms in per_forward.items()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        raise
