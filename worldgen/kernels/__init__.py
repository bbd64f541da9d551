"""Kernels and numerics: attention backends, FP8 GEMMs and attention, fused elementwise groups, NF4 dequantization. Imports no model, runtime or pipeline."""
