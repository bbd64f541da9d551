"""NF4 dequantizing gives the same bits on every CPU: the CUDA rule, not the instruction set's kernel.

bitsandbytes' AVX-512 CPU kernel indexes absmax per row (row * (in_features // 64) + col // 64); CUDA
indexes it over the flat weight. The two agree only where in_features is a multiple of the blocksize,
so the layers here include ones that are not, and the rule is written out element by element.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from worldgen.kernels import int8, quantized_weights
from worldgen.kernels import nf4 as nf4_module
from worldgen.kernels.fp8 import quantize_rows
from worldgen.kernels.nf4 import NF4Linear, fp8_rows_from_nf4, quantize_weight

# (out_features, in_features): 32 and 96 are not multiples of the blocksize (64), 128 is; 3 x 32 also
# ends in a partial block.
SHAPES = [(8, 32), (4, 96), (3, 32), (8, 128)]


def nf4_layer(out_features: int, in_features: int) -> NF4Linear:
    """A layer quantized by bitsandbytes itself, loaded the way a checkpoint is."""
    generator = torch.Generator().manual_seed(out_features * 1000 + in_features)
    # rows of very different magnitude, so using another row's absmax changes the values
    scale = torch.logspace(-2, 1, out_features)[:, None]
    weight = (torch.randn(out_features, in_features, generator=generator) * scale).to(torch.bfloat16)
    parts = quantize_weight(weight)
    layer = NF4Linear(in_features, out_features, bias=False, compute_dtype=torch.float32)
    layer.set_quant_state({k.removeprefix("weight."): v for k, v in parts.items()}, "layer")
    return layer


def rule(layer: NF4Linear, per_row: bool = False) -> torch.Tensor:
    """The CUDA rule, one element at a time in float32; `per_row` indexes absmax as the AVX-512 kernel does."""
    f32 = np.float32
    code = layer.quant_map.numpy()
    nested_code, nested_absmax = layer.nested_quant_map.numpy(), layer.nested_absmax.numpy()
    offset = f32(layer.nested_offset.item())
    absmax = [
        f32(nested_code[byte]) * f32(nested_absmax[i // layer.nested_blocksize]) + offset
        for i, byte in enumerate(layer.absmax.tolist())
    ]
    nibbles = [nibble for byte in layer.weight.reshape(-1).tolist() for nibble in (byte >> 4, byte & 0xF)]
    blocks_per_row = layer.in_features // layer.blocksize
    values = []
    for i in range(layer.out_features * layer.in_features):
        row, col = divmod(i, layer.in_features)
        block = row * blocks_per_row + col // layer.blocksize if per_row else i // layer.blocksize
        values.append(f32(code[nibbles[i]]) * absmax[block])
    flat = torch.from_numpy(np.array(values, dtype=np.float32))
    return flat.reshape(layer.out_features, layer.in_features).to(torch.bfloat16)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cpu_dequantize_is_the_cuda_rule_bit_for_bit(shape):
    layer = nf4_layer(*shape)
    ours = layer.dequantized_weight(torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and ours.shape == shape
    assert torch.equal(bits(ours), bits(rule(layer)))
    # the compute dtype is the bf16 weight, widened exactly
    assert torch.equal(layer.dequantized_weight(), ours.float())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_per_row_indexing_differs_where_in_features_is_not_a_multiple_of_the_blocksize(shape):
    """So the test above would catch a path that indexed absmax per row."""
    layer = nf4_layer(*shape)
    same = torch.equal(bits(rule(layer, per_row=True)), bits(rule(layer)))
    assert same == (shape[1] % layer.blocksize == 0)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cuda_kernel_equals_the_cpu_path(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer = nf4_layer(*shape)
    cpu = layer.dequantized_weight(torch.bfloat16)
    gpu = layer.to("cuda").dequantized_weight(torch.bfloat16)
    assert torch.equal(bits(gpu.cpu()), bits(cpu))


# (out_features, in_features) with in_features a multiple of the blocksize and several nested blocks of 256
FP8_SHAPES = [(64, 512), (48, 1024)]


def _fp8_rows(layer: NF4Linear) -> tuple[torch.Tensor, torch.Tensor]:
    return fp8_rows_from_nf4(
        layer.weight, layer.absmax, layer.nested_quant_map, layer.nested_absmax, layer.nested_offset,
        layer.quant_map, (layer.out_features, layer.in_features), layer.blocksize, layer.nested_blocksize,
    )  # fmt: skip


@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fp8_rows_straight_from_nf4_are_the_two_step_paths_bytes(shape):
    """The fused NF4 -> e4m3 weight (one pass on CUDA) is, byte for byte, the bf16 weight quantized row by row."""
    layer = nf4_layer(*shape)
    q, scale = _fp8_rows(layer)
    q_ref, scale_ref = quantize_rows(layer.dequantized_weight(torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and q.shape == shape and scale.shape == (shape[0], 1)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert q.float().abs().amax(dim=1).eq(448.0).all()  # each row's largest weight takes e4m3's maximum


def _rows_on_cuda(shape: tuple[int, int], kind: str):
    """(an NF4 layer on the GPU, its `kind` weight made by the Triton kernel, whose failure fails the test)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer = nf4_layer(*shape).to("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel's failure is a warning and a fallback: here, a failure
        made = layer.fp8_weight() if kind == "fp8" else layer.int8_weight()
    assert f"nf4->{kind}" not in nf4_module._failed
    return layer, made


def _int8_layer(monkeypatch) -> tuple[NF4Linear, torch.Tensor]:
    """An NF4 layer under int8 and 10 rows for it (its 8-bit GEMM from 4 rows on)."""
    monkeypatch.setattr(int8, "MIN_ROWS", 4)
    layer = nf4_layer(48, 128)
    layer.compute = "int8"
    return layer, torch.randn(2, 5, 128)


def test_a_held_8bit_weight_gives_the_per_call_numbers_and_is_dropped_on_request(monkeypatch):
    """`NF4Linear.hold`: the 8-bit weight made once and kept beside the NF4 bytes (where the plan has room) gives the
    GEMM the very weight it made per call; holding another kind replaces it, None drops it."""
    layer, x = _int8_layer(monkeypatch)
    with torch.no_grad():
        per_call = layer(x)
        assert layer.hold("int8") == 48 * 128 + 48 * 4  # a byte a weight, a float32 scale a row
        assert quantized_weights.held(layer).kind == "int8" and layer.weight.numel() > 0  # the NF4 bytes stay
        assert torch.equal(layer(x), per_call)
        calls = []
        monkeypatch.setattr(layer, "_rows", lambda kind: calls.append(kind))  # a per-call weight would be made here
        assert torch.equal(layer(x), per_call) and calls == []
        monkeypatch.undo()
        assert layer.hold("fp8") == 48 * 128 + 48 * 4
        fp8 = layer.fp8_weight()
        want = quantize_rows(layer.dequantized_weight(torch.bfloat16))
        assert torch.equal(fp8[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(fp8[1], want[1])
        assert layer.hold(None) == 0 and quantized_weights.held(layer) is None


def test_the_plan_holds_an_nf4_dits_8bit_weights_in_the_blocks_its_room_takes():
    """`fast_plan.held_weight_blocks`: an NF4 checkpoint under fp8/int8 holds its every-forward Linears' 8-bit weights
    in as many blocks as the room left by the plan takes (all without a limit), none under exact or for a bf16
    checkpoint; `hold_nf4_weights` makes the first n blocks' and drops the rest's."""
    from worldgen.models.dit_config import DiTConfig
    from worldgen.pipelines.fast_plan import EVERY_FORWARD, held_block_gib, held_weight_blocks, hold_nf4_weights

    cfg = DiTConfig()  # the 14B: 6 x 5120^2 + 2 x 5120 x 13824 weights a block
    per_block = held_block_gib(cfg)
    assert per_block == pytest.approx(0.2785, abs=1e-4)
    assert held_weight_blocks(None, "nf4", "fp8", cfg) == 40
    assert held_weight_blocks(0.5 + 10.5 * per_block, "nf4", "int8", cfg) == 10  # less the 0.5 GiB margin
    assert held_weight_blocks(0.4, "nf4", "fp8", cfg) == 0 == held_weight_blocks(-3.0, "nf4", "fp8", cfg)
    assert held_weight_blocks(None, "nf4", "exact", cfg) == 0 == held_weight_blocks(None, "bf16", "fp8", cfg)

    class Block(torch.nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            for name in EVERY_FORWARD:
                parent, child = name.split(".")
                if not hasattr(self, parent):
                    self.add_module(parent, torch.nn.Module())
                getattr(self, parent).add_module(child, nf4_layer(8 + i, 64))

    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList(Block(i) for i in range(3))
    assert hold_nf4_weights(model, "int8", 2) == sum(len(EVERY_FORWARD) * ((8 + i) * 64 + (8 + i) * 4) for i in (0, 1))
    held = [[quantized_weights.held(b.get_submodule(n)) is not None for n in EVERY_FORWARD] for b in model.blocks]
    assert held == [[True] * 8, [True] * 8, [False] * 8]
    hold_nf4_weights(model, "int8", 1)
    assert [quantized_weights.held(b.ffn.get_submodule("0")) is not None for b in model.blocks] == [True, False, False]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fp8_rows_from_the_triton_kernel_match_the_two_step_path(shape):
    layer, (q, scale) = _rows_on_cuda(shape, "fp8")
    q_ref, scale_ref = quantize_rows(layer.dequantized_weight(torch.bfloat16))
    assert torch.equal(scale, scale_ref)
    # Triton's float32 division may differ from the reference kernel's in the last bit, moving a rare
    # value across an e4m3 rounding boundary: one step at most, on a tiny fraction of the weights
    differ = q.view(torch.uint8) != q_ref.view(torch.uint8)
    assert differ.float().mean().item() < 1e-3
    steps = (q.view(torch.uint8).int() - q_ref.view(torch.uint8).int()).abs()  # e4m3 bytes are ordered by magnitude
    assert steps.max().item() <= 1


def test_an_nf4_linear_under_int8_makes_its_int8_weight_per_call_and_holds_none(monkeypatch):
    """The int8 weight is `int8.quantize_rows` of the bf16 weight, made from the NF4 bytes on every call and not kept
    on the Linear unless the plan says so (`hold`): all held, the 14B's int8 weights (13 GiB) beside its NF4 bytes ran
    a job planned for the NF4 bytes out of a 24 GiB budget."""
    layer, x = _int8_layer(monkeypatch)
    with torch.no_grad():
        y = layer(x)
    q, scale = int8.quantize_rows(layer.dequantized_weight(torch.bfloat16))
    xq, x_scale = int8.quantize_rows(x.reshape(-1, 128))
    want = ((xq.int() @ q.int().T).float() * x_scale * scale.view(1, -1)).view(2, 5, 48)
    assert torch.equal(y, want)
    assert quantized_weights.held(layer) is None and layer.weight.numel() > 0  # no int8 weight kept, NF4 bytes kept
    made = layer.int8_weight()
    assert torch.equal(made.data, q) and torch.equal(made.scale, scale)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_int8_rows_from_the_triton_kernel_are_the_two_step_paths_bytes(shape):
    layer, made = _rows_on_cuda(shape, "int8")
    q, scale = int8.quantize_rows(layer.dequantized_weight(torch.bfloat16))
    assert made.data.dtype == torch.int8 and torch.equal(made.scale, scale) and torch.equal(made.data, q)


_INTERPRETED_ROWS = """
import torch
from tests.worldgen.test_nf4 import nf4_layer
from worldgen.kernels import int8, nf4
for shape in [(64, 512), (48, 1024)]:
    layer = nf4_layer(*shape)
    state = (layer.weight, layer.absmax, layer.nested_quant_map, layer.nested_absmax, layer.nested_offset, layer.quant_map)
    q, scale = nf4._triton_rows(*state, shape, layer.blocksize, layer.nested_blocksize, int8=True)
    want_q, want_scale = int8.quantize_rows(layer.dequantized_weight(torch.bfloat16))
    assert q.dtype == torch.int8 and q.abs().amax(dim=1).eq(127).all()
    assert torch.allclose(scale, want_scale, rtol=2 ** -7, atol=0) and (q.int() - want_q.int()).abs().max() <= 1
    assert (q != want_q).float().mean() < 0.2, (q != want_q).float().mean()
print("interpreted nf4 -> int8 rows: ok")
"""


@pytest.mark.slow
def test_int8_rows_from_the_triton_kernel_under_the_interpreter():
    """The NF4 -> int8 kernel on CPU tensors (Triton's interpreter): every row's largest weight at 127, each value
    within one step of the two-step path's (the interpreter rounds to bf16 by truncation, a GPU to nearest: the
    bytes are compared on the GPU, above); a wrong block, nibble order or row would be off by many steps."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_ROWS], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_the_quant_state_reads_as_bitsandbytes_reads_it():
    from bitsandbytes.functional import QuantState

    from worldgen.kernels.nf4 import read_quant_state

    parts = {k.removeprefix("weight."): v for k, v in quantize_weight(torch.randn(24, 128).bfloat16()).items()}
    ours = read_quant_state(parts, "layer")
    theirs = QuantState.from_dict({k: v for k, v in parts.items() if k != "weight"}, device="cpu")
    assert (ours.quant_type, ours.blocksize, ours.dtype, ours.shape) == (
        theirs.quant_type, theirs.blocksize, theirs.dtype, theirs.shape,
    )  # fmt: skip
    assert torch.equal(ours.absmax, theirs.absmax) and torch.equal(ours.code, theirs.code)
    assert torch.equal(ours.offset, theirs.offset) and ours.offset.dtype == theirs.offset.dtype
    for field in ("absmax", "code", "blocksize", "dtype"):
        a, b = getattr(ours.state2, field), getattr(theirs.state2, field)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda meta: b"{not json", "JSONDecodeError"),
        (lambda meta: json.dumps({**meta, "colour": "red"}).encode(), "unknown fields ['colour']"),
        (lambda meta: json.dumps({k: v for k, v in meta.items() if k != "blocksize"}).encode(), "KeyError"),
        (lambda meta: json.dumps({**meta, "dtype": "bfloat99"}).encode(), "bfloat99"),
    ],
    ids=["not-json", "unknown-field", "missing-field", "unknown-dtype"],
)
def test_an_unreadable_quant_state_is_a_checkpoint_error_naming_the_layer(damage, says):
    from worldgen.errors import CheckpointError

    parts = {k.removeprefix("weight."): v for k, v in quantize_weight(torch.randn(8, 64).bfloat16()).items()}
    key = "quant_state.bitsandbytes__nf4"
    meta = json.loads(bytes(parts[key].numpy()).decode())
    parts[key] = torch.frombuffer(bytearray(damage(meta)), dtype=torch.uint8)
    layer = NF4Linear(64, 8, bias=False, compute_dtype=torch.float32)
    with pytest.raises(CheckpointError, match=r"blocks\.3\.ffn\.0: unreadable NF4 quant state") as caught:
        layer.set_quant_state(parts, "blocks.3.ffn.0")
    assert says in str(caught.value)


def test_an_nf4_checkpoint_loads_and_runs_on_the_cpu_without_importing_bitsandbytes():
    """Importing bitsandbytes imports dynamo and Inductor (seconds); only its own kernels need it."""
    import subprocess
    import sys

    from worldgen.runtime.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint("nf4")  # made with bitsandbytes here, once, so the child only reads it
    code = (
        "import sys, torch\n"
        "from worldgen.pipelines.loader import load_pipeline\n"
        "pipe = load_pipeline('tiny-nf4', device='cpu', model='base', use_text_cache=False)\n"
        "model = pipe.residency.use('high')\n"
        "weight = next(m for m in model.modules() if type(m).__name__ == 'NF4Linear').dequantized_weight()\n"
        "assert torch.isfinite(weight).all()\n"
        "print('bitsandbytes' in sys.modules, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["False", "False"], out.stdout
