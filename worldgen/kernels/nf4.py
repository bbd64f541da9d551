"""NF4 linear layers in the community checkpoint layout (bitsandbytes' serialised `Linear4bit`).

For a Linear named `N` the checkpoint holds `N.weight` (packed uint8), `N.weight.absmax`,
`N.weight.quant_map`, `N.weight.nested_absmax`, `N.weight.nested_quant_map`,
`N.weight.quant_state.bitsandbytes__nf4` (packed JSON of shape, dtype, blocksize, ...) and `N.bias`.

`NF4Linear` keeps those tensors as buffers (so `.to(device)` moves them) and, on each call,
dequantizes the weight and runs a plain linear in the compute dtype. We do not use
`bnb.nn.Linear4bit.forward`: on the CPU it needs an extra download, and dequantize-then-matmul is
what it does for long token sequences anyway.

Dequantizing follows one rule on every device, the one bitsandbytes' CUDA kernel implements:
value = code[nibble] * absmax[flat element index // blocksize] in float32 (high nibble first),
where a double-quantized absmax is nested_code[byte] * nested_absmax[index // nested_blocksize]
+ offset, and the result is rounded to the state's dtype (bf16). On CUDA our Triton kernel
(`_triton_dequantize`) does it; elsewhere `dequantize_nf4` below, rather than bitsandbytes' CPU kernel,
because that kernel depends on the instruction set: its AVX-512 version indexes absmax per row
(row * (in_features // blocksize) + col // blocksize), which mis-scales every layer whose
in_features is not a multiple of the blocksize (the tiny golden model's 32-wide embeddings), so
the same checkpoint gave different weights on two CPUs. Every step is one IEEE float32 product or
sum and a round to bf16, so the result is the same bits on any CPU.

bitsandbytes is imported only to quantize (`quantize_weight`): importing it imports dynamo and
Inductor (2.3-3.5 s a process), which loading and running a checkpoint never need. The quant state is
read here (`read_quant_state`) as its `QuantState.from_dict` reads it, and the CUDA dequantize is ours.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from worldgen.errors import CheckpointError
from worldgen.kernels.fp8 import FP8, FP8_MAX, Fp8Weight, QuantizedRows, fp8_linear, quantize_rows, wants_fp8
from worldgen.kernels.int8 import INT8_MAX, Int8Weight, int8_linear, wants_int8
from worldgen.kernels.int8 import quantize_rows as int8_rows
from worldgen.kernels.quantized_weights import HELD, held
from worldgen.kernels.triton_lang import Signature, launch, tl, triton
from worldgen.quiet import hide_known_harmless

QUANT_SUFFIXES = (
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4",
)
TENSOR_FIELDS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
PACKED_KEY = "quant_state.bitsandbytes__nf4"  # the packed JSON of the other fields, as bitsandbytes names it
STATE_FIELDS = (*TENSOR_FIELDS, "quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype",
                "nested_offset")  # fmt: skip


def _bitsandbytes_functional():
    """bitsandbytes' functional API, imported on first use (module docstring)."""
    hide_known_harmless()  # before bitsandbytes logs its harmless CPU-kernel warning on import
    from bitsandbytes import functional

    return functional


@dataclasses.dataclass(frozen=True)
class NestedState:
    """The quantized block scales' own scales (bitsandbytes' `QuantState.state2`)."""

    absmax: torch.Tensor
    code: torch.Tensor
    blocksize: int
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class NF4State:
    """What dequantizing an NF4 weight reads: bitsandbytes' `QuantState` fields, by its names."""

    absmax: torch.Tensor
    code: torch.Tensor
    blocksize: int
    dtype: torch.dtype
    shape: torch.Size
    quant_type: str = "nf4"
    offset: torch.Tensor | None = None
    state2: NestedState | None = None

    @property
    def nested(self) -> bool:
        return self.state2 is not None


def read_quant_state(components: dict[str, torch.Tensor], name: str) -> NF4State:
    """`name.weight.*`'s tensors (keys without the `weight.` prefix) -> its state, read as bitsandbytes'
    `QuantState.from_dict` reads the packed JSON and the tensors beside it; CheckpointError when unreadable."""
    try:
        fields = dict(json.loads(bytes(components[PACKED_KEY].cpu().numpy()).decode("utf-8")))
        fields.update({k: v for k, v in components.items() if k in TENSOR_FIELDS})
        unknown = sorted(set(fields) - set(STATE_FIELDS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        device = components["weight"].device
        state2, offset = None, None
        if "nested_absmax" in fields:
            offset = torch.tensor(float(fields["nested_offset"])).to(device)
            state2 = NestedState(
                fields["nested_absmax"].to(device), fields["nested_quant_map"].to(device),
                int(fields["nested_blocksize"]), getattr(torch, fields["nested_dtype"]),
            )  # fmt: skip
        return NF4State(
            absmax=fields["absmax"].to(device), code=fields["quant_map"].to(device), blocksize=int(fields["blocksize"]),
            dtype=getattr(torch, fields["dtype"]), shape=torch.Size(fields["shape"]), quant_type=fields["quant_type"],
            offset=offset, state2=state2,
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # UnicodeDecodeError, JSONDecodeError: ValueError
        raise CheckpointError(f"{name}: unreadable NF4 quant state ({type(exc).__name__}: {exc})") from None


class NF4Linear(nn.Module):
    """A Linear whose weight is NF4 (double-quantized) as bitsandbytes stores it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = compute_dtype
        self.compute = "exact"  # or "fp8": see worldgen.kernels.fp8
        self.quant_type = "nf4"
        self.blocksize = 64
        self.weight_dtype = torch.bfloat16
        self.nested_blocksize = 256
        self.nested_dtype = torch.float32
        self.register_buffer("weight", torch.empty(0, dtype=torch.uint8))
        for name in (*TENSOR_FIELDS, "nested_offset"):
            self.register_buffer(name, torch.empty(0))
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def set_quant_state(self, components: dict[str, torch.Tensor], name: str) -> None:
        """Adopt the serialised components of `name.weight.*` (tensors already on their device)."""
        state = read_quant_state(components, name)
        if state.quant_type != "nf4" or tuple(state.shape) != (self.out_features, self.in_features):
            raise CheckpointError(
                f"{name}: quant state says {state.quant_type} {tuple(state.shape)}, the model expects "
                f"nf4 {(self.out_features, self.in_features)}; the checkpoint does not match its config.json"
            )
        self.weight = components["weight"]
        self.absmax, self.quant_map = state.absmax, state.code
        self.blocksize, self.weight_dtype = state.blocksize, state.dtype
        if state.nested:
            self.nested_absmax, self.nested_quant_map = state.state2.absmax, state.state2.code
            self.nested_blocksize, self.nested_dtype = state.state2.blocksize, state.state2.dtype
            self.nested_offset = state.offset.reshape(())
        else:
            empty = torch.empty(0, device=self.absmax.device)
            self.nested_absmax, self.nested_quant_map, self.nested_offset = empty, empty, empty

    def quant_state(self) -> NF4State:
        nested = self.nested_absmax.numel() > 0
        state2 = None
        if nested:
            state2 = NestedState(
                absmax=self.nested_absmax,
                code=self.nested_quant_map,
                blocksize=self.nested_blocksize,
                dtype=self.nested_dtype,
            )
        return NF4State(
            absmax=self.absmax,
            shape=torch.Size((self.out_features, self.in_features)),
            code=self.quant_map,
            blocksize=self.blocksize,
            quant_type=self.quant_type,
            dtype=self.weight_dtype,
            offset=self.nested_offset if nested else None,
            state2=state2,
        )

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        state = self.quant_state()
        weight = None
        if self.weight.is_cuda and state.nested and triton is not None and "nf4->bf16" not in _failed:
            try:
                weight = _triton_dequantize(self.weight, state)
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001  (no Triton / compiler: the same rule in PyTorch ops, said once)
                _failed.add("nf4->bf16")
                warnings.warn(f"the NF4 dequantize kernel failed ({exc}); dequantizing with PyTorch ops", stacklevel=2)
        if weight is None:
            weight = dequantize_nf4(self.weight, state)
        return weight.to(dtype or self.compute_dtype)

    def fp8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight as the FP8 GEMM takes it: e4m3 [N, K] and float32 [N, 1] per-output-channel scales.
        The one `hold` made, else made for this call: on CUDA straight from the NF4 bytes in one Triton kernel
        (`fp8_rows_from_nf4`); elsewhere (or a checkpoint without double quantization, or if that fails)
        dequantized to bf16 first and quantized row by row: the same numbers, more memory traffic."""
        made = held(self)
        if made is not None and made.kind == "fp8":
            return made.data, made.scale
        return self._rows("fp8") or quantize_rows(self.dequantized_weight(torch.bfloat16))

    def int8_weight(self) -> Int8Weight:
        """The weight as the INT8 GEMM takes it: the one `hold` made, else made for this call from the NF4 bytes
        as `fp8_weight` is (one Triton pass on CUDA, else dequantized to bf16 and quantized row by row:
        `int8.quantize_rows`' numbers either way). Held only where the plan has room (`hold`): the 14B's int8
        weights all held beside its NF4 ones (13 GiB more) ran a job planned for the NF4 bytes out of memory
        under `--vram-budget 24` (docs/benchmarks.md, "Session 31")."""
        made = held(self)
        if isinstance(made, Int8Weight):
            return made
        rows = self._rows("int8")
        return Int8Weight(*(rows or int8_rows(self.dequantized_weight(torch.bfloat16))))

    def hold(self, kind: str | None) -> int:
        """Keep `kind`'s ("fp8", "int8") 8-bit weight beside the NF4 bytes, so the GEMMs stop making it per call
        (one NF4 -> 8-bit pass a Linear and forward: 11.5 ms of a 14B Fast forward on an H200, docs/benchmarks.md,
        "Session 38"); None drops a held one. The same numbers either way. -> the bytes it holds now."""
        made = held(self)
        if kind is None or made is not None and made.kind != kind:
            setattr(self, HELD, None)
            made = None
        if kind is not None and made is None:
            weight = self.int8_weight() if kind == "int8" else Fp8Weight(*self.fp8_weight())
            setattr(self, HELD, weight)
            made = weight
        return 0 if made is None else made.data.nbytes + made.scale.nbytes

    def _rows(self, kind: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`kind`'s ("fp8", "int8") weight and per-row scales from the NF4 bytes by `_triton_rows`; None where
        that kernel does not apply (not CUDA, no double quantization, rows straddling blocks) or failed once."""
        fused_ok = self.weight.is_cuda and self.nested_absmax.numel() > 0 and self.in_features % self.blocksize == 0
        name = f"nf4->{kind}"
        if not fused_ok or triton is None or name in _failed:
            return None
        try:
            return _triton_rows(
                self.weight, self.absmax, self.nested_quant_map, self.nested_absmax, self.nested_offset,
                self.quant_map, (self.out_features, self.in_features), self.blocksize, self.nested_blocksize,
                int8=kind == "int8",
            )  # fmt: skip
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (no Triton / compiler: the two-step path, said once)
            _failed.add(name)
            warnings.warn(f"the fused NF4 -> {kind} weight kernel failed ({exc}); dequantizing first", stacklevel=3)
            return None

    def forward(self, x: torch.Tensor | QuantizedRows, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.compute_dtype
        if isinstance(x, QuantizedRows) or wants_fp8(x, self.compute, dtype, self.out_features):  # FP8 GEMM
            return fp8_linear(x, self.fp8_weight(), self.bias)
        if wants_int8(x, self.compute):  # int8 per output channel, made per call from the NF4 bytes
            return int8_linear(x, self, dtype, self.int8_weight())
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(x.to(dtype), self.dequantized_weight(dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4, compute={self.compute_dtype}"


def dequantize_nf4(packed: torch.Tensor, state: NF4State) -> torch.Tensor:
    """The NF4 weight in `state.dtype`, by the rule bitsandbytes' CUDA kernel follows (module docstring)."""
    absmax = _absmax_of(state)
    n = state.shape.numel()
    packed = packed.reshape(-1)
    nibbles = torch.stack((packed >> 4, packed & 0xF), dim=-1).reshape(-1)[:n]  # high nibble first
    values = state.code[nibbles.long()] * _per_element(absmax, state.blocksize, n)
    return values.reshape(state.shape).to(state.dtype)


def _absmax_of(state: NF4State) -> torch.Tensor:
    """The per-block absmax in float32, de-nested as bitsandbytes' CUDA kernel de-nests it."""
    absmax = state.absmax
    if state.nested:
        nested = state.state2
        absmax = nested.code[absmax.long()] * _per_element(nested.absmax, nested.blocksize, absmax.numel())
        absmax = absmax + state.offset
    return absmax.float()


def fp8_rows_from_nf4(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    nested_code: torch.Tensor,
    nested_absmax: torch.Tensor,
    offset: torch.Tensor,
    code: torch.Tensor,
    shape: tuple[int, int],
    blocksize: int,
    nested_blocksize: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A double-quantized NF4 weight -> (e4m3 [N, K], float32 [N, 1] scales): the numbers of
    `quantize_rows` on the bf16 weight `dequantize_nf4` gives (each value rounded to bf16 first, as
    there); on CUDA one Triton kernel (`_triton_rows`) reads the 4-bit bytes and writes the e4m3 ones. The
    two-step path wrote the bf16 weight (2 bytes a parameter) and read it back twice, for every Linear
    of every forward. Needs K to be a multiple of the blocksize (blocks then never straddle rows)."""
    out_features, in_features = shape
    blocks = in_features // blocksize
    nested = nested_absmax.repeat_interleave(nested_blocksize)[: absmax.numel()]
    scales = (nested_code[absmax.long()] * nested + offset).float().view(out_features, blocks, 1)
    packed = packed.reshape(out_features, blocks, blocksize // 2)
    nibbles = torch.stack((packed >> 4, packed & 0xF), dim=-1).reshape(out_features, blocks, blocksize)
    weight = (code[nibbles.long()] * scales).to(torch.bfloat16).float()
    scale = weight.abs().amax(dim=(1, 2)).clamp(min=1e-12).view(out_features, 1) / FP8_MAX
    q = (weight / scale.view(out_features, 1, 1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(out_features, in_features), scale


if triton is not None:  # (worldgen.kernels.triton_lang: CPU-only installs have none and never need it)

    @triton.jit  # n specialised on (divisibility by 16): the loads and stores are then vectorised
    def _nf4_dequantize_kernel(
        packed_ptr, absmax_ptr, nested_code_ptr, nested_absmax_ptr, offset_ptr, code_ptr, out_ptr, n_bytes, n,
        BLOCK_BYTES: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr, TILE: tl.constexpr,
    ):  # fmt: skip
        # the rule of the module docstring over the flat weight, TILE packed bytes a program: a byte's
        # block is its flat index over the blocksize (never per row), its absmax de-nested as a product
        # then the offset (two roundings: the launch turns FMA contraction off); both nibbles (high
        # first) -> code x absmax in float32 -> the output dtype, interleaved back into weight order
        c = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
        m = c < n_bytes
        byte = tl.load(packed_ptr + c, mask=m, other=0).to(tl.int32)
        blk = c // BLOCK_BYTES
        a = tl.load(absmax_ptr + blk, mask=m, other=0).to(tl.int32)
        block_absmax = tl.load(nested_code_ptr + a, mask=m, other=0) * tl.load(
            nested_absmax_ptr + blk // NESTED_BLOCKSIZE, mask=m, other=0
        )
        block_absmax = block_absmax + tl.load(offset_ptr)
        hi = tl.load(code_ptr + (byte >> 4)) * block_absmax
        lo = tl.load(code_ptr + (byte & 15)) * block_absmax
        out = tl.interleave(hi, lo).to(out_ptr.dtype.element_ty)
        oc = tl.program_id(0).to(tl.int64) * (2 * TILE) + tl.arange(0, 2 * TILE)
        tl.store(out_ptr + oc, out, mask=oc < n)

    @triton.jit
    def _nf4_rows_kernel(
        packed_ptr, absmax_ptr, nested_code_ptr, nested_absmax_ptr, offset_ptr, code_ptr, q_ptr, scale_ptr,
        in_features, row_bytes, blocks_per_row, q_max,
        BLOCK_BYTES: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr, ROW_BLOCKS: tl.constexpr, TILE_BLOCKS: tl.constexpr,
        ROW_TILES: tl.constexpr, INT8: tl.constexpr,
    ):  # fmt: skip
        # one program per output row: its block scales first (de-nested as bitsandbytes does: a product,
        # then the offset, two roundings: the launch turns FMA contraction off), the row's scale from
        # them (a block's largest weight is its absmax times NF4's code 1.0, so the row's largest bf16
        # weight is its largest bf16 absmax), then the row TILE_BLOCKS quantization blocks at a time,
        # each block's bytes beside its one absmax: both nibbles (high first) -> code x absmax -> bf16 ->
        # / scale -> e4m3, interleaved back into weight order. INT8: the scale and the quotients IEEE-divided
        # (`div_rn`, as `int8.quantize_rows` divides), each rounded half to even (the float32 magic number, as
        # `int8_triton` rounds) -> int8
        row = tl.program_id(0).to(tl.int64)
        offset = tl.load(offset_ptr)
        b = tl.arange(0, ROW_BLOCKS)
        flat = row * blocks_per_row + b
        bmask = b < blocks_per_row
        a = tl.load(absmax_ptr + flat, mask=bmask, other=0).to(tl.int32)
        am = tl.load(nested_code_ptr + a) * tl.load(nested_absmax_ptr + flat // NESTED_BLOCKSIZE, mask=bmask, other=0)
        am = tl.where(bmask, am + offset, 0.0)
        largest = tl.maximum(tl.max(tl.abs(am.to(tl.bfloat16).to(tl.float32)), axis=0), 1e-12)
        scale = tl.math.div_rn(largest, q_max) if INT8 else largest / q_max
        tl.store(scale_ptr + row, scale)
        for t in range(ROW_TILES):
            # (names not used before the loop: Triton refuses a loop variable that changes shape)
            blk = t * TILE_BLOCKS + tl.arange(0, TILE_BLOCKS)
            live = blk < blocks_per_row
            at = row * blocks_per_row + blk
            a_blk = tl.load(absmax_ptr + at, mask=live, other=0).to(tl.int32)
            block_absmax = tl.load(nested_code_ptr + a_blk) * tl.load(
                nested_absmax_ptr + at // NESTED_BLOCKSIZE, mask=live, other=0
            )
            block_absmax = (block_absmax + offset)[:, None]
            c = blk[:, None] * BLOCK_BYTES + tl.arange(0, BLOCK_BYTES)[None, :]
            byte = tl.load(packed_ptr + row * row_bytes + c, mask=live[:, None], other=0).to(tl.int32)
            hi = (tl.load(code_ptr + (byte >> 4)) * block_absmax).to(tl.bfloat16).to(tl.float32)
            lo = (tl.load(code_ptr + (byte & 15)) * block_absmax).to(tl.bfloat16).to(tl.float32)
            if INT8:
                hi = (tl.math.div_rn(hi, scale) + 12582912.0) - 12582912.0
                lo = (tl.math.div_rn(lo, scale) + 12582912.0) - 12582912.0
            else:
                hi = hi / scale
                lo = lo / scale
            hi = tl.minimum(tl.maximum(hi, -q_max), q_max)
            lo = tl.minimum(tl.maximum(lo, -q_max), q_max)
            out = tl.interleave(hi, lo).to(q_ptr.dtype.element_ty)
            oc = blk[:, None] * (2 * BLOCK_BYTES) + tl.arange(0, 2 * BLOCK_BYTES)[None, :]
            tl.store(q_ptr + row * in_features + oc, out, mask=live[:, None])


def _triton_dequantize(packed: torch.Tensor, state: NF4State) -> torch.Tensor:
    """`dequantize_nf4` of a double-quantized weight as one hand-written Triton kernel: the same bits (the
    rule is IEEE float32 products and sums, then one rounding) as bitsandbytes' CUDA kernel, which it
    replaces: no import (module docstring), and faster on the H100 (35 against 56 us at 5,120 x 5,120,
    66 against 94 us at 13,824 x 5,120; docs/benchmarks.md, "Session 12: Fast")."""
    n = state.shape.numel()
    out = torch.empty(state.shape, device=packed.device, dtype=state.dtype)
    n_bytes = (n + 1) // 2
    TILE = 1024  # packed bytes a program: 2,048 weights
    launch(
        _nf4_dequantize_kernel, (triton.cdiv(n_bytes, TILE),), packed, state.absmax, state.state2.code,
        state.state2.absmax, state.offset.reshape(1).float(), state.code, out, n_bytes, n,
        BLOCK_BYTES=state.blocksize // 2, NESTED_BLOCKSIZE=state.state2.blocksize, TILE=TILE, num_warps=4,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _triton_rows(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    nested_code: torch.Tensor,
    nested_absmax: torch.Tensor,
    offset: torch.Tensor,
    code: torch.Tensor,
    shape: tuple[int, int],
    blocksize: int,
    nested_blocksize: int,
    int8: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8_rows_from_nf4` (or, `int8`, `int8.quantize_rows` of the bf16 weight) as one hand-written Triton
    kernel: 0.5 byte read and 1 written a weight. (Inductor's compile of that function ran 8x slower on the H100:
    0.14 ms a Linear, 2.3 s a rollout.) 32 blocks a step and one warp a row: 25 / 66 / 66 us at 5,120 x 5,120 /
    13,824 x 5,120 / 5,120 x 13,824 against 28-32 / 74-84 / 65-74 for 1,024-byte steps of four warps
    (docs/benchmarks.md, "Session 14: Fast"; the same bytes)."""
    out_features, in_features = shape
    q = torch.empty(shape, device=packed.device, dtype=torch.int8 if int8 else FP8)
    scale = torch.empty((out_features, 1), device=packed.device, dtype=torch.float32)
    blocks = in_features // blocksize
    tile = 32  # quantization blocks a step: 2,048 weights at the blocksize of 64
    launch(
        _nf4_rows_kernel, (out_features,), packed, absmax, nested_code, nested_absmax, offset.reshape(1).float(), code, q, scale,
        in_features, in_features // 2, blocks, INT8_MAX if int8 else FP8_MAX,
        BLOCK_BYTES=blocksize // 2, NESTED_BLOCKSIZE=nested_blocksize, ROW_BLOCKS=triton.next_power_of_2(blocks),
        TILE_BLOCKS=tile, ROW_TILES=triton.cdiv(blocks, tile), INT8=int8, num_warps=1, enable_fp_fusion=False,
    )  # fmt: skip
    return q, scale


# The launches' variants (`triton_lang.Signature`): bitsandbytes' double-quantized state (uint8 absmax indices,
# float32 codes and scales) at its blocksizes (64, nested 256); dequantized to bf16 or float32; as e4m3 rows
# of a 5,120- and a 13,824-wide weight (the FP8 path: compute capability 8.9+), and as int8 rows (the INT8 path)
_NF4 = "*u8 *u8 *fp32 *fp32 *fp32 *fp32"
_NF4_CONST = {"BLOCK_BYTES": 32, "NESTED_BLOCKSIZE": 256}
_NF4_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}
_ROWS_OPTIONS = {"num_warps": 1, "enable_fp_fusion": False}
_WIDE_5120 = {"ROW_BLOCKS": 128, "TILE_BLOCKS": 32, "ROW_TILES": 3}  # rows of 5,120 weights: 80 blocks of 64
_WIDE_13824 = {"ROW_BLOCKS": 256, "TILE_BLOCKS": 32, "ROW_TILES": 7}  # 13,824: 216 blocks
SIGNATURES = {
    "_nf4_dequantize_kernel": (
        Signature(f"{_NF4} *bf16 i32 i32", {**_NF4_CONST, "TILE": 1024}, _NF4_OPTIONS),
        Signature(f"{_NF4} *fp32 i32 i32", {**_NF4_CONST, "TILE": 1024}, _NF4_OPTIONS),
    ),
    "_nf4_rows_kernel": (
        Signature(f"{_NF4} *fp8e4nv *fp32 i32 i32 i32 fp32", {**_NF4_CONST, **_WIDE_5120, "INT8": False}, _ROWS_OPTIONS),
        Signature(f"{_NF4} *fp8e4nv *fp32 i32 i32 i32 fp32", {**_NF4_CONST, **_WIDE_13824, "INT8": False}, _ROWS_OPTIONS),
        Signature(f"{_NF4} *i8 *fp32 i32 i32 i32 fp32", {**_NF4_CONST, **_WIDE_5120, "INT8": True}, _ROWS_OPTIONS),
        Signature(f"{_NF4} *i8 *fp32 i32 i32 i32 fp32", {**_NF4_CONST, **_WIDE_13824, "INT8": True}, _ROWS_OPTIONS),
    ),
}  # fmt: skip


_failed: set[str] = set()


def _per_element(scales: torch.Tensor, blocksize: int, n: int) -> torch.Tensor:
    """scales[i // blocksize] for every flat index i < n: one scale per block of the flattened tensor."""
    return scales.repeat_interleave(blocksize)[:n]


def quantize_weight(weight: torch.Tensor, blocksize: int = 64) -> dict[str, torch.Tensor]:
    """Dense weight -> the serialised NF4 components (`weight` plus `weight.*`), as bitsandbytes saves them."""
    packed, state = _bitsandbytes_functional().quantize_4bit(
        weight, blocksize=blocksize, compress_statistics=True, quant_type="nf4"
    )
    out = {"weight": packed}
    out.update({f"weight.{k}": v for k, v in state.as_dict(packed=True).items()})
    return out
