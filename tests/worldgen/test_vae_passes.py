"""Two passes fewer over the VAE's activations, the same bits (worldgen.models.vae): a norm writes straight into the
next causal convolution's [past | new frames] input (`JOIN_IN_PLACE`: no `torch.cat`), and a residual block's
convolutions hand their three time taps to the kernel reading them, which sums them as it reads
(`SUM_TAPS_IN_READER`: no `+=` passes). On the CPU here with the CUDA path's layout (channels-last), its time taps
and its folded biases (the kernels' eager forms); the Triton kernels themselves under Triton's interpreter; the
golden VAE on a GPU."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from tests.worldgen.numerics import rel_l2
from worldgen.kernels import channel_norm, conv_bias
from worldgen.models import vae as vae_module
from worldgen.models.vae import WanVAE
from worldgen.models.vae_config import WAN21_VAE

ROOT = Path(__file__).resolve().parents[2]


def _tiny_vae(device: str = "cpu") -> WanVAE:
    torch.manual_seed(0)
    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8, num_res_blocks=1)).eval().to(device)
    for p in vae.parameters():  # not the init's near-zero biases: a misplaced bias shows
        p.data.normal_(0, 0.2)
    vae.channels_last = True  # the CUDA path's layout, on any device
    return vae


def _stream(vae: WanVAE, video: torch.Tensor, latent: torch.Tensor) -> list[torch.Tensor]:
    """Encode and decode chunk by chunk (frame 0 alone, then more): every cache grows from nothing to its 2 frames."""
    with torch.no_grad():
        cache: dict = {}
        out = [vae.encode_chunk(video[:, :, :1], cache), vae.encode_chunk(video[:, :, 1:5], cache)]
        out.append(vae.encode_chunk(video[:, :, 5:9], cache))
        cache = {}
        out += [vae.decode_chunk(latent[:, :, t : t + 1], cache) for t in range(latent.shape[2])]
    return out


def _both_ways(vae: WanVAE, monkeypatch, video, latent) -> tuple[list, list, dict]:
    calls = {"join_buffer": 0, "parts": 0}
    join_buffer, rms_norm_silu = vae_module.CausalConv3d.join_buffer, channel_norm.rms_norm_silu

    def counted_join(*args, **kwargs):
        calls["join_buffer"] += 1
        return join_buffer(*args, **kwargs)

    def counted_norm(x, *args, **kwargs):
        calls["parts"] += not isinstance(x, torch.Tensor)
        return rms_norm_silu(x, *args, **kwargs)

    monkeypatch.setattr(vae_module.CausalConv3d, "join_buffer", counted_join)
    monkeypatch.setattr(channel_norm, "rms_norm_silu", counted_norm)
    runs = {}
    for new in (True, False):
        monkeypatch.setattr(vae_module, "JOIN_IN_PLACE", new)
        monkeypatch.setattr(vae_module, "SUM_TAPS_IN_READER", new)
        runs[new] = _stream(vae, video, latent)
    return runs[True], runs[False], calls


def test_the_norm_into_the_convolutions_input_and_the_taps_summed_by_their_reader_give_the_same_bits(monkeypatch):
    monkeypatch.setattr(vae_module, "TIME_TAPS_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(conv_bias, "folds", lambda x: True)  # a residual block's CUDA path: biases to the readers
    vae = _tiny_vae()
    g = torch.Generator().manual_seed(1)
    video = torch.rand(1, 3, 9, 32, 48, generator=g) * 2 - 1
    latent = torch.randn(1, 16, 3, 4, 6, generator=g)
    new, old, calls = _both_ways(vae, monkeypatch, video, latent)
    assert calls["join_buffer"] > 0 and calls["parts"] > 0  # both ways were taken
    assert len(new) == len(old) == 6
    for a, b in zip(new, old, strict=True):
        assert torch.equal(a, b) and a.abs().sum() > 0


def test_a_join_without_folded_biases_gives_the_same_bits(monkeypatch):
    """The join alone (the residual blocks' path where their convolutions keep their biases: no Triton): the
    convolutions see the same [past | new] input. (The CPU's conv3d returns contiguous tensors: the taps keep the
    activations channels-last, as cuDNN does.)"""
    monkeypatch.setattr(vae_module, "TIME_TAPS_DEVICES", {"cpu", "cuda"})
    vae = _tiny_vae()
    g = torch.Generator().manual_seed(2)
    video = torch.rand(1, 3, 9, 32, 48, generator=g) * 2 - 1
    latent = torch.randn(1, 16, 3, 4, 6, generator=g)
    new, old, calls = _both_ways(vae, monkeypatch, video, latent)
    assert calls["join_buffer"] > 0 and calls["parts"] == 0
    assert all(torch.equal(a, b) for a, b in zip(new, old, strict=True))


def test_a_join_buffer_holds_the_cached_past_then_zeros_for_what_it_lacks():
    conv = vae_module.CausalConv3d(4, 4, 3, padding=1)
    x = torch.randn(1, 4, 3, 5, 6).contiguous(memory_format=torch.channels_last_3d)
    past = torch.randn(1, 4, 1, 5, 6)
    joined, slot = conv.join_buffer(x, {conv: past})
    assert joined.shape == (1, 4, 5, 5, 6) and joined.is_contiguous(memory_format=torch.channels_last_3d)
    assert slot.shape == x.shape and slot.is_contiguous(memory_format=torch.channels_last_3d)
    assert joined[:, :, 0].eq(0).all() and torch.equal(joined[:, :, 1:2], past)
    slot.copy_(x)
    assert torch.equal(joined[:, :, 2:], x)
    assert conv.join_buffer(x, {})[0][:, :, :2].eq(0).all()


class _LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by the tensors made while it is on: each storage counted once, from the op that
    made it until its last tensor is gone. `kernel` wraps an eager stand-in for a fused GPU kernel so that only its
    output counts (on a GPU the Triton kernel makes no temporaries)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list[int]] = {}
        self.now = self.peak = 0

    def _gone(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def hold(self, out):
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self.live:
                    self.live[key] = [storage.nbytes(), 0]
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                self.live[key][1] += 1
                weakref.finalize(t, self._gone, key)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.hold(func(*args, **(kwargs or {})))

    def kernel(self, fn):
        def run(*args, **kwargs):
            with _disable_current_modes():
                out = fn(*args, **kwargs)
            return self.hold(out)

        return run


def test_the_fewer_passes_hold_no_more_at_a_push_peak(monkeypatch):
    """A push's peak, counted by the tensors alive at once (the fused kernels as kernels: their outputs only), is no
    higher with the norm written into the joined input and the taps summed by their reader. On the H200 a first
    version held the first convolution's joined input beside the three taps and the next joined input: +14.5% an
    encode push, +8.5% a decode push (docs/benchmarks.md, "Session 33"); this counts the encoder's +12%."""
    monkeypatch.setattr(vae_module, "TIME_TAPS_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(conv_bias, "folds", lambda x: True)
    torch.manual_seed(0)
    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8)).eval()  # the real depth, 8 channels
    vae.channels_last = True
    g = torch.Generator().manual_seed(3)
    latent, video = torch.randn(1, 16, 3, 8, 12, generator=g), torch.rand(1, 3, 9, 64, 96, generator=g) * 2 - 1
    peaks: dict[tuple[str, bool], int] = {}
    for new in (True, False):
        monkeypatch.setattr(vae_module, "JOIN_IN_PLACE", new)
        monkeypatch.setattr(vae_module, "SUM_TAPS_IN_READER", new)
        for what, push, first in (
            ("decode", vae.decode_chunk, (latent[:, :, :1], latent[:, :, 1:2], latent[:, :, 2:3])),
            ("encode", vae.encode_chunk, (video[:, :, :1], video[:, :, 1:5], video[:, :, 5:9])),
        ):
            cache: dict = {}
            with torch.no_grad():
                push(first[0], cache)
                push(first[1], cache)  # every cache full: the steady push
                counter = _LiveBytes()
                monkeypatch.setattr(channel_norm, "rms_norm_silu", counter.kernel(_RMS_NORM_SILU))
                monkeypatch.setattr(conv_bias, "residual_add", counter.kernel(_RESIDUAL_ADD))
                with counter:
                    push(first[2], cache)  # the output dropped at once
                peaks[what, new] = counter.peak
    assert peaks["decode", True] <= peaks["decode", False] and peaks["encode", True] <= peaks["encode", False]
    assert peaks["encode", False] > 0


_RMS_NORM_SILU, _RESIDUAL_ADD = channel_norm.rms_norm_silu, conv_bias.residual_add

_INTERPRETED_CHECKS = """
import torch
from worldgen.kernels import channel_norm, conv_bias
g = torch.Generator().manual_seed(0)
shape = (1, 24, 3, 5, 7)
parts = [(torch.randn(*shape, generator=g) * 3).contiguous(memory_format=torch.channels_last_3d) for _ in range(3)]
summed = channel_norm.sum_parts(parts)
bias, h = torch.randn(24, generator=g), torch.randn(*shape, generator=g).contiguous(memory_format=torch.channels_last_3d)
gamma = 1 + 0.2 * torch.randn(24, 1, 1, 1, generator=g)
want = channel_norm.rms_norm_silu(summed, gamma, 24**0.5, bias=bias)
joined = torch.zeros(1, 24, 5, 5, 7).contiguous(memory_format=torch.channels_last_3d)
got = channel_norm.rms_norm_silu(parts, gamma, 24**0.5, bias=bias, out=joined[:, :, 2:])
assert not channel_norm._failed, channel_norm._failed
assert got.data_ptr() == joined[:, :, 2:].data_ptr() and torch.equal(joined[:, :, 2:], want)
assert joined[:, :, :2].eq(0).all()  # the past frames' slot untouched
eager = torch.nn.functional.silu(torch.nn.functional.normalize(summed + bias.view(24, 1, 1, 1), dim=1) * 24**0.5 * gamma)
assert (want - eager).norm() / eager.norm() < 1e-6
assert torch.equal(conv_bias.residual_add(parts, bias, h), conv_bias.residual_add(summed, bias, h))
assert torch.equal(conv_bias.residual_add(summed, bias, h), (summed + bias.view(24, 1, 1, 1)) + h)
print("interpreted parts and slots: ok")
"""


@pytest.mark.slow
def test_the_kernels_sum_the_parts_and_write_into_a_slot_under_the_interpreter():
    """The channel norm and the residual add read three parts as the sum of them, bit for bit, and the norm writes
    into the new frames' slot of a joined input (Triton's interpreter on CPU tensors)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INTERPRETED_CHECKS)], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.cuda
def test_the_float32_golden_vae_on_cuda_gives_the_same_bits_with_fewer_passes(golden, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the time taps and the fused kernels run on CUDA)")
    from tests.worldgen.golden import golden_model
    from worldgen.models.vae_config import VAEConfig

    vae, io = golden_model(golden / "vae", VAEConfig, WanVAE, "vae.pth")
    vae = vae.to("cuda")
    runs = {}
    with torch.no_grad():
        for new in (True, False):
            monkeypatch.setattr(vae_module, "JOIN_IN_PLACE", new)
            monkeypatch.setattr(vae_module, "SUM_TAPS_IN_READER", new)
            runs[new] = vae.encode(io["video"][None].cuda()), vae.decode(io["latent"][None].cuda())
    assert not channel_norm._failed
    assert torch.equal(runs[True][0], runs[False][0]) and torch.equal(runs[True][1], runs[False][1])
    assert rel_l2(runs[True][1][0].cpu(), io["decoded"]) < 1e-3  # TF32, as cuDNN's 3-D convolutions
