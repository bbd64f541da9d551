"""The DiT's settings (`config.json` of a checkpoint's DiT folder; the defaults are the 14B's): one home for every
module that sizes, plans or loads a DiT without building it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from worldgen.errors import CheckpointError
from worldgen.models.config_json import read_config


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    in_dim: int = 36
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    window_size: tuple[int, int] = (-1, -1)
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    # LingBot-World-Fast only (causal, KV-cached): the rolling-cache gate and the attention sink in
    # frames; the loop sets both per job (see worldgen.models.kv_cache), these are the config's defaults.
    local_attn_size: int = -1
    sink_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def from_json(cls, path: Path) -> DiTConfig:
        # the reference's WanModel keeps patch_size, cross_attn_norm, qk_norm, text_dim and window_size
        # out of config.json (diffusers' ignore_for_config) and always builds them from its defaults,
        # which are ours; the Fast DiT's local_attn_size / sink_size do not exist in base configs
        optional = {"patch_size", "text_dim", "window_size", "qk_norm", "cross_attn_norm", "eps", "model_type"}
        config = read_config(cls, path, "DiT", optional | {"local_attn_size", "sink_size"})
        if config.model_type != "i2v" or config.in_dim != 36:
            raise CheckpointError(
                f"{path}: expected an i2v model with in_dim 36, got {config.model_type} / {config.in_dim}"
            )
        if config.dim % config.num_heads or config.head_dim % 2:
            raise CheckpointError(f"{path}: dim {config.dim} does not split into {config.num_heads} heads")
        return config
