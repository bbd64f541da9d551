"""One run, every speed figure of the DiT: bf16, NF4 exact and FP8 forwards, a rollout's per-step
time on one GPU (and on two when the machine has them), a profile of where a forward's time goes.

Builds the real-size expert (dim 5120, 40 layers, camera layers; 18.5 B parameters) on the GPU with
random weights, at 480x832x81 (32,760 tokens) unless told otherwise, and times in this order:
  bf16 (before)  bf16 weights, eager elementwise ops, PyTorch's default SDPA kernel: the old path
  bf16           bf16 weights, the exact path as it is now (fused elementwise kernels, SDPA choice)
  bf16 + fp8     bf16 weights, `--compute fp8` (FP8 GEMMs)
  NF4 (before)   NF4 weights (dequantize + bf16 GEMM), the old path
  NF4 exact      NF4 weights, the exact path as it is now: what `--compute bf16` runs
  NF4 + fp8 GEMMs  NF4 weights, `--compute fp8` with attention kept bf16 (the FP8 GEMMs alone)
  NF4 + fp8      NF4 weights, `--compute fp8` (FP8 attention too where cuDNN's kernel runs)
  ..., camera cached  NF4 exact and NF4 + fp8 with the camera modulation read back (worldgen.models.camera_cache):
                 a rollout's forwards after its first, where the plan has room for the cache
Every line has its ratio to "bf16 (before)" of the same run, and the output's rel-L2 against the
matching exact path. The rollout line runs `Pipeline.denoise` with the NF4 expert (both experts are
the same shape, so one serves as both) at the reference's 70 steps with guidance and times a few
steps after the first: a step's time does not depend on the number of steps (each step is two
forwards plus one scheduler update), so 70 x that is the rollout's denoise time.

Usage: python bench/bench_speed.py [--repeats 2] [--rollout-steps 3] [--json OUT] [--experiments]
Needs ~50 GiB of GPU memory (bf16 weights, then NF4 weights, activations).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_dit import random_model, to_nf4  # noqa: E402
from bench.timing import seconds_per_call  # noqa: E402
from contracts import atomic  # noqa: E402
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH  # noqa: E402
from contracts.settings import FIELD_BY_NAME  # noqa: E402
from worldgen.kernels import attention, fused  # noqa: E402
from worldgen.kernels.attention import BACKENDS, resolve_backend  # noqa: E402
from worldgen.models.camera_cache import CameraCache  # noqa: E402
from worldgen.models.dit_config import DiTConfig  # noqa: E402

GiB = 2**30


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a-b| / |b| in float64: the random model's residual stream grows so large with depth that a
    float32 norm overflows (seen: inf after ~25 blocks)."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def timed(model, inputs, repeats: int) -> tuple[float, torch.Tensor]:
    """-> (median seconds per forward after one warm-up (compiles, autotunes), the output)."""
    with torch.no_grad():
        out = model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = model(*inputs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2], out[0].float()


def kernel_category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "cudnn", "sdpa")):
        return "attention"
    if "dequant" in n:
        return "NF4 dequantize"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "s16816", "matmul")):
        return "GEMM"
    if n.startswith("triton"):
        return "fused elementwise (Triton)"
    if "memcpy" in n or "memset" in n:
        return "copies"
    return "elementwise (eager)"


def profile(model, inputs, top: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    try:
        with torch.no_grad(), torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(*inputs)
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001  (the timings above still count)
        print(f"profile failed: {type(exc).__name__}: {str(exc)[:300]}")
        return {"gpu_seconds": 0.0, "categories": {}, "top": []}
    kernels: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.name] += evt.time_range.elapsed_us() / 1e6
    categories: dict[str, float] = defaultdict(float)
    for name, seconds in kernels.items():
        categories[kernel_category(name)] += seconds
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
    return {
        "gpu_seconds": sum(kernels.values()),
        "categories": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
        "top": [(name[:110], seconds) for name, seconds in ranked],
    }


def print_profile(title: str, prof: dict) -> None:
    total = prof["gpu_seconds"]
    print(f"\n-- profile: {title} (kernel time {total:.2f} s) --")
    for cat, seconds in prof["categories"].items():
        print(f"  {cat:<28} {seconds:6.2f} s  {100 * seconds / max(total, 1e-9):5.1f}%")
    print("  top kernels:")
    for name, seconds in prof["top"]:
        print(f"    {seconds:6.3f} s  {name}")


def micro_benchmarks(dev: torch.device, tokens: int, cfg: DiTConfig) -> None:
    """TFLOP/s of one block's GEMM shapes (bf16, FP8) and of full-size self-attention per SDPA kernel."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from worldgen.kernels.fp8 import fp8_linear, quantize_rows

    x = torch.randn(tokens, cfg.dim, device=dev, dtype=torch.bfloat16)
    for n, k in ((cfg.dim, cfg.dim), (cfg.ffn_dim, cfg.dim), (cfg.dim, cfg.ffn_dim)):
        a = x if k == cfg.dim else torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        flop = 2 * tokens * n * k
        t_bf16 = seconds_per_call(lambda a=a, w=w: F.linear(a, w))
        t_fp8 = seconds_per_call(lambda a=a, w=w: fp8_linear(a, w, None))
        aq, sa = quantize_rows(a)
        wq, sw = quantize_rows(w)
        t_mm = seconds_per_call(lambda aq=aq, wq=wq, sa=sa, sw=sw: torch._scaled_mm(
            aq, wq.t(), scale_a=sa, scale_b=sw.view(1, -1), out_dtype=torch.bfloat16, use_fast_accum=True))  # fmt: skip
        print(f"micro: GEMM {tokens}x{k} @ {k}x{n}: bf16 {flop / t_bf16 / 1e12:.0f} TFLOP/s, fp8 GEMM alone "
              f"{flop / t_mm / 1e12:.0f}, fp8 with both quantizations {flop / t_fp8 / 1e12:.0f}", flush=True)  # fmt: skip
    q = torch.randn(1, cfg.num_heads, tokens, cfg.head_dim, device=dev, dtype=torch.bfloat16)
    flop = 4 * tokens * tokens * cfg.dim
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip
        try:
            with sdpa_kernel([backend]):
                t = seconds_per_call(lambda q=q: F.scaled_dot_product_attention(q, q, q), 3)
            print(f"micro: self-attention {tokens} tokens, SDPA {name}: {t * 1e3:.1f} ms, {flop / t / 1e12:.0f} TFLOP/s "
                  f"(x40 blocks: {40 * t:.2f} s)", flush=True)  # fmt: skip
        except RuntimeError as exc:
            print(f"micro: SDPA {name} unavailable: {str(exc)[:160]}")
    del x, q
    torch.cuda.empty_cache()


def trace_blocks(model, inputs, blocks: list[int]) -> dict[int, torch.Tensor]:
    """The residual stream after the given blocks (float32) of one forward."""
    saved: dict[int, torch.Tensor] = {}
    hooks = [
        model.blocks[i].register_forward_hook(lambda _m, _a, out, i=i: saved.__setitem__(i, out.detach().clone()))
        for i in blocks
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return saved


def distance_by_depth(model, inputs, blocks: list[int], setups: dict[str, tuple[bool, str]]) -> dict[str, list[float]]:
    """rel-L2 of the residual stream after each of `blocks`, of each setup against the first one."""
    traces = {}
    for name, (fast, compute) in setups.items():
        fused.enable(fast)
        model.set_compute(compute)
        attention.FP8_ATTENTION = "GEMMs" not in name
        traces[name] = trace_blocks(model, inputs, blocks)
    attention.FP8_ATTENTION = True
    first, *others = traces
    out = {name: [rel(traces[name][i], traces[first][i]) for i in blocks] for name in others}
    del traces
    torch.cuda.empty_cache()
    return out


class _Stop(Exception):
    pass


def rollout_step_seconds(
    model,
    dev,
    steps_timed: int,
    lat: tuple[int, int, int],
    text_tokens: int,
    compute: str = "bf16",
    second_model=None,
    camera_cache: bool = False,
) -> float:
    """Seconds per denoising step of a 70-step guided rollout (Pipeline.denoise, steps 2..).

    `second_model` (a copy of `model` on another GPU): the unconditional passes run there
    (`worldgen.pipelines.multi_gpu`, what `--gpus 0,1` does)."""
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.base import Pipeline
    from worldgen.runtime.residency import ModelSlot

    cfg = model.cfg
    pipe = Pipeline(
        tokenizer=None,
        text_encoder=ModelSlot("t5", lambda: None),
        vae=ModelSlot("vae", lambda: None),
        experts={"high": ModelSlot("high", lambda: model), "low": ModelSlot("low", lambda: model)},
        device=dev,
        text_len=cfg.text_len,
        name="bench",
    )
    pipe.plan.camera_cache = camera_cache
    if second_model is not None:
        from worldgen.pipelines.multi_gpu import SecondDevice
        from worldgen.runtime.memory import MemoryPlan
        from worldgen.runtime.residency import ResidencyPolicy

        other = next(second_model.parameters()).device
        copies = {"high": ModelSlot("high", lambda: second_model), "low": ModelSlot("low", lambda: second_model)}
        pipe.second_device = SecondDevice(other, ResidencyPolicy(MemoryPlan.unlimited(other), experts=copies))
    gen = torch.Generator(dev).manual_seed(3)
    f, h, w = lat
    noise = torch.randn(16, f, h, w, device=dev, generator=gen)
    y = torch.randn(20, f, h, w, device=dev, generator=gen)
    ctx = torch.randn(text_tokens, cfg.text_dim, device=dev, generator=gen)
    neg = torch.randn(text_tokens // 2, cfg.text_dim, device=dev, generator=gen)
    cam = torch.randn(1, 384, f, h, w, device=dev, generator=gen)
    settings = GenerationSettings(compute=compute)  # the reference's defaults (70 steps, shift 10)
    stamps: list[float] = []

    def progress(phase: str, step: int, total: int) -> None:
        torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        if step >= steps_timed + 1:
            raise _Stop

    with contextlib.suppress(_Stop):
        pipe.denoise(noise, y, ctx, neg, cam, settings, progress)
    # stamps[0] before step 0, stamps[1] after step 0 (warm-up); time steps 1..steps_timed
    return (stamps[-1] - stamps[1]) / (len(stamps) - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=FIELD_BY_NAME["frame_num"].default)
    parser.add_argument("--height", type=int, default=MODEL_HEIGHT)
    parser.add_argument("--width", type=int, default=MODEL_WIDTH)
    parser.add_argument("--repeats", type=int, default=2, help="timed forwards per variant (median)")
    parser.add_argument("--rollout-steps", type=int, default=3, help="denoising steps timed after the first")
    parser.add_argument("--text-tokens", type=int, default=120, help="prompt length before padding to 512")
    parser.add_argument("--profile-top", type=int, default=16, help="kernels listed per profile (default: 16)")
    parser.add_argument(
        "--experiments",
        action="store_true",
        help="also: FP8 with slow accumulation, GEMM and attention-kernel micro-benchmarks",
    )
    parser.add_argument(
        "--attention",
        choices=BACKENDS,
        default="auto",
        help="attention kernel of every row but the '(before)' ones (default: auto, as generate)",
    )
    parser.add_argument(
        "--rollout-only",
        action="store_true",
        help="only the NF4 exact rollout step, on one GPU and (where there are two) on two: the guidance split's figure",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    backend = resolve_backend(args.attention)

    dev = torch.device("cuda")
    cfg = DiTConfig()
    lat = ((args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    tokens = lat[0] * lat[1] * lat[2] // 4
    gen = torch.Generator(dev).manual_seed(1)
    x = torch.randn(1, 16, *lat, device=dev, generator=gen)
    y = torch.randn(1, 20, *lat, device=dev, generator=gen)
    ctx = [torch.randn(args.text_tokens, cfg.text_dim, device=dev, generator=gen)]
    cam = torch.randn(1, 384, *lat, device=dev, generator=gen)
    inputs = (x, torch.tensor([900.0], device=dev), ctx, y, cam)
    head = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.height}x{args.width}x{args.frames} "
        f"-> {tokens} tokens"
    )
    from worldgen.kernels.cudnn_attention import attention_note

    head += f"; attention {backend}"
    print(head, flush=True)
    print(attention_note(dev), flush=True)
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": tokens,
                     "attention": backend, "fp8_attention": attention_note(dev)}  # fmt: skip
    rows: list[tuple[str, float, float | None, str]] = []

    def run(label: str, model, *, fast: bool, compute: str, reference: torch.Tensor | None = None, against=""):
        fused.enable(fast)
        model.set_compute(compute)
        # the "(before)" rows keep the old path's kernel; the others run --attention's
        model.set_attention_backend("sdpa" if "before" in label else backend)
        try:
            seconds, out = timed(model, inputs, args.repeats)
        except Exception as exc:  # noqa: BLE001  (one broken variant must not hide the others' figures)
            print(f"{label:<26} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            return reference
        distance = None if reference is None else rel(out, reference)
        rows.append((label, seconds, distance, against))
        extra = "" if distance is None else f", rel-L2 {distance:.2e} vs {against}"
        print(f"{label:<26} {seconds:6.2f} s / forward{extra}", flush=True)
        return out

    model = random_model(cfg, dev)
    if args.rollout_only:
        return rollout_only(model, dev, args, lat, head, results)
    bf16_ref = run("bf16 (before)", model, fast=False, compute="bf16")
    bf16_fast = run("bf16", model, fast=True, compute="bf16", reference=bf16_ref, against="bf16 (before)")
    run("bf16 + fp8", model, fast=True, compute="fp8", reference=bf16_fast, against="bf16")
    to_nf4(model)
    nf4_ref = run("NF4 (before)", model, fast=False, compute="bf16")
    profiles = {"NF4 (before)": profile(model, inputs, args.profile_top)}
    nf4_fast = run("NF4 exact", model, fast=True, compute="bf16", reference=nf4_ref, against="NF4 (before)")
    profiles["NF4 exact"] = profile(model, inputs, args.profile_top)
    attention.FP8_ATTENTION = False
    run("NF4 + fp8 GEMMs", model, fast=True, compute="fp8", reference=nf4_fast, against="NF4 exact")
    profiles["NF4 + fp8 GEMMs (attention bf16)"] = profile(model, inputs, args.profile_top)
    attention.FP8_ATTENTION = True
    run("NF4 + fp8", model, fast=True, compute="fp8", reference=nf4_fast, against="NF4 exact")
    profiles["NF4 + fp8"] = profile(model, inputs, args.profile_top)
    # a rollout's forwards after the first of each expert: the camera's modulation read back, not
    # recomputed (worldgen.models.camera_cache; the plan turns it on where ~25 GiB are free, as here)
    model.camera_cache = CameraCache()
    run("NF4 exact, camera cached", model, fast=True, compute="bf16", reference=nf4_fast, against="NF4 exact")
    run("NF4 + fp8, camera cached", model, fast=True, compute="fp8", reference=nf4_fast, against="NF4 exact")
    profiles["NF4 + fp8, camera cached"] = profile(model, inputs, args.profile_top)
    model.camera_cache = None
    depth = sorted({i for i in (0, 1, 4, 9, 19, 29) if i < len(model.blocks)} | {len(model.blocks) - 1})
    try:
        by_depth = distance_by_depth(
            model, inputs, depth, {"NF4 exact": (True, "bf16"), "NF4 + fp8": (True, "fp8"),
                                   "NF4 + fp8 GEMMs": (True, "fp8"), "NF4 (before)": (False, "bf16")})  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        print(f"distance by depth failed: {type(exc).__name__}: {str(exc)[:300]}")
        by_depth = {}
    results["distance_by_depth"] = {"blocks": [i + 1 for i in depth], **by_depth}

    if args.experiments:
        from worldgen.kernels import fp8

        fp8.FAST_ACCUM = False
        run("NF4 + fp8 (slow accumulation)", model, fast=True, compute="fp8", reference=nf4_fast, against="NF4 exact")
        fp8.FAST_ACCUM = True
        fp8.KERNEL = "compile"
        run("NF4 + fp8 (compiled quantization)", model, fast=True, compute="fp8", reference=nf4_fast,
            against="NF4 exact")  # fmt: skip
        fp8.KERNEL = "triton"
        micro_benchmarks(dev, tokens, cfg)
    fused.enable(True)
    model.set_compute("bf16")
    steps: dict[str, float] = {}
    for compute, cached in (("bf16", False), ("fp8", False), ("bf16", True), ("fp8", True)):
        label = compute + (", camera cached" if cached else "")
        try:
            steps[label] = rollout_step_seconds(
                model, dev, args.rollout_steps, lat, args.text_tokens, compute, camera_cache=cached
            )
        except Exception as exc:  # noqa: BLE001
            print(f"rollout ({label}) failed: {type(exc).__name__}: {str(exc)[:300]}")
            steps[label] = float("nan")
    two_gpu = None
    if torch.cuda.device_count() >= 2:
        import copy

        try:
            second = copy.deepcopy(model).to("cuda:1")
            two_gpu = rollout_step_seconds(model, dev, args.rollout_steps, lat, args.text_tokens, "bf16", second)
            del second
        except Exception as exc:  # noqa: BLE001
            print(f"rollout on 2 GPUs failed: {type(exc).__name__}: {str(exc)[:300]}")
    results["rollout_two_gpu_step_seconds"] = two_gpu
    base = rows[0][1]
    print(f"\n== speed, {head} ==")
    print(f"{'path':<26} {'s/forward':>9} {'x bf16(before)':>14}  rel-L2")
    for label, seconds, distance, against in rows:
        d = "" if distance is None else f"{distance:.2e} vs {against}"
        print(f"{label:<26} {seconds:9.2f} {seconds / base:14.2f}  {d}")
    for compute, step in steps.items():
        label = compute.replace("bf16", "NF4 exact").replace("fp8", "NF4 + fp8")
        print(
            f"rollout, 70 steps with guidance, {label}, 1 GPU: {step:.2f} s / step ({step / base:.2f}x a bf16 "
            f"(before) forward; {args.rollout_steps} step(s) timed after the first) -> {70 * step / 60:.1f} min "
            "of denoising"
        )
    if two_gpu is None:
        print("rollout on 2 GPUs: not measured (this machine has one GPU)")
    else:
        print(
            f"rollout, 70 steps with guidance, NF4 exact, 2 GPUs: {two_gpu:.2f} s / step ({two_gpu / base:.2f}x a bf16 "
            f"(before) forward; {two_gpu / steps['bf16']:.2f}x the one-GPU step; target <= 0.55x)"
        )
    if by_depth:
        print("\nrel-L2 of the residual stream after block n, against NF4 exact (how a perturbation grows with depth):")
        print("  block  " + "".join(f"{i + 1:>10}" for i in depth))
        for name, values in by_depth.items():
            print(f"  {name:<7}" + "".join(f"{v:10.2e}" for v in values))
    for title, prof in profiles.items():
        print_profile(title, prof)
    results.update(
        forwards=[dict(path=r[0], seconds=r[1], rel_l2=r[2], against=r[3]) for r in rows],
        rollout_step_seconds=steps,
        profiles=profiles,
    )
    if args.json:
        atomic.write_json(args.json, results, indent=1)


def rollout_only(model, dev, args: argparse.Namespace, lat: tuple[int, int, int], head: str, results: dict) -> None:
    """NF4 exact rollout steps on one GPU, then with the unconditional passes on a second (`--gpus 0,1`)."""
    import copy

    to_nf4(model)
    fused.enable(True)
    model.set_compute("bf16")
    one = rollout_step_seconds(model, dev, args.rollout_steps, lat, args.text_tokens, "bf16")
    print(f"rollout, 70 steps with guidance, NF4 exact, 1 GPU: {one:.2f} s / step", flush=True)
    two = None
    if torch.cuda.device_count() >= 2:
        second = copy.deepcopy(model).to("cuda:1")
        two = rollout_step_seconds(model, dev, args.rollout_steps, lat, args.text_tokens, "bf16", second)
        print(
            f"rollout, 70 steps with guidance, NF4 exact, 2 GPUs: {two:.2f} s / step ({two / one:.2f}x the one-GPU "
            "step; target <= 0.55x)",
            flush=True,
        )
    else:
        print("rollout on 2 GPUs: not measured (this machine has one GPU)")
    print(f"== {head} ==")
    results.update(rollout_step_seconds={"bf16": one}, rollout_two_gpu_step_seconds=two)
    if args.json:
        atomic.write_json(args.json, results, indent=1)


if __name__ == "__main__":
    main()
