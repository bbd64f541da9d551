"""The Wan2.1 VAE's settings (a checkpoint folder's VAE `config.json` where it has one, else these defaults, the
released VAE's) and its latent normalisation: one home for every module that sizes or loads the VAE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worldgen.errors import CheckpointError
from worldgen.models.config_json import read_config

WAN21_MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
]  # fmt: skip
WAN21_STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
]  # fmt: skip


@dataclass(frozen=True)
class VAEConfig:
    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # reference spelling
    dropout: float = 0.0  # inference never applies dropout
    mean: tuple[float, ...] = tuple(WAN21_MEAN)
    std: tuple[float, ...] = tuple(WAN21_STD)

    @classmethod
    def from_json(cls, path: str | Path) -> VAEConfig:
        cfg = read_config(cls, path, "VAE")
        if len(cfg.mean) != cfg.z_dim or len(cfg.std) != cfg.z_dim:
            raise CheckpointError(f"VAE config {path}: mean and std need z_dim={cfg.z_dim} values each")
        return cfg


WAN21_VAE = VAEConfig()
