"""umT5 text encoder (encoder only), numerically matching the Wan / LingBot-World reference.

Hand-written rather than taken from `transformers` because the engine streams the 5.7 B-parameter
encoder through a small GPU one block at a time, and because the reference numerics differ from the
stock T5 in details that matter for reproducing its outputs:

- attention logits are NOT scaled by 1/sqrt(head_dim);
- padding keys get `torch.finfo(dtype).min` added to their logits; softmax runs in float32;
- RMSNorm computes in float32 and casts back to the weight dtype only when that is bf16/fp16;
- relative positions use bidirectional buckets (max distance 128), one table per block for umT5;
- the feed-forward is gated: fc2(fc1(x) * gelu_tanh(gate(x))).

State-dict keys are those of the reference checkpoint (`models_t5_umt5-xxl-enc-bf16.pth`), so
`load_state_dict(torch.load(path, weights_only=True, mmap=True), assign=True)` works on a model
built on the meta device.

Running block by block (for streaming weights onto a small GPU)::

    x = encoder.embed(ids)                               # [B, L, dim]
    shared = encoder.shared_position_bias(ids.shape[1])  # None for umT5 (per-block tables)
    for block in encoder.blocks:                         # move block i to the GPU, run, evict
        x = block(x, mask, shared)
    hidden = encoder.final(x)

which is exactly what `UMT5Encoder.forward` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worldgen.models.config_json import read_config

RELATIVE_MAX_DISTANCE = 128


@dataclass(frozen=True)
class T5Config:
    """Constructor arguments of the encoder; field names follow the reference `config.json`."""

    vocab: int
    dim: int
    dim_attn: int
    dim_ffn: int
    num_heads: int
    num_layers: int
    num_buckets: int
    shared_pos: bool = False
    dropout: float = 0.0  # kept for config compatibility; inference never applies dropout

    @classmethod
    def from_json(cls, path: str | Path) -> T5Config:
        return read_config(cls, path, "umT5")


UMT5_XXL = T5Config(vocab=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64, num_layers=24, num_buckets=32)


class RMSNorm(nn.Module):
    """T5 LayerNorm: RMS only, weight only, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.type_as(self.weight)
        return self.weight * x


def relative_position_buckets(
    length: int, num_buckets: int, max_distance: int = RELATIVE_MAX_DISTANCE, device=None
) -> torch.Tensor:
    """Bidirectional T5 buckets [length, length] for key position j relative to query position i.

    Half the buckets are for keys after the query; within a half, the first half of the buckets
    are exact distances and the rest grow logarithmically up to `max_distance`.
    """
    rel_pos = torch.arange(length, device=device)[None, :] - torch.arange(length, device=device)[:, None]
    half = num_buckets // 2
    buckets = (rel_pos > 0).long() * half
    distance = rel_pos.abs()
    max_exact = half // 2
    # Clamp before the log only to avoid log(0); those entries take the exact branch below.
    far = distance.clamp(min=max_exact).float()
    far_bucket = (
        max_exact + (torch.log(far / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)).long()
    )
    far_bucket = far_bucket.clamp(max=half - 1)
    return buckets + torch.where(distance < max_exact, distance, far_bucket)


class RelativePositionBias(nn.Module):
    """Learned per-head bias for each relative-position bucket -> [1, heads, L, L]."""

    def __init__(self, num_buckets: int, num_heads: int):
        super().__init__()
        self.num_buckets = num_buckets
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, length: int) -> torch.Tensor:
        buckets = relative_position_buckets(length, self.num_buckets, device=self.embedding.weight.device)
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)


class T5Attention(nn.Module):
    def __init__(self, dim: int, dim_attn: int, num_heads: int):
        super().__init__()
        if dim_attn % num_heads:
            raise ValueError(f"dim_attn {dim_attn} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, pos_bias: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        heads = self.num_heads
        q = self.q(x).view(b, length, heads, -1).transpose(1, 2)  # [B, H, L, C]
        k = self.k(x).view(b, length, heads, -1).transpose(1, 2)
        v = self.v(x).view(b, length, heads, -1).transpose(1, 2)

        bias = pos_bias.to(x.dtype).expand(b, heads, length, length)
        if mask is not None:
            bias = bias.masked_fill(mask.view(b, 1, 1, length) == 0, torch.finfo(x.dtype).min)
        scores = torch.matmul(q, k.transpose(-1, -2)) + bias  # T5: no 1/sqrt(d) scaling
        del bias
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        del scores
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, length, -1)
        return self.o(out)


class GatedFeedForward(nn.Module):
    def __init__(self, dim: int, dim_ffn: int):
        super().__init__()
        # `gate.0` is the reference key (a Sequential of Linear and GELU there).
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False))
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * F.gelu(self.gate(x), approximate="tanh"))


def _fp16_clamp(x: torch.Tensor) -> torch.Tensor:
    """fp16 residuals can overflow; the reference clamps them (bf16/fp32 are left alone)."""
    if x.dtype == torch.float16 and torch.isinf(x).any():
        limit = torch.finfo(x.dtype).max - 1000
        x = x.clamp(-limit, limit)
    return x


class T5Block(nn.Module):
    """One encoder layer: pre-norm self-attention then pre-norm gated FFN, both residual."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim)
        self.attn = T5Attention(cfg.dim, cfg.dim_attn, cfg.num_heads)
        self.norm2 = RMSNorm(cfg.dim)
        self.ffn = GatedFeedForward(cfg.dim, cfg.dim_ffn)
        self.pos_embedding = None if cfg.shared_pos else RelativePositionBias(cfg.num_buckets, cfg.num_heads)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, pos_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [B, L, dim], mask [B, L] (0 = padding), pos_bias only for shared-position configs."""
        if self.pos_embedding is not None:
            pos_bias = self.pos_embedding(x.shape[1])
        elif pos_bias is None:
            raise ValueError("this block has no position table: pass encoder.shared_position_bias(L)")
        x = _fp16_clamp(x + self.attn(self.norm1(x), mask, pos_bias))
        return _fp16_clamp(x + self.ffn(self.norm2(x)))


class UMT5Encoder(nn.Module):
    """umT5 encoder: `forward(ids [B, L] int64, mask [B, L]) -> hidden [B, L, dim]`."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.config = cfg
        self.token_embedding = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos_embedding = RelativePositionBias(cfg.num_buckets, cfg.num_heads) if cfg.shared_pos else None
        self.blocks = nn.ModuleList(T5Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.dim)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.token_embedding(ids)

    def shared_position_bias(self, length: int) -> torch.Tensor | None:
        """Bias shared by all blocks, or None when every block has its own table (umT5)."""
        return None if self.pos_embedding is None else self.pos_embedding(length)

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        shared = self.shared_position_bias(ids.shape[1])
        for block in self.blocks:
            x = block(x, mask, shared)
        return self.final(x)


@torch.no_grad()
def encode_prompts(encoder: UMT5Encoder, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Encode a padded batch and cut each row to its true length -> list of [len_i, dim].

    Rows are copied so the padded batch tensor can be freed.
    """
    hidden = encoder(ids, mask)
    lengths = mask.gt(0).sum(dim=1).tolist()
    return [row[:n].clone() for row, n in zip(hidden, lengths, strict=True)]
