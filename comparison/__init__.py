"""comparison: sim render vs world-model rollout, side by side, with image and camera metrics."""
