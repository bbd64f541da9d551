"""Wan2.1 video VAE against the reference golden vectors (tiny config, CPU, float32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.worldgen.golden import golden_model
from tests.worldgen.numerics import rel_l2
from worldgen.errors import CheckpointError, InputError
from worldgen.models import vae as vae_module
from worldgen.models.vae import WanVAE, interleave_frame_pairs, layout_of, upsample_2x
from worldgen.models.vae_config import WAN21_VAE, VAEConfig


@pytest.fixture(scope="module")
def golden_vae(golden):
    return golden_model(golden / "vae", VAEConfig, WanVAE, "vae.pth")


@pytest.fixture(scope="module")
def encoded(golden_vae):
    vae, io = golden_vae
    return vae.encode(io["video"][None])


@pytest.fixture(scope="module")
def decoded(golden_vae):
    vae, io = golden_vae
    return vae.decode(io["latent"][None])


def test_encode_matches_reference(golden_vae, encoded):
    _, io = golden_vae
    assert encoded.shape == (1, 16, 3, 8, 12)
    assert encoded.dtype == torch.float32
    assert rel_l2(encoded[0], io["latent"]) < 1e-4


def test_decode_matches_reference(golden_vae, decoded):
    _, io = golden_vae
    assert decoded.shape == (1, 3, 9, 64, 96)
    assert decoded.min() >= -1.0 and decoded.max() <= 1.0
    assert rel_l2(decoded[0], io["decoded"]) < 1e-4


def test_encode_is_causal_across_chunks(golden_vae, encoded):
    """The caches make a prefix of the video encode to the same prefix of the latent."""
    vae, io = golden_vae
    first = vae.encode(io["video"][None, :, :1])
    first_two = vae.encode(io["video"][None, :, :5])
    assert torch.allclose(first, encoded[:, :, :1], rtol=0, atol=1e-5)
    assert torch.allclose(first_two, encoded[:, :, :2], rtol=0, atol=1e-5)


def test_decode_is_causal_across_chunks(golden_vae, decoded):
    vae, io = golden_vae
    prefix = vae.decode(io["latent"][None, :, :2])
    assert prefix.shape[2] == 5
    assert torch.allclose(prefix, decoded[:, :, :5], rtol=0, atol=1e-5)


def test_bf16_runs_and_stays_close(golden_vae):
    vae, io = golden_vae
    with torch.device("meta"):
        bf16 = WanVAE(vae.config)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in vae.state_dict().items()}, assign=True)
    latent = bf16.encode(io["video"][None])
    video = bf16.decode(io["latent"][None])
    assert torch.isfinite(latent).all() and torch.isfinite(video).all()
    # Measured on these weights: encode 7e-4, decode 4e-3 rel-L2 from the float32 reference.
    assert rel_l2(latent[0], io["latent"]) < 1e-2
    assert rel_l2(video[0], io["decoded"]) < 3e-2


def test_channels_last_gives_the_same_latent_and_video(golden_vae, encoded, decoded):
    """The layout the VAE runs in on CUDA, forced here on the CPU: the same numbers, float32 inputs and
    outputs in the contiguous layout, the convolution weights moved once."""
    vae, io = golden_vae
    with torch.device("meta"):
        channels_last = WanVAE(vae.config)
    channels_last.load_state_dict({k: v.clone() for k, v in vae.state_dict().items()}, assign=True)
    channels_last.channels_last = True
    latent = channels_last.encode(io["video"][None])
    video = channels_last.decode(io["latent"][None])
    assert channels_last.encoder.conv1.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert not vae.encoder.conv1.weight.is_contiguous(memory_format=torch.channels_last_3d)  # the CPU default
    assert latent.is_contiguous() and video.is_contiguous()
    assert rel_l2(latent, encoded) < 1e-5 and rel_l2(video, decoded) < 1e-5


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
def test_the_upsample_and_the_frame_pairs_keep_the_layout_and_the_values(layout):
    x = torch.randn(2, 6, 3, 4, 5).contiguous(memory_format=layout)
    assert layout_of(x) == layout
    up = upsample_2x(x)
    assert torch.equal(up, F.interpolate(x.contiguous(), scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact"))
    assert layout_of(up) == layout
    pairs = interleave_frame_pairs(x)
    want = x.contiguous().view(2, 2, 3, 3, 4, 5).permute(0, 2, 3, 1, 4, 5).reshape(2, 3, 6, 4, 5)
    assert torch.equal(pairs, want)
    assert layout_of(pairs) == layout


_UPSAMPLE_CHECKS = """
import torch
import torch.nn.functional as F
from worldgen.kernels import upsample
from worldgen.models.vae import layout_of, upsample_2x
for shape in [(1, 96, 3, 5, 7), (2, 20, 2, 3, 4), (1, 130, 1, 2, 3)]:
    x = torch.randn(*shape).contiguous(memory_format=torch.channels_last_3d)
    assert upsample.takes(x) and not upsample.takes(x.contiguous()), shape
    up = upsample_2x(x)
    want = F.interpolate(x.contiguous(), scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact")
    assert torch.equal(up, want) and layout_of(up) == torch.channels_last_3d, shape
print("interpreted upsample: ok")
"""


@pytest.mark.slow
def test_the_upsample_kernel_copies_the_source_pixels_under_the_interpreter():
    """`worldgen.kernels.upsample`, the channels-last copy on CUDA, run by Triton's interpreter on CPU tensors:
    every pixel of the output is its source pixel's channels (channel counts over and under a piece of 64)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_UPSAMPLE_CHECKS)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.cuda
def test_the_upsample_kernel_on_cuda_gives_pytorchs_upsampling():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the kernel runs on CUDA)")
    from worldgen.kernels import upsample

    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, 192, 4, 58, 104, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last_3d)
        assert upsample.takes(x)
        want = F.interpolate(x.contiguous(), scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact")
        up = upsample_2x(x)
        assert torch.equal(up, want) and layout_of(up) == torch.channels_last_3d


def test_bad_frame_count_is_an_input_error(golden_vae):
    vae, io = golden_vae
    with pytest.raises(InputError, match="F=8"):
        vae.encode(io["video"][None, :, :8])
    with pytest.raises(InputError, match="latent"):
        vae.decode(io["latent"][None, :8])


def test_real_config_builds_on_meta_with_reference_layout():
    with torch.device("meta"):
        vae = WanVAE(WAN21_VAE)
    state = vae.state_dict()
    assert state["encoder.conv1.weight"].shape == (96, 3, 3, 3, 3)
    assert state["encoder.downsamples.10.residual.6.weight"].shape == (384, 384, 3, 3, 3)
    assert state["decoder.upsamples.14.residual.6.weight"].shape == (96, 96, 3, 3, 3)
    assert state["decoder.upsamples.3.resample.1.weight"].shape == (192, 384, 3, 3)  # 3-D upsampler
    assert state["decoder.upsamples.3.time_conv.weight"].shape == (768, 384, 3, 1, 1)
    assert state["decoder.head.2.weight"].shape == (3, 96, 3, 3, 3)
    # The release file Wan2.1_VAE.pth is about 485 MB of float32.
    n_bytes = 4 * sum(p.numel() for p in vae.parameters())
    assert 480 < n_bytes / 2**20 < 490


def test_config_from_json_round_trip_and_errors(tmp_path, golden):
    cfg = VAEConfig.from_json(golden / "vae" / "config.json")
    assert cfg.mean == WAN21_VAE.mean and cfg.std == WAN21_VAE.std
    assert (cfg.dim, cfg.num_res_blocks, cfg.temperal_downsample) == (8, 1, (False, True, True))
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"dim": 8, "z_dim": 4}))
    with pytest.raises(CheckpointError, match="mean and std need z_dim=4"):
        VAEConfig.from_json(bad)


@pytest.mark.parametrize("timed", [True, False])
def test_only_a_timed_bf16_vae_on_cuda_lets_cudnn_time_its_algorithms(timed):
    from worldgen.models.vae import _conv_algorithms

    cases = [(torch.zeros(1, dtype=torch.bfloat16), False), (torch.zeros(1), False)]
    if torch.cuda.is_available():
        cases += [(torch.zeros(1, dtype=torch.bfloat16, device="cuda"), timed), (torch.zeros(1, device="cuda"), False)]
    before = torch.backends.cudnn.benchmark
    for weight, benchmark in cases:
        with _conv_algorithms(weight, timed):
            assert torch.backends.cudnn.benchmark is (before or benchmark)
        assert torch.backends.cudnn.benchmark is before


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_residual_blocks_leave_their_convolution_biases_to_the_next_kernel_for_the_same_bits(
    golden_vae, dtype, monkeypatch
):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the biases are left out of cuDNN's convolutions only on CUDA)")
    from worldgen.kernels import channel_norm

    vae, io = golden_vae
    with torch.device("meta"):
        on_gpu = WanVAE(vae.config)
    on_gpu.load_state_dict({k: v.to("cuda", dtype) for k, v in vae.state_dict().items()}, assign=True)
    with torch.no_grad():
        runs = {}
        for fold in (True, False):
            monkeypatch.setattr(vae_module, "FOLD_CONV_BIAS", fold)
            runs[fold] = on_gpu.encode(io["video"][None].cuda()), on_gpu.decode(io["latent"][None].cuda())
    assert not channel_norm._failed
    assert torch.equal(runs[True][0], runs[False][0]) and torch.equal(runs[True][1], runs[False][1])
    # near the reference (cuDNN's float32 convolutions run in TF32 by default: 2.7e-4 on the H100)
    assert rel_l2(runs[True][1][0].cpu(), io["decoded"]) < (3e-2 if dtype == torch.bfloat16 else 1e-3)


def test_three_time_taps_are_the_causal_convolution():
    """`_time_taps`, the float32 VAE's causal convolutions on CUDA, is conv3d over [past, x] written as three conv2d
    over its frames: the same sums in another order, here on the CPU where conv3d is the reference."""
    g = torch.Generator().manual_seed(5)
    for kernel, padding in ((3, 1), ((3, 1, 1), (1, 0, 0))):  # a residual block's conv, a temporal upsampler's
        conv = vae_module.CausalConv3d(6, 10, kernel, padding=padding)
        joined = torch.randn(1, 6, 2 + 5, 9, 11, generator=g).contiguous(memory_format=torch.channels_last_3d)
        want = F.conv3d(joined, conv.weight, conv.bias, padding=conv.padding)
        with torch.no_grad():
            got = vae_module._time_taps(joined, conv.weight, conv.bias, conv.padding[1:])
        assert got.shape == want.shape == (1, 10, 5, 9, 11)
        assert got.is_contiguous(memory_format=torch.channels_last_3d)  # the layout the next layer reads
        assert torch.allclose(got, want, rtol=0, atol=1e-5) and not torch.equal(got, torch.zeros_like(got))


@pytest.mark.cuda
def test_the_float32_decoder_on_cuda_takes_the_time_taps_and_stays_at_the_reference(golden_vae, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the time taps run on CUDA only)")
    vae, io = golden_vae
    with torch.device("meta"):
        on_gpu = WanVAE(vae.config)
    on_gpu.load_state_dict({k: v.to("cuda") for k, v in vae.state_dict().items()}, assign=True)
    calls = []
    real = vae_module._time_taps
    monkeypatch.setattr(vae_module, "_time_taps", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        decoded = on_gpu.decode(io["latent"][None].cuda())
    assert calls, "no causal convolution took the time taps"
    assert rel_l2(decoded[0].cpu(), io["decoded"]) < 1e-3  # TF32, as cuDNN's 3-D convolutions
