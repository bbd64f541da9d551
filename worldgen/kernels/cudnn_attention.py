"""cuDNN's fused attention (bf16 and FP8) through NVIDIA's cuDNN frontend package.

Why not PyTorch's SDPA alone: on Hopper PyTorch already runs cuDNN's bf16 attention, but it offers
no FP8 attention, and attention is over half of an FP8 forward (docs/benchmarks.md). The frontend
(`pip install nvidia-cudnn-frontend`, the `cudnn` module; it uses the libcudnn PyTorch ships)
builds cuDNN's `sdpa_fp8` graph: Q, K, V in float8 e4m3 with one scale each, the softmax
probabilities P quantized to e4m3 before P @ V, the output O in e4m3 (Hopper's kernel writes no
other type) with its own scale. Same graph for bf16 (`sdpa`), the exact kernel, for comparison.

A graph is built once per (kind, device, shapes, strides) and reused: every block of a forward
has the same shapes. Inputs come in the DiT's layout, [B, L, heads, dim] views of the projections,
described to cuDNN by their strides, so nothing is transposed or copied.

A graph runs the heuristics' first engine plan that takes its buffers, not one picked by timing: the
plans sum in different orders (at the Fast model's shapes cuDNN offers three FP8 plans, and each gives
other bits), so a choice by timing, which can differ from process to process, would change the rounding
with it. The first plan was also the fastest measured on the H100: 1.85 ms against 2.01 and 2.12 ms for
4,524 queries over 15,080 keys, 24.5 against 29.7 and 28.9 ms at the base model's shape
(docs/benchmarks.md, "Session 22: Fast" and "Session 6").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from worldgen.kernels.fp8 import FP8, FP8_MAX, QuantizedTensor

# P = exp(S - rowmax) lies in [0, 1]: scaled to the e4m3 range before P @ V, as Transformer Engine does
P_SCALE = FP8_MAX


def installed() -> bool:
    try:
        import cudnn  # noqa: F401
    except Exception:  # noqa: BLE001  (missing, or a libcudnn mismatch: either way not usable)
        return False
    return True


_handles: dict[int, object] = {}


def _handle(device: torch.device):
    import cudnn

    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = _handles.get(index)
    if handle is None:
        with torch.cuda.device(index):
            handle = _handles[index] = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


def _heads_first(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """[B, L, n, d] tensor -> cuDNN's [B, n, L, d] dims and the strides that describe it in place."""
    b, length, n, d = t.shape
    sb, sl, sn, sd = t.stride()
    return [b, n, length, d], [sb, sn, sl, sd]


@dataclasses.dataclass
class _Graph:
    graph: object
    tensors: dict[str, object]  # name -> the graph's tensor
    workspace: torch.Tensor
    plan: int  # the engine plan used (`_choose_plan`)
    plan_count: int

    def run(self, buffers: dict[str, torch.Tensor], device: torch.device, plan: int | None = None) -> None:
        pack = {self.tensors[name]: buffer for name, buffer in buffers.items()}
        self.graph.execute_plan_at_index(
            pack, self.workspace, self.plan if plan is None else plan, handle=_handle(device)
        )


_graphs: dict[tuple, _Graph] = {}


def _build(kind: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> _Graph:
    import cudnn

    io = cudnn.data_type.BFLOAT16 if kind == "bf16" else cudnn.data_type.FP8_E4M3
    fp32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=io, intermediate_data_type=fp32, compute_data_type=fp32, handle=_handle(q.device)
    )
    tensors = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        dims, strides = _heads_first(t)
        tensors[name] = graph.tensor(name=name, dim=dims, stride=strides, data_type=io)
    options = dict(attn_scale=1.0 / math.sqrt(q.shape[-1]), use_causal_mask=False, generate_stats=False)
    if kind == "bf16":
        out, _stats = graph.sdpa(name="sdpa", q=tensors["q"], k=tensors["k"], v=tensors["v"], **options)
    else:
        for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
            tensors[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
        out, _stats, amax_s, amax_o = graph.sdpa_fp8(
            name="sdpa_fp8",
            q=tensors["q"], k=tensors["k"], v=tensors["v"],
            descale_q=tensors["descale_q"], descale_k=tensors["descale_k"], descale_v=tensors["descale_v"],
            descale_s=tensors["descale_s"], scale_s=tensors["scale_s"], scale_o=tensors["scale_o"],
            **options,
        )  # fmt: skip
        for name, amax in (("amax_s", amax_s), ("amax_o", amax_o)):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
            tensors[name] = amax
    dims, strides = _heads_first(o)
    out.set_output(True).set_dim(dims).set_stride(strides).set_data_type(io)
    tensors["o"] = out
    graph.validate()
    graph.build_operation_graph()
    try:  # every engine the heuristics know of; the fastest is measured below
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    except Exception:  # noqa: BLE001  (a cuDNN without mode B's list)
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    count = graph.get_execution_plan_count()
    size = max(graph.get_workspace_size_plan_at_index(i) for i in range(count))
    workspace = torch.empty(max(size, 1), device=q.device, dtype=torch.uint8)
    return _Graph(graph, tensors, workspace, 0, count)


def _graph(kind: str, buffers: dict[str, torch.Tensor]) -> _Graph:
    q, k, v, o = (buffers[name] for name in "qkvo")
    key = (kind, q.device, *((t.shape, t.stride(), t.dtype) for t in (q, k, v, o)))
    graph = _graphs.get(key)
    if graph is None:
        graph = _graphs[key] = _build(kind, q, k, v, o)
        graph.plan = _choose_plan(graph, buffers, q.device)
    return graph


def _choose_plan(graph: _Graph, buffers: dict[str, torch.Tensor], device: torch.device) -> int:
    """The heuristics' first plan that runs these buffers: the same one in every process (see above)."""
    for index in range(graph.plan_count):
        try:
            graph.run(buffers, device, index)
        except Exception:  # noqa: BLE001  (a plan that cannot run these buffers is not a choice)
            continue
        return index
    return 0  # none ran: the caller's call raises cuDNN's own error


def describe() -> list[str]:
    """One line per graph built so far: its kind, how many plans and the one chosen (benchmarks)."""
    return [f"{key[0]} graph, {graph.plan_count} plan(s), chosen {graph.plan}" for key, graph in _graphs.items()]


def bf16_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with cuDNN's bf16 kernel: [B, L, n, d] in, [B, L, n, d] out."""
    o = torch.empty(q.shape[:-1] + v.shape[-1:], device=q.device, dtype=q.dtype)
    buffers = {"q": q, "k": k, "v": v, "o": o}
    _graph("bf16", buffers).run(buffers, q.device, plan)
    return o


def plans(q, k, v, kind: str = "bf16") -> list[Callable]:
    """One callable per engine plan of the `kind` graph for these inputs (benchmarks): bf16 q, k, v for
    "bf16" (-> bf16 output), `QuantizedTensor`s for "fp8" (-> `QuantizedTensor`)."""
    if kind == "bf16":
        count = _graph("bf16", {"q": q, "k": k, "v": v, "o": torch.empty_like(q)}).plan_count
        run_plan = bf16_attention
    else:
        count = _graph("fp8", _fp8_buffers(q, k, v)).plan_count
        run_plan = fp8_attention_quantized

    def runner(index: int):
        def run(q, k, v):
            return run_plan(q, k, v, plan=index)

        run.name = f"plan {index}"
        return run

    return [runner(i) for i in range(count)]


def fp8_unsupported_reason(device: torch.device) -> str | None:
    """None when cuDNN's FP8 attention can run on `device`, else why not (for `--compute fp8`'s note)."""
    if device.type != "cuda":
        return f"FP8 attention needs an NVIDIA GPU, not {device.type}"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "cuDNN's FP8 attention needs a Hopper GPU (H100, H200); Ada has FP8 GEMMs but no such kernel here"
    if not installed():
        return "cuDNN's FP8 attention needs the cuDNN frontend package (pip install nvidia-cudnn-frontend)"
    return None


_constants: dict[torch.device, dict[str, torch.Tensor]] = {}


def _fp8_constants(device: torch.device) -> dict[str, torch.Tensor]:
    """P's fixed scales and the amax outputs nobody reads, made once per device: a forward calls the
    kernel in every block, and each of these was its own small allocation or launch on the host's path."""
    held = _constants.get(device)
    if held is None:
        one = torch.ones((1, 1, 1, 1), device=device, dtype=torch.float32)
        held = {
            "descale_s": one / P_SCALE, "scale_s": one * P_SCALE,
            "amax_s": torch.empty_like(one), "amax_o": torch.empty_like(one),
        }  # fmt: skip
        if not torch.cuda.is_current_stream_capturing():  # a capture only records: these would hold nothing yet
            _constants[device] = held
    return held


def _fp8_buffers(
    q: QuantizedTensor, k: QuantizedTensor, v: QuantizedTensor, out: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    device = q.data.device
    shape = q.data.shape[:-1] + v.data.shape[-1:]
    if out is not None and (out.shape != shape or out.dtype != FP8 or not out.is_contiguous()):
        raise ValueError(
            f"FP8 attention's out must be a contiguous e4m3 {tuple(shape)}, not {tuple(out.shape)} {out.dtype}"
        )
    return {
        "q": q.data, "k": k.data, "v": v.data,
        "o": torch.empty(shape, device=device, dtype=FP8) if out is None else out,
        "descale_q": q.descale, "descale_k": k.descale, "descale_v": v.descale,
        "scale_o": 1.0 / v.descale, **_fp8_constants(device),
    }  # fmt: skip


def fp8_attention_quantized(
    q: QuantizedTensor, k: QuantizedTensor, v: QuantizedTensor, plan: int | None = None, out: torch.Tensor | None = None
) -> QuantizedTensor:
    """cuDNN's FP8 attention on already quantized Q, K, V; O comes back in e4m3 with its scale (in
    `out` when given: an e4m3 tensor of O's shape).

    |O| <= max|V| (each row of O is a convex combination of V's rows), so O's scale is V's: no
    second pass over O to find its range."""
    buffers = _fp8_buffers(q, k, v, out)
    _graph("fp8", buffers).run(buffers, q.data.device, plan)
    return QuantizedTensor(buffers["o"], v.descale)


def attention_note(device: torch.device | str) -> str:
    """What `--compute fp8` does with attention on `device`, in one sentence."""
    reason = fp8_unsupported_reason(torch.device(device))
    if reason is None:
        return "--compute fp8: attention runs in FP8 too (cuDNN's FP8 attention, per-tensor scales)"
    return f"--compute fp8: attention stays bf16 (PyTorch SDPA): {reason}; only the Linear layers run in FP8"
