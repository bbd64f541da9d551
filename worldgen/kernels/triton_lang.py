"""Triton where this install has it: CUDA builds of PyTorch ship it; CPU-only installs have none and never
need it. The one import guard of the hand-written kernels (`fp8`, `nf4` through it, `fused_triton`)."""

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None

__all__ = ["tl", "triton"]
