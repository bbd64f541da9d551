"""Memory and loading: memory plans, residency, CUDA caps, metering, streamed loads, checkpoints, the tiny model, quantization."""
