"""Where a GPU region's time goes: its kernels by family, and how long the GPU sat idle between them.

`profiled(path)` wraps a region (one rollout, say) in `torch.profiler` and writes `path`: the wall time,
the GPU's busy time (the union of kernel intervals, so overlapping streams count once) and its idle
share, each kernel family's total (GEMMs, attention, NF4 dequantization, FP8 quantization, Triton
fusions, copies, the rest), the 40 costliest kernels, then the 40 costliest call sites: the PyTorch op
our code called and its input shapes, so a copy or an elementwise kernel says which tensor it moves
(kernels launched outside PyTorch's ops, Triton's and cuDNN's own, are not listed there). Idle time is what launch overhead, host
work and synchronisations cost: the part of a chunk that CUDA graphs or fewer launches can win back. The
longest idle stretches are listed by the op that launched the kernel after them and the one before (inside the
innermost `torch.profiler.record_function` range, where the pipeline names its parts): what the GPU waited for.
`profiled_ranks(pipe, path)`: the same for a two-GPU pipeline's both ranks, rank 1's in `<path stem>-rank1.txt`
(written by its own process: `worldgen.pipelines.two_gpu.TwoDevices.peer_region`).
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# kernel name -> family, first match wins (names as cuBLAS, cuDNN, PyTorch, Triton and bitsandbytes print them;
# the examples in tests/test_bench_tools.py are names from an H100 profile)
FAMILIES = (
    ("attention", r"fmha|flash|attention|sdpa|^_attn_fwd$"),  # _attn_fwd: SageAttention's; ours _attention_kernel
    ("nf4 weights", r"nf4|kDequantize"),
    ("gemm int8", r"i16832gemm_s8|imma|^_gemm_kernel$"),  # cuBLAS's torch._int_mm; our Triton W8A8 GEMM
    ("gemm fp8", r"e4m3|f8f6f4|fp8.*gemm|gemm.*fp8|nvjet_\w*?_qq"),  # cuBLASLt's nvjet kernels: qq = e4m3 inputs
    ("conv (VAE)", r"conv|fprop_implicit_gemm|nhwckrsc|nchwToNhwc|nhwcToNchw|cudnn::|upsample"),
    ("gemm", r"gemm|sm90_xmma|nvjet|cutlass|ampere_bf16|wgmma"),
    ("triton hand-written", r"^_\w+_kernel$"),  # worldgen.kernels (fused_triton, fp8, channel_norm)
    ("triton fused", r"^triton_"),  # Inductor's
    ("copy / cast", r"copy|Memcpy|memset|cat|CatArray|elementwise_kernel.*(copy|direct)"),
)


def family_of(name: str) -> str:
    for family, pattern in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return family
    return "other elementwise"


def _busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in) -> seconds."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e6


def call_site(event) -> tuple[str, str]:
    """(the PyTorch op our code called, its input shapes) for the CPU event that launched a kernel: the
    outermost of the ops nested around it (`aten::to`, not the `aten::copy_` inside it)."""
    op = event
    while op.cpu_parent is not None and "::" in op.cpu_parent.name:
        op = op.cpu_parent
    shapes = ",".join("x".join(map(str, s)) for s in (op.input_shapes or ()) if s)
    return op.name, shapes[:60]


GAP_US = 100.0  # idle stretches shorter than this are launch gaps between queued kernels, summed apart


def idle_gaps(kernels: list[tuple[float, float, str]], top: int = 25) -> list[str]:
    """The GPU's idle stretches between kernels [(start us, end us, who launched it)], streams merged: those
    of >= GAP_US summed by (who launched the kernel after, who launched the one before), the costliest first."""
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    short, short_count, end, before = 0.0, 0, None, ""
    for start, stop, site in sorted(kernels):
        if end is not None and start > end:
            gap = start - end
            if gap < GAP_US:
                short, short_count = short + gap, short_count + 1
            else:
                entry = by_pair[(site, before)]
                entry[0] += gap / 1e6
                entry[1] += 1
                entry[2] = max(entry[2], gap / 1e6)
        if end is None or stop > end:
            end, before = stop, site
    listed = sorted(by_pair.items(), key=lambda x: -x[1][0])[:top]
    lines = [
        f"idle stretches >= {GAP_US:g} us: {sum(v[1] for v in by_pair.values())}, "
        f"{sum(v[0] for v in by_pair.values()):.3f} s; shorter: {short_count}, {short / 1e6:.3f} s",
        "longest idle (s, stretches, longest s, the launch after it <- the launch before it):",
    ]
    return lines + [f"  {t:8.3f} {n:6d} {m:7.4f}  {after} <- {prior}" for (after, prior), (t, n, m) in listed]


# the profiler's own marks on the GPU's timeline, not work
PROFILER_MARKS = ("Activity Buffer Request",)


def device_work(events: list, range_names: set[str]) -> list:
    """The GPU's kernels, copies and memsets among the profile's events: not the `record_function` ranges the
    profiler also draws on the GPU's timeline (named as on the host: `range_names`), nor its own marks."""
    return [
        e
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
        and e.name not in range_names
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith(PROFILER_MARKS)
    ]


def launchers_of(kernels: list, cpu: list) -> list:
    """The host event that launched each kernel (None where unknown). Each host event lists the kernels it
    launched by name (`kernels`), not which GPU event each is (the profiles of torch 2.11 keep no link on the
    GPU's events): the n-th launch of a name, in host order, is the n-th run of that name, in GPU order, as
    one stream runs its kernels in the order they were launched."""
    launches: dict[str, list] = defaultdict(list)
    for e in sorted(cpu, key=lambda e: e.time_range.start):
        for k in getattr(e, "kernels", ()) or ():
            launches[k.name].append(e)
    runs: dict[str, list[int]] = defaultdict(list)
    for i, e in sorted(enumerate(kernels), key=lambda ie: ie[1].time_range.start):
        runs[e.name].append(i)
    out: list = [None] * len(kernels)
    for name, indices in runs.items():
        for i, launcher in zip(indices, launches.get(name, ()), strict=False):
            out[i] = launcher
    return out


def launch_site(event) -> str:
    """Who launched a kernel: the innermost `record_function` range around its op, the op and its shapes."""
    op, shapes = call_site(event)
    label, up = "", event
    while up is not None and not label:
        if "::" not in up.name and not up.name.startswith(("cuda", "cu")):
            label = up.name
        up = up.cpu_parent
    return f"{label + ': ' if label else ''}{op}{f' [{shapes}]' if shapes else ''}"


def _site_lines(events: list) -> list[str]:
    """The 40 costliest (op, input shapes, kernel family) by the GPU time of their kernels."""
    by_site: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0])  # (op, shapes, family)
    for e in events:
        for k in getattr(e, "kernels", ()) or ():
            key = (*call_site(e), family_of(k.name))
            by_site[key][0] += k.duration / 1e6
            by_site[key][1] += 1
    top = sorted(by_site.items(), key=lambda x: -x[1][0])[:40]
    return ["top call sites (s, kernels, family, op [input shapes]):"] + [
        f"  {t:8.3f} {n:6d}  {family:<20} {op} [{shapes}]" for (op, shapes, family), (t, n) in top
    ]


@contextlib.contextmanager
def profiled(path: Path, label: str = "") -> Iterator[None]:
    """Profile the region (CUDA kernels and host ops with their input shapes) and write the summary to `path`."""
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities, record_shapes=True) as prof:
        start = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.events()
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    kernels = device_work(events, {e.name for e in cpu})
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_family: dict[str, float] = defaultdict(float)
    intervals = []
    for e in kernels:
        s, t = e.time_range.start, e.time_range.end
        intervals.append((s, t))
        by_name[e.name][0] += (t - s) / 1e6
        by_name[e.name][1] += 1
        by_family[family_of(e.name)] += (t - s) / 1e6
    busy = _busy_seconds(intervals)
    lines = [
        f"{label}: wall {wall:.3f} s, GPU busy {busy:.3f} s ({busy / wall:.0%}), idle {wall - busy:.3f} s; "
        f"{len(kernels)} kernels",
        "family totals (s, kernel time summed over streams):",
    ]
    lines += [f"  {f:<20} {t:8.3f}" for f, t in sorted(by_family.items(), key=lambda x: -x[1])]
    lines.append("top kernels (s, calls, name):")
    top = sorted(by_name.items(), key=lambda x: -x[1][0])[:40]
    lines += [f"  {t:8.3f} {n:6d}  {name[:160]}" for name, (t, n) in top]
    lines += _site_lines(cpu)
    launchers = launchers_of(kernels, cpu)
    launched = [
        (e.time_range.start, e.time_range.end, launch_site(c) if c else "?")
        for e, c in zip(kernels, launchers, strict=True)
    ]
    lines.append(
        f"kernels put down to the host event that launched them: {sum(map(bool, launchers))} of {len(kernels)}"
    )
    lines += idle_gaps(launched)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: 2 + len(by_family)]), flush=True)


@contextlib.contextmanager
def profiled_ranks(pipe, path: Path, label: str = "") -> Iterator[None]:
    """`profiled` in this process, and for a two-GPU pipeline (`pipe.scale_out`) in rank 1's around its half of the
    same forwards, its summary in `<path stem>-rank1.txt`, written before this returns."""
    split = getattr(pipe, "scale_out", None)
    if split is not None:
        split.peer_region(functools.partial(profiled, path.with_name(f"{path.stem}-rank1.txt"), f"{label}, rank 1"))
    try:
        with profiled(path, label):
            yield
    finally:
        if split is not None:
            split.peer_region(None)
