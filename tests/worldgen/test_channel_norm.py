"""The VAE's fused channel RMS norm + SiLU (`worldgen.kernels.channel_norm`): on CUDA the Triton kernel
against the eager ops it replaces; everywhere, a residual block computes what its layers one by one do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worldgen.kernels import channel_norm
from worldgen.models.vae import ResidualBlock


def _eager(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return F.silu(F.normalize(x, dim=1) * x.shape[1] ** 0.5 * gamma)


def test_a_residual_block_runs_its_layers_in_order_with_the_norm_and_silu_as_one_step():
    torch.manual_seed(0)
    block = ResidualBlock(8, 12).eval()
    for p in block.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(1, 8, 3, 5, 6)
    with torch.no_grad():
        got = block(x, {})
        h, cache = x, {}
        for layer in block.residual:  # the layers one at a time, as the module was written before
            h = layer(h, cache) if hasattr(layer, "time_pad") else layer(h)
        want = h + block.shortcut(x)
    assert torch.equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 384, 2, 9, 13), (1, 96, 3, 40, 37), (2, 20, 1, 5, 5)])
def test_the_kernel_matches_the_eager_norm_and_silu(dtype, shape, layout):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the kernel runs on CUDA)")
    g = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(*shape, generator=g, device="cuda") * 3).to(dtype)
    x[:, :, 0, 0, 0] = 0  # a position of zeros: the norm's eps clamp, 0 out
    x = x.contiguous(memory_format=layout)
    gamma = (1 + 0.2 * torch.randn(shape[1], 1, 1, 1, generator=g, device="cuda")).to(dtype)
    got, want = channel_norm.rms_norm_silu(x, gamma, shape[1] ** 0.5), _eager(x.contiguous(), gamma)
    assert "rms_norm_silu" not in channel_norm._failed
    assert got.dtype == dtype and got.shape == want.shape
    assert got.is_contiguous(memory_format=layout)  # the layout it was given
    assert got[:, :, 0, 0, 0].eq(0).all()
    diff = (got.float() - want.float()).abs()
    if dtype == torch.bfloat16:  # a rare element one bf16 step away (another sum order, another exp)
        assert (diff > 0).float().mean().item() < 1e-3
        assert diff.max().item() <= 2**-7 * want.float().abs().max().item()
    else:
        assert (diff.norm() / want.float().norm()).item() < 1e-6


def test_a_convolution_bias_left_to_the_norm_is_added_first():
    torch.manual_seed(1)
    x, bias = torch.randn(1, 6, 2, 3, 4), torch.randn(6)
    gamma = 1 + 0.2 * torch.randn(6, 1, 1, 1)
    got = channel_norm.rms_norm_silu(x, gamma, 6**0.5, bias=bias)
    assert torch.equal(got, _eager(x + bias.view(6, 1, 1, 1), gamma))
    assert not torch.equal(got, _eager(x, gamma))


@pytest.mark.cuda
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernels_add_a_convolution_bias_as_pytorch_does(dtype, layout):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the kernels run on CUDA)")
    from worldgen.kernels import conv_bias

    g = torch.Generator("cuda").manual_seed(0)
    shape = (1, 96, 3, 40, 37)
    x, h = (
        (torch.randn(*shape, generator=g, device="cuda") * 3).to(dtype).contiguous(memory_format=layout) for _ in "xh"
    )
    bias = torch.randn(96, generator=g, device="cuda").to(dtype)
    gamma = (1 + 0.2 * torch.randn(96, 1, 1, 1, generator=g, device="cuda")).to(dtype)
    biased = x + bias.view(96, 1, 1, 1)  # PyTorch's own add after a convolution
    assert torch.equal(
        channel_norm.rms_norm_silu(x, gamma, 96**0.5, bias=bias), channel_norm.rms_norm_silu(biased, gamma, 96**0.5)
    )
    assert "rms_norm_silu" not in channel_norm._failed
    summed = conv_bias.residual_add(x, bias, h)
    assert torch.equal(summed, biased + h) and summed.is_contiguous(memory_format=layout)
