"""The error measure of the golden README: relative L2, |a - b| / |b|, in float32."""

import torch


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()
