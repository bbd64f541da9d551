"""A Linear's 8-bit weight held in place of its exact one: `--compute fp8` (e4m3) and `--compute int8` (int8),
one mechanism for both.

The 8-bit weight (one float32 scale per output channel) is made ONCE, on the Linear's first call that takes the
8-bit GEMM (`QuantizedWeight.of`: a subclass per compute says how it quantizes, `fp8.Fp8Weight`,
`int8.Int8Weight`), or for all the DiT's blocks at once as a Fast job is planned
(`worldgen.pipelines.fast_plan.make_block_weights`), and kept on the Linear. A dense Linear's exact (bf16) weight is then dropped from the device
(`drop_exact_weight`): the 8-bit one replaces it rather than sitting beside it (the 1.3B's blocks: 3.1 GiB of
bf16 for 1.6 GiB of 8-bit). Numbers: the same as quantizing the weight on every call (what fp8 did before), it
is the same quantizer on the same weight. A call of too few rows for the 8-bit GEMM (`MIN_ROWS`) on a Linear whose
weight was dropped runs W8A16 (`QuantizedWeight.dequantize`). An NF4 Linear keeps only its NF4 bytes (half the
8-bit size) and holds no 8-bit weight: fp8 and int8 make theirs per call from them (`NF4Linear.fp8_weight`,
`NF4Linear.int8_weight`), what the plan counts.

Another compute asked for on the same loaded model (`WanCameraDiT.set_compute`: the server's jobs may each name
one, the benchmarks compare them in one process) frees the 8-bit weights and restores the exact ones
(`restore_exact_weights`): streamed again from the checkpoint's files where the model was loaded from them
(`exact_weights_from`, set by the loader: nothing is held meanwhile, and a switch costs a re-read of the DiT's
weights), else from a copy kept on the CPU (a model built in memory).

Never made inside a CUDA graph capture (the tensor would live in the graph's pool: the capture fails and the
blocks run eagerly, as any capture failure) nor inside `triton_lang.compiling_ahead` (a Triton launch there
writes nothing: such a weight is made, used by that dry call and not kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import ClassVar

import torch

from worldgen.kernels.triton_lang import deferring

HELD = "_quantized_weight"  # the attribute of a Linear that holds its 8-bit weight


@dataclasses.dataclass
class QuantizedWeight:
    """A Linear's weight as 8-bit values [N, K] with one float32 scale per output channel [N, 1]."""

    data: torch.Tensor
    scale: torch.Tensor
    kind: ClassVar[str] = ""  # the compute it serves ("fp8", "int8")

    @staticmethod
    def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight these values stand for (a dropped Linear's few-row calls: W8A16)."""
        return (self.data.float() * self.scale).to(dtype)

    @classmethod
    def of(cls, linear: torch.nn.Module) -> QuantizedWeight:
        """The Linear's 8-bit weight, made on its first call and kept (once per load or compute switch): from its
        bf16 weight, or its NF4 weight dequantized as the exact path computes with it. A dense Linear's own weight
        is then dropped from the device (`drop_exact_weight`)."""
        cached = held(linear)
        if cached is not None:
            if not isinstance(cached, cls):
                raise RuntimeError(
                    f"a Linear holds a {cached.kind} weight and is asked for a {cls.kind} one: switch compute with "
                    "WanCameraDiT.set_compute (it restores the exact weights)"
                )
            return cached
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"a {cls.kind} weight made inside a CUDA graph capture: run the call once eagerly first")
        nf4 = hasattr(linear, "dequantized_weight")
        made = cls(*cls.quantize((linear.dequantized_weight() if nf4 else linear.weight).detach()))
        if deferring():  # a dry call compiling ahead: its Triton kernels wrote nothing, keep none of it
            return made
        setattr(linear, HELD, made)
        if not nf4:
            drop_exact_weight(linear)
        return made


def held(linear: torch.nn.Module) -> QuantizedWeight | None:
    """The 8-bit weight `linear` holds (None: none made since its load or the last compute switch)."""
    return getattr(linear, HELD, None)


def dropped(linear: torch.nn.Module) -> bool:
    """Whether `linear`'s exact weight was dropped for its 8-bit one (`drop_exact_weight`)."""
    return held(linear) is not None and linear.weight.numel() == 0


def drop_exact_weight(linear: torch.nn.Module) -> None:
    """Free a dense Linear's exact (bf16) weight once its 8-bit one is made. What restores it when another compute
    is asked for on the same model (`restore_exact_weights`): the checkpoint's files where the model was loaded
    from them (`exact_weights_from`: nothing held meanwhile), else a copy kept on the CPU."""
    if not getattr(linear, "exact_from_file", False):
        linear._exact_on_cpu = linear.weight.detach().to("cpu", copy=True)
    linear.weight.data = linear.weight.data.new_empty(0)


def exact_weights_from(model: torch.nn.Module, source: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> None:
    """Say where `model`'s dense Linears' exact weights can be read again: `source()` yields (state-dict key,
    tensor on the model's device, in its dtype) pairs; the loader gives the checkpoint's stream."""
    model.exact_weights = source
    for module in model.modules():
        if isinstance(getattr(module, "weight", None), torch.nn.Parameter) and hasattr(module, "compute"):
            module.exact_from_file = True


def restore_exact_weights(model: torch.nn.Module, keep: str | None = None) -> int:
    """Undo `QuantizedWeight.of` on every Linear of `model` whose 8-bit weight is not for `keep` (the compute
    asked for: its weights stay): 8-bit weights freed, dropped exact weights back on their device (from the CPU
    copy, else streamed from the checkpoint's files); -> the number of Linears restored."""
    made = {name: m for name, m in model.named_modules() if held(m) is not None and held(m).kind != keep}
    from_file = {}
    for name, linear in made.items():
        if dropped(linear):
            kept = getattr(linear, "_exact_on_cpu", None)
            if kept is None:
                from_file[name + ".weight"] = linear
            else:
                linear.weight.data = kept.to(linear.weight.device)
                linear._exact_on_cpu = None
        setattr(linear, HELD, None)
    if from_file:
        source = getattr(model, "exact_weights", None)
        if source is None:
            raise RuntimeError(
                f"{len(from_file)} Linears dropped their weights for 8-bit ones and nothing restores them"
            )
        for key, tensor in source():
            if key in from_file:
                from_file.pop(key).weight.data = tensor
        if from_file:
            raise RuntimeError(f"the checkpoint lacks {sorted(from_file)[:3]}: the exact weights cannot be restored")
    return len(made)


def saved_bytes(module: torch.nn.Module, linear_type: type) -> int:
    """What the dense Linears (`linear_type`) of `module` free when their exact weights are dropped for 8-bit ones
    (1 byte a weight and a float32 scale an output channel; their biases stay): for the memory plan, on a model
    built on the meta device (no weights needed)."""
    saved = 0
    for m in module.modules():
        if isinstance(m, linear_type) and not hasattr(m, "dequantized_weight"):
            saved += m.weight.numel() * (m.weight.element_size() - 1) - 4 * m.weight.shape[0]
    return saved
