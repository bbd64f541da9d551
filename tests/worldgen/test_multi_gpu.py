"""One rollout over two devices (`--gpus`), the FP8 path's refusals and arithmetic, on the CPU.

The two-device logic (second device's own experts, its thread, the per-step hand-over) runs for real
with two CPU "devices": the output must equal the one-device path's exactly. CUDA-only parts (the
fused kernels, the FP8 GEMMs' speed) are measured by bench/bench_speed.py and bench/cuda_parity.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contracts.settings import load_settings
from worldgen.errors import InputError
from worldgen.fp8 import fp8_linear, unsupported_reason
from worldgen.multi_gpu import devices_for_gpus, parse_gpus
from worldgen.pipeline import load_pipeline


def _rollout(pipe, example):
    settings = load_settings(preset="tiny").replace(steps=3, frame_num=9)
    poses = np.load(example / "poses.npy")
    intrinsics = np.load(example / "intrinsics.npy")
    return pipe.generate(example / "image.jpg", "a room", poses, intrinsics, settings)


@pytest.mark.slow
def test_two_devices_give_the_one_device_output(lingbot_examples, tmp_path):
    one = load_pipeline("tiny", device="cpu", text_cache_dir=tmp_path)
    two = load_pipeline("tiny", devices=["cpu", "cpu"], text_cache_dir=tmp_path)
    expected = _rollout(one, lingbot_examples / "00")
    got = _rollout(two, lingbot_examples / "00")
    assert torch.equal(got, expected)
    second = two.second_device
    assert second is not None and second.experts["high"].loads == 1  # the unconditional passes ran there
    assert one.second_device is None


def test_gpus_flag_is_parsed_and_refused_without_cuda():
    assert parse_gpus("0,1") == [0, 1] and parse_gpus(None) is None
    for bad in ("0,0", "a,b", "-1", "0,1,2"):
        with pytest.raises(InputError, match="--gpus"):
            parse_gpus(bad)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for CPU-only machines")
    with pytest.raises(InputError, match="no CUDA GPU"):
        devices_for_gpus("0,1")
    with pytest.raises(InputError, match="no CUDA GPU"):  # what a server's `gpus` sends a worker
        load_pipeline("tiny", devices=["cuda:0", "cuda:1"])


def test_fp8_is_refused_on_the_cpu_with_what_to_use_instead():
    reason = unsupported_reason("cpu")
    assert "FP8 tensor cores" in reason and "--compute exact" in reason
    with pytest.raises(InputError, match="FP8 tensor cores"):
        load_pipeline("tiny", device="cpu", compute="fp8")
    with pytest.raises(InputError, match="compute 'int4' is unknown"):
        load_pipeline("tiny", device="cpu", compute="int4")


def test_fp8_linear_is_a_close_approximation():
    """Per-token and per-channel scales keep one GEMM within e4m3's few percent, bias included."""
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("no torch._scaled_mm")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 256, generator=gen) * torch.logspace(-2, 2, 300)[:, None]  # rows of very different sizes
    w = (torch.randn(128, 256, generator=gen) * 0.02).bfloat16()
    bias = torch.randn(128, generator=gen) * 0.1
    try:
        out = fp8_linear(x, w, bias)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"this PyTorch has no FP8 GEMM on the CPU ({exc})")
    ref = x @ w.float().T + bias
    err = ((out.float() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    assert out.dtype == torch.bfloat16 and out.shape == (300, 128)
    assert 0 < err < 0.08  # approximate (never exact), but every row within a few percent
