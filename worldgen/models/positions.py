"""Where a token sits, as the DiT encodes it: the timestep's sinusoidal embedding and the 3-D (frame,
row, column) rotary tables, both computed in float64 as the reference computes them."""

from __future__ import annotations

import torch


def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """[B] timesteps -> [B, dim] float32; positions and frequencies in float64 as the reference."""
    half = dim // 2
    position = t.to(torch.float64)
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=t.device).div(half))
    angles = torch.outer(position, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1).float()


def rope_tables(
    head_dim: int, grid: tuple[int, int, int], device: torch.device, start_frame: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [L, head_dim/2] for the 3-D (frame, row, column) rotary embedding.

    head_dim/2 rotary pairs split into (c - 2(c//3), c//3, c//3) for c = head_dim/2, each group with
    angle = position / 10000^(2k/group_dim); computed in float64, stored in float32. Frame positions
    start at `start_frame` (a later chunk of the causal model), rows and columns at 0.
    """
    pairs = head_dim // 2
    splits = (pairs - 2 * (pairs // 3), pairs // 3, pairs // 3)
    f, h, w = grid
    parts = []
    for n_pairs, size, axis in zip(splits, (f, h, w), range(3), strict=True):
        group_dim = 2 * n_pairs if axis else head_dim - 4 * (head_dim // 6)
        inv = 1.0 / torch.pow(10000, torch.arange(0, group_dim, 2, dtype=torch.float64, device=device) / group_dim)
        first = start_frame if axis == 0 else 0
        positions = torch.arange(first, first + size, dtype=torch.float64, device=device)
        angles = torch.outer(positions, inv)
        shape = [1, 1, 1, n_pairs]
        shape[axis] = size
        parts.append(angles.view(shape).expand(f, h, w, n_pairs))
    angles = torch.cat(parts, dim=-1).reshape(f * h * w, pairs)
    return torch.cos(angles).float(), torch.sin(angles).float()
