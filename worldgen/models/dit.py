"""The LingBot-World DiT: Wan2.2 I2V transformer plus LingBot's camera layers, in one file.

State-dict names are those of the released checkpoints (`blocks.12.self_attn.q.weight`, ...): the bf16 shards and the
community NF4 file load into it without renaming.

Numerics follow the reference (bf16 matmuls; LayerNorms, modulation, residual gating, time embedding and head in
float32) with three memory changes that give the same numbers:
- the timestep modulation is one row per sample, not one per token (t is the same for all tokens);
- RoPE is applied in float32 from a small cos/sin table computed in float64, not q and k cast to complex128;
- the feed-forward can run in token chunks (`ffn_chunk_tokens`): its 13824-wide hidden never exists for all tokens.
Linear layers are `Linear` (below) or `worldgen.kernels.nf4.NF4Linear`; both take the compute dtype from their weights
and can be told to compute in float32 where the reference does, or to run their GEMM in FP8 or INT8 (`set_compute`,
approximations: `worldgen.kernels.fp8`, `worldgen.kernels.int8`). The elementwise groups of a block (modulated norms,
RMSNorm+RoPE, gated residuals) are the functions of `worldgen.kernels.fused`: the code below on the CPU, one fused
kernel each on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from worldgen.kernels import fused, int8, quantized_weights
from worldgen.kernels.attention import attention, attention_rows, fp8_attention, fp8_attention_runs
from worldgen.kernels.fp8 import (
    Fp8Weight,
    QuantizedRows,
    QuantizedTensor,
    fp8_linear,
    gelu_then_quantize,
    quantize_input,
    quantize_tensor,
    takes_fp8,
    wants_fp8,
)
from worldgen.kernels.int8 import Int8Rows, int8_attention, int8_linear, shared_input, wants_int8
from worldgen.models.camera_cache import CameraCache
from worldgen.models.dit_config import DiTConfig
from worldgen.models.positions import rope_tables, sinusoidal_embedding

if TYPE_CHECKING:
    from worldgen.models.kv_cache import KVCache, LayerKV


class Linear(nn.Linear):
    """nn.Linear in its weight's dtype or `dtype`; under fp8 / int8 (`set_compute`) large calls are 8-bit GEMMs."""

    compute = "exact"

    def forward(self, x: torch.Tensor | QuantizedRows, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.weight.dtype
        if isinstance(x, QuantizedRows) or wants_fp8(x, self.compute, dtype, self.out_features):
            weight = Fp8Weight.of(self)
            return fp8_linear(x, (weight.data, weight.scale), self.bias)
        if wants_int8(x, self.compute):  # W8A8 (worldgen.kernels.int8)
            return int8_linear(x, self, dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        if quantized_weights.dropped(self):  # few rows once the bf16 weight is dropped: W8A16 (the 8-bit one)
            return F.linear(x.to(dtype), quantized_weights.held(self).dequantize(dtype), bias)
        return F.linear(x.to(dtype), self.weight.to(dtype), bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm_fused(x, self.weight, self.eps)


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the input and parameter dtypes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


def compute_dtype_of(linear: nn.Module) -> torch.dtype:
    """The dtype a Linear (bf16/float32 `Linear` or `NF4Linear`) computes in."""
    return getattr(linear, "compute_dtype", None) or linear.weight.dtype


class SelfAttention(nn.Module):
    sequence_parallel = None  # a sequence-parallel rank's (worldgen.models.sequence_parallel): q/k/v exchanged

    def __init__(self, dim: int, num_heads: int, eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.attention_backend = "sdpa"  # see worldgen.kernels.attention
        self.compute = "exact"  # or "fp8" (set_compute): FP8 self-attention where it can run
        self.q, self.k, self.v, self.o = (Linear(dim, dim) for _ in range(4))
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: LayerKV | None = None
    ) -> torch.Tensor:
        """Full attention over `x`; with `kv` (the causal model) the keys are those of the KV cache:
        the new (rotated) keys and values are written into it and the query attends to its window."""
        return self.attend(*self.project(x, rope), kv)

    def project(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rotated queries, the rotated keys and the values [B, L, n, d] of `x` (the part of `forward`
        whose shapes do not depend on the KV cache: `worldgen.models.block_graphs` replays it)."""
        b, s, _ = x.shape
        x = quantize_input(x, self.q)  # FP8 path: quantized once for q, k and v (else x as it is)
        k, v = self._keys_values(x, (b, s, self.num_heads, -1), rope)
        q = fused.rms_norm_rope(self.q(x), self.norm_q.weight, *rope, self.norm_q.eps, self.num_heads).to(v.dtype)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: LayerKV | None = None) -> torch.Tensor:
        """`project`'s output attended (through the KV cache's window with `kv`) and projected out."""
        return self.project_out(self.attention_output(q, k, v, kv))

    def takes_fp8_attention(self, q: torch.Tensor) -> bool:
        """Whether q goes to cuDNN's FP8 attention (worldgen.kernels.attention): `--compute fp8` where it runs."""
        return self.compute == "fp8" and fp8_attention_runs(q)

    def fp8_query(self, q: torch.Tensor) -> QuantizedTensor | None:
        """q as cuDNN's FP8 attention takes it (e4m3, one scale) where that kernel runs, else None."""
        return quantize_tensor(q) if self.takes_fp8_attention(q) else None

    def attention_output(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: LayerKV | None = None,
        q8: QuantizedTensor | None = None,
        out: torch.Tensor | None = None,
        heads_here: bool = False,
    ) -> torch.Tensor | QuantizedTensor:
        """The attention before its output projection (the only part of the block whose shapes depend on the KV
        cache's window): cuDNN's FP8 output (e4m3 [B, L, n, d] and its scale; `q8`: `fp8_query(q)` made ahead, `out`:
        where it goes) where that kernel runs, else [B, L, dim] in q's dtype. `heads_here`: a split's rank's heads."""
        if self.sequence_parallel is not None and not heads_here:
            return self.sequence_parallel.attention_output(self, q, k, v, kv)
        fp8 = self.takes_fp8_attention(q)
        if kv is not None:  # the causal model: attend to the cache's window (this chunk's keys included)
            k, v = kv.update(k, v, fp8_window=fp8)
        if self.compute == "int8":  # INT8 Q K^T, 16-bit P V (worldgen.kernels.int8)
            return int8_attention(q, k, v)
        if fp8:
            attended = fp8_attention(q, k, v, q8, out)
            if attended is not None:
                return attended
            k, v = (t.dequantize(q.dtype) if isinstance(t, QuantizedTensor) else t for t in (k, v))
        return attention(q, k, v, self.attention_backend)

    def project_out(self, attended: torch.Tensor | QuantizedTensor) -> torch.Tensor:
        """The output projection; cuDNN's FP8 output goes in as e4m3 rows, not converted."""
        return self.o(attention_rows(attended) if isinstance(attended, QuantizedTensor) else attended)

    def _keys_values(
        self, x: torch.Tensor | QuantizedRows, shape: tuple[int, ...], rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotated keys and the values [B, L, n, d] in the compute dtype (bf16 weights -> bf16)."""
        v = self.v(x).view(shape)
        # RMSNorm over the full width, then RoPE per head: one fused kernel on CUDA
        k = fused.rms_norm_rope(self.k(x), self.norm_k.weight, *rope, self.norm_k.eps, self.num_heads).to(v.dtype)
        return k, v

    def write_keys(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: LayerKV) -> None:
        """Only the KV cache's part of `forward`: this call's keys and values written, nothing attended."""
        b, s, _ = x.shape
        k, v = self._keys_values(quantize_input(x, self.q), (b, s, self.num_heads, -1), rope)
        if self.sequence_parallel is not None:
            return self.sequence_parallel.write_keys(kv, k, v)
        kv.write(k, v)


class CrossAttention(SelfAttention):
    def forward(self, x: torch.Tensor, context: torch.Tensor | None, kv: LayerKV | None = None) -> torch.Tensor:
        """Attention to the text; with `kv`, the text keys/values are computed once and then reused
        (one prompt per cache, as the causal reference does), so `context` may then be None."""
        b = x.shape[0]
        q = self.norm_q(self.q(x)).view(b, -1, self.num_heads, x.shape[-1] // self.num_heads)
        cached = None if kv is None else kv.cross
        if cached is None:
            k = self.norm_k(self.k(context)).view(b, -1, self.num_heads, q.shape[-1])
            v = self.v(context).view(b, -1, self.num_heads, q.shape[-1])
            if kv is not None:
                kv.cross = (k, v)
        else:
            k, v = cached
        return self.o(attention(q, k, v, self.attention_backend))


class Block(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        dim = cfg.dim
        self.norm1 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.eps)
        self.norm3 = LayerNorm(dim, cfg.eps, elementwise_affine=True) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.norm2 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.zeros(1, 6, dim))
        self.cam_injector_layer1 = Linear(dim, dim)
        self.cam_injector_layer2 = Linear(dim, dim)
        self.cam_scale_layer = Linear(dim, dim)
        self.cam_shift_layer = Linear(dim, dim)
        self.ffn_chunk_tokens: int | None = None

    @property
    def compute_dtype(self) -> torch.dtype:
        return compute_dtype_of(self.self_attn.o)

    def camera_modulation(self, cam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Camera tokens [1, L, dim] -> this block's (scale, shift): independent of the latent and t."""
        h = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(cam))) + cam
        h = quantize_input(h, self.cam_scale_layer)  # FP8 path: one quantization for scale and shift
        return self.cam_scale_layer(h), self.cam_shift_layer(h)

    def residual_norm(
        self,
        x: torch.Tensor,
        update: torch.Tensor | None,
        gate: torch.Tensor | None,
        cam: tuple[torch.Tensor, torch.Tensor] | None,
        norm: LayerNorm,
        modulation: tuple[torch.Tensor, torch.Tensor] | None,
        linear: nn.Module,
    ) -> tuple[torch.Tensor, torch.Tensor | QuantizedRows | Int8Rows]:
        """x + update * gate (no update: x), the camera's modulation, then `norm` of it [* (1 + scale) + shift,
        `modulation` = (shift, scale)] -> (the new x, `linear`'s input: 8-bit rows on the FP8 or INT8 path)."""
        shift, scale = modulation or (None, None)
        weight, bias = (norm.weight, norm.bias) if norm.elementwise_affine else (None, None)
        rows = "fp8" if takes_fp8(x, linear) else "int8" if wants_int8(x, getattr(linear, "compute", "exact")) else ""
        x, h = fused.residual_norm(x, update, gate, cam, shift, scale, weight, bias, norm.eps, self.compute_dtype, rows)
        rows_of = {"fp8": QuantizedRows.of, "int8": Int8Rows.of}.get(rows)  # rows the norm's kernel quantized (CUDA)
        return x, rows_of(*h) if isinstance(h, tuple) else shared_input(quantize_input(h, linear), linear)

    def _ffn(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self._ffn_of(
            x, self.residual_norm(x, None, None, None, self.norm2, (shift, scale), self.ffn[0])[1], gate
        )

    def _ffn_of(self, x: torch.Tensor, h: torch.Tensor | QuantizedRows, gate: torch.Tensor) -> torch.Tensor:
        """x + ffn(h) * gate, h the feed-forward's normed input."""
        hidden = self.ffn[0](h)
        if self.ffn[2].compute in ("fp8", "int8"):  # GELU and the 8-bit quantization of its output in one kernel
            quantize = int8.gelu_then_quantize if self.ffn[2].compute == "int8" else gelu_then_quantize
            return fused.gated_residual(x, self.ffn[2](quantize(hidden, self.ffn[2])), gate)
        return fused.gated_residual(x, self.ffn[2](self.ffn[1](hidden)), gate)

    def feed_forward(
        self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor
    ) -> torch.Tensor:
        """x + ffn(norm2(x)*(1+scale)+shift)*gate, in token chunks when `ffn_chunk_tokens` is set."""
        if not self._ffn_chunked(x):
            return self._ffn(x, shift, scale, gate)
        chunk = self.ffn_chunk_tokens
        out = torch.empty_like(x)
        for start in range(0, x.shape[1], chunk):
            out[:, start : start + chunk] = self._ffn(x[:, start : start + chunk], shift, scale, gate)
        return out

    def _ffn_chunked(self, x: torch.Tensor) -> bool:
        return bool(self.ffn_chunk_tokens) and self.ffn_chunk_tokens < x.shape[1]

    def modulations(self, e0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """m0..m5: [B, 1, dim] float32, one row per sample broadcast over tokens."""
        return (self.modulation.float() + e0).unsqueeze(2).unbind(1)

    def _self_attention_input(self, x: torch.Tensor, e0: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        """-> (`modulations(e0)`; norm1(x) * (1 + m1) + m0, rounded once to the compute dtype the Linears cast to)."""
        m = self.modulations(e0)
        return m, self.residual_norm(x, None, None, None, self.norm1, (m[0], m[1]), self.self_attn.q)[1]

    def attention_inputs(
        self, x: torch.Tensor, e0: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The self-attention's (q, k, v) of the residual stream `x`: `forward` up to the KV cache."""
        return self.self_attn.project(self._self_attention_input(x, e0)[1], rope)

    def write_keys(
        self, x: torch.Tensor, e0: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: LayerKV
    ) -> None:
        """Only what `forward` writes into the KV cache (a cache refresh's last block: its output is not read)."""
        self.self_attn.write_keys(self._self_attention_input(x, e0)[1], rope, kv)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor | None,
        cam: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
        kv: LayerKV | None = None,
    ) -> torch.Tensor:
        """`cam`: the camera tokens [1, L, dim], or this block's (scale, shift) already computed from
        them (`worldgen.models.camera_cache`), or None (no camera)."""
        m, h = self._self_attention_input(x, e0)
        return self.after_attention(x, m, self.self_attn(h, rope, kv), context, cam, kv)

    def after_attention(
        self,
        x: torch.Tensor,
        m: tuple[torch.Tensor, ...],
        attended: torch.Tensor,
        context: torch.Tensor | None,
        cam: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
        kv: LayerKV | None = None,
    ) -> torch.Tensor:
        """`forward` from the self-attention's output on: the residual, the camera, the text, the feed-forward."""
        if cam is not None and not isinstance(cam, tuple):
            cam = self.camera_modulation(cam)
        if isinstance(self.norm3, LayerNorm):  # the residual, the camera and norm3 in one pass
            x, h = self.residual_norm(x, attended, m[2], cam, self.norm3, None, self.cross_attn.q)
        else:
            x = fused.gated_residual(x, attended, m[2])
            h = x = x if cam is None else fused.camera_modulate(x, *cam)
        crossed = self.cross_attn(h, context, kv)
        if self._ffn_chunked(x):
            return self.feed_forward(fused.gated_residual(x, crossed, None), m[3], m[4], m[5])
        x, h = self.residual_norm(x, crossed, None, None, self.norm2, (m[3], m[4]), self.ffn[0])
        return self._ffn_of(x, h, m[5])


class Head(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.norm = LayerNorm(cfg.dim, cfg.eps, elementwise_affine=False)
        self.head = Linear(cfg.dim, math.prod(cfg.patch_size) * cfg.out_dim)
        self.modulation = nn.Parameter(torch.zeros(1, 2, cfg.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.float() + e.unsqueeze(1)).unsqueeze(2).unbind(1)
        return self.head(self.norm(x) * (1 + scale) + shift, dtype=torch.float32)


class WanCameraDiT(nn.Module):
    """One expert, or the causal Fast model. `forward(x, t, context, y, cam)`; all per-sample tensors
    batched on dim 0. With `cache` (a `worldgen.models.kv_cache.KVCache`) `x` is one chunk of frames starting
    at token `current_start` of the video, attending causally to the cached earlier chunks."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"), Linear(dim, dim))
        self.time_embedding = nn.Sequential(Linear(cfg.freq_dim, dim), nn.SiLU(), Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), Linear(dim, 6 * dim))
        cam_channels = 6 * 64 * math.prod(cfg.patch_size)  # 384 Plücker channels per 1x2x2 patch
        self.patch_embedding_wancamctrl = Linear(cam_channels, dim)
        self.c2ws_hidden_states_layer1 = Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)

    camera_cache: CameraCache | None = None  # attached from outside (the pipeline's memory plan)
    # a job's time conditioning per timestep tensor (attached by a pipeline whose forwards reuse a few
    # timestep tensors; keyed by identity, as the camera cache is): the time projection dequantizes a
    # 600 MiB float32 weight for one row, the DiT loop's largest transient allocation, and at a 24 GiB
    # card's cap it failed in fragmented memory (docs/benchmarks.md, "Session 19: Fast")
    time_cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    # with a KV cache, the blocks run through this (`worldgen.models.block_graphs.BlockGraphs`, attached by
    # the Fast pipeline): CUDA graphs between the self-attentions; None: `run_blocks`, eagerly
    block_graphs: Callable[..., torch.Tensor | None] | None = None
    # a rank of a sequence-parallel job (`worldgen.models.sequence_parallel.SequenceParallel.attach`): each
    # forward works on its slice of the tokens; None (one device): nothing of it runs
    sequence_parallel = None

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def set_attention_backend(self, backend: str) -> None:
        """'sdpa', 'flash' or 'sage' (resolve 'auto' with `worldgen.kernels.attention.resolve_backend`)."""
        for module in self.modules():
            if isinstance(module, SelfAttention):
                module.attention_backend = backend

    def set_compute(self, compute: str) -> None:
        """'exact' (the reference's; 'bf16' is its old name), 'fp8' or 'int8' (worldgen.kernels.fp8, .int8)."""
        from contracts.engine_options import COMPUTES, canonical_compute

        compute = canonical_compute(compute)
        if compute not in COMPUTES:
            raise ValueError(f"compute must be one of {COMPUTES}, got {compute!r}")
        if self.camera_cache is not None and self.blocks and self.blocks[0].self_attn.compute != compute:
            self.camera_cache.clear()  # its modulations were computed the other way
        # another compute's 8-bit weights freed, the exact weights they replaced back (worldgen.kernels.quantized_weights)
        quantized_weights.restore_exact_weights(self, keep=compute)
        for module in self.modules():
            if hasattr(module, "compute") and module is not self:
                module.compute = compute

    def set_ffn_chunk_tokens(self, tokens: int | None) -> None:
        for block in self.blocks:
            block.ffn_chunk_tokens = tokens

    def embed_text(self, context: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """[B, Lc, text_dim] (or a list of [Lc_i, text_dim]) -> zero-padded to text_len, embedded."""
        rows = list(context) if isinstance(context, (list, tuple)) else list(context.unbind(0))
        padded = torch.stack([F.pad(c, (0, 0, 0, self.cfg.text_len - c.shape[0])) for c in rows])
        return self.text_embedding[2](self.text_embedding[1](self.text_embedding[0](padded)))

    def embed_camera(self, plucker: torch.Tensor) -> torch.Tensor:
        """[B, 384, F, H, W] Plücker -> [B, L, dim] camera tokens (channel order c, then patch axes)."""
        b, c, f, h, w = plucker.shape
        pf, ph, pw = self.cfg.patch_size
        folded = plucker.view(b, c, f // pf, pf, h // ph, ph, w // pw, pw)
        folded = folded.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (f // pf) * (h // ph) * (w // pw), -1)
        cam = self.patch_embedding_wancamctrl(folded)
        return cam + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(cam)))

    def camera_inputs(self, cam: torch.Tensor | None, dtype: torch.dtype) -> list:
        """Each block's camera input: None (no camera), the camera tokens, or its (scale, shift) read
        from the attached `camera_cache` (`worldgen.models.camera_cache`). A sequence-parallel rank's
        are its rows of the tokens (the blocks' camera layers split with them)."""
        if cam is None:
            return [None] * len(self.blocks)
        shard = self.sequence_parallel.shard if self.sequence_parallel is not None else lambda tokens: tokens
        embed = lambda c: shard(self.embed_camera(c[:1].to(dtype)))  # noqa: E731
        if self.camera_cache is None:
            return [embed(cam)] * len(self.blocks)
        return self.camera_cache.block_inputs(cam, self.blocks, embed)

    def grid(self, x: torch.Tensor) -> tuple[int, int, int]:
        """The token grid (frames, rows, columns) of a latent [B, C, F, H, W]."""
        pf, ph, pw = self.cfg.patch_size
        return x.shape[2] // pf, x.shape[3] // ph, x.shape[4] // pw

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        context: torch.Tensor | list[torch.Tensor],
        y: torch.Tensor,
        cam: torch.Tensor | None = None,
        cache: KVCache | None = None,
        current_start: int = 0,
    ) -> torch.Tensor:
        """x [B,16,F,H,W] noisy latent, t [B] timesteps, y [B,20,F,H,W] condition -> [B,16,F,H,W] float32.

        `context` is text embeddings (not yet zero-padded); `cam` the Plücker tensor or None.
        `cache`/`current_start`: the causal model's KV cache and the chunk's first token (see above).
        """
        f, h, w = self.grid(x)
        start_frame = 0
        if cache is not None:
            start_frame = current_start // (h * w)
            cache.begin(current_start, f * h * w)
        rope = rope_tables(self.cfg.head_dim, (f, h, w), x.device, start_frame)
        out = self.forward_tokens(x, t, context, y, cam, cache, rope)
        if cache is not None:
            cache.commit()
        return out

    def time_conditioning(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Timesteps [B] -> (e [B, dim], e0 [B, 6, dim]), float32: the head's and the blocks' modulation inputs."""
        e = self.time_embedding[2](
            self.time_embedding[1](self.time_embedding[0](sinusoidal_embedding(self.cfg.freq_dim, t), torch.float32)),
            torch.float32,
        )
        return e, self.time_projection[1](self.time_projection[0](e), torch.float32).view(t.shape[0], 6, self.cfg.dim)

    def forward_tokens(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        context: torch.Tensor | list[torch.Tensor] | None,
        y: torch.Tensor,
        cam: torch.Tensor | None,
        cache: KVCache | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        keys_only: bool = False,
    ) -> torch.Tensor | None:
        """`forward` once its RoPE tables are made and the cache has begun this call (`KVCache.begin`):
        device work only, no host decisions that change between calls of the same shape and cache
        step, so a chunk's forward can be captured as a CUDA graph (`worldgen.models.chunk_graph`).
        `keys_only` (a cache refresh, whose output nobody reads): the last block only writes its keys
        and values, and None comes back (the same cache, 1/40 of the refresh's work less)."""
        if keys_only and cache is None:
            raise ValueError("keys_only writes a KV cache: give one")
        sp = self.sequence_parallel
        if sp is not None:  # a leader hands the call to its peers first: they run it beside it
            sp.before_forward(self, x, t, context, y, cam, cache, rope, keys_only)
        cfg = self.cfg
        dtype = self.compute_dtype
        inp = torch.cat([x, y], dim=1).to(dtype)
        tokens = self.patch_embedding(inp)
        b, _, f, h, w = tokens.shape
        # [B, L, dim], the residual stream in float32, laid out token after token: the hand-written fused
        # kernels take rows (`worldgen.kernels.fused_triton`; a transposed stream went to torch.compile)
        tokens = tokens.flatten(2).transpose(1, 2).contiguous().float()

        held = None if self.time_cache is None else self.time_cache.get(id(t))
        if held is not None and held[0] is t:
            e, e0 = held[1:]
        else:
            e, e0 = self.time_conditioning(t)
            if self.time_cache is not None:  # t is kept with them: its id is not reused while they are held
                self.time_cache[id(t)] = (t, e, e0)

        if sp is not None:  # this rank's rows of the tokens (and of their RoPE tables) from here to the head
            tokens, rope = sp.begin(tokens, rope)
        # with a cache the text keys/values are computed on its first call only: no need to embed again
        text = None if cache is not None and cache.has_text else self.embed_text(context)
        # camera tokens are the same for every sample of the batch: [1, L, dim], broadcast in the blocks;
        # with a camera cache, each covered block's modulation of this camera is computed once (first forward)
        cams = self.camera_inputs(cam, dtype)
        if self.block_graphs is not None and cache is not None:
            tokens = self.block_graphs(self, tokens, e0, rope, text, cams, cache, keys_only)
        else:
            tokens = self.run_blocks(tokens, e0, rope, text, cams, cache, keys_only)
        if tokens is None:  # keys_only: the cache has them
            return None
        out = self.head(tokens, e)
        if sp is not None:  # the head's few channels of every rank's rows
            out = sp.gather(out)
        return unpatchify(out, (f, h, w), cfg.patch_size, cfg.out_dim)

    def run_blocks(
        self,
        tokens: torch.Tensor,
        e0: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        text: torch.Tensor | None,
        cams: list,
        cache: KVCache | None,
        keys_only: bool = False,
        start: int = 0,
    ) -> torch.Tensor | None:
        """The blocks from `start` over the residual stream, eagerly (None with `keys_only`: the last block
        only wrote its keys)."""
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks[start:], start):
            if keys_only and i == last:
                block.write_keys(tokens, e0, rope, cache.layers[i])
                return None
            tokens = block(tokens, e0, rope, text, cams[i], None if cache is None else cache.layers[i])
        return tokens


def unpatchify(x: torch.Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int], channels: int) -> torch.Tensor:
    """[B, L, p*q*r*C] -> [B, C, F*p, H*q, W*r] (patch axes interleaved back)."""
    (f, h, w), (p, q, r) = grid, patch
    x = x.view(x.shape[0], f, h, w, p, q, r, channels)
    return x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(x.shape[0], channels, f * p, h * q, w * r)
