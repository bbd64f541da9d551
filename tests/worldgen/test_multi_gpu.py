"""One rollout over two devices (`--gpus`), the FP8 path's refusals and arithmetic, on the CPU.

The two-device logic (second device's own experts, its thread, the per-step hand-over) runs for real
with two CPU "devices": the output must equal the one-device path's exactly. CUDA-only parts (the
fused kernels, the FP8 GEMMs' speed) are measured by bench/bench_speed.py and bench/cuda_parity.py.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

import numpy as np
import pytest
import torch

from contracts.settings import load_settings
from worldgen.errors import InputError
from worldgen.kernels.fp8 import fp8_linear, unsupported_reason
from worldgen.pipelines.loader import load_pipeline
from worldgen.pipelines.multi_gpu import PeerDevice, PeerLost, devices_for_gpus, parse_gpus, serve_guidance


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


def test_two_devices_with_camera_caches_give_the_one_device_output(lingbot_examples, tmp_path):
    """Each device keeps its own expert's camera modulation (its own plan says so): the second
    device computes it once per expert, not once per pass, gives the same video and frees it."""
    one = load_pipeline("tiny", device="cpu", text_cache_dir=tmp_path)
    two = load_pipeline("tiny", devices=["cpu", "cpu"], text_cache_dir=tmp_path)
    expected = _rollout(one, lingbot_examples / "00")
    second = two.second_device
    passes: list[str] = []
    camera_layer_calls: list[str] = []
    hooked: set[int] = set()
    original = second.residency.use

    def use(which, upcoming):  # count the second device's passes and its camera-layer runs
        model = original(which, upcoming=upcoming)
        passes.append(which)
        if id(model) not in hooked:
            hooked.add(id(model))
            model.blocks[0].cam_scale_layer.register_forward_hook(lambda *_: camera_layer_calls.append(which))
        return model

    two.plan.camera_cache = second.residency.plan.camera_cache = True
    second.residency.use = use
    got = _rollout(two, lingbot_examples / "00")
    assert torch.equal(got, expected)
    assert sorted(camera_layer_calls) == sorted(set(passes)) and len(passes) > len(set(passes))
    models = [slot.module for slot in [*two.experts.values(), *second.experts.values()]]
    assert all(model is None or model.camera_cache is None for model in models)  # freed with the job


@pytest.mark.slow
def test_a_peer_worker_serving_the_unconditional_passes_gives_the_one_device_output(lingbot_examples, tmp_path):
    """A pool's two-GPU job: the second worker's own warm experts serve the unconditional passes over
    a Unix socket (what bridge/workers/worker_pool.py pairs); only the job's token is served."""
    one = load_pipeline("tiny", device="cpu", text_cache_dir=tmp_path)
    peer = load_pipeline("tiny", device="cpu", text_cache_dir=tmp_path)  # another worker's pipeline
    expected = _rollout(one, lingbot_examples / "00")
    address = f"\0lingbot-isaac-test/{os.getpid()}/{tmp_path.name}"
    served: list = []
    thread = threading.Thread(target=lambda: served.append(
        serve_guidance(lambda: (peer.residency, peer.device), address, "the-token", accept_s=60)))  # fmt: skip
    thread.start()
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(100):
        try:
            stranger.connect(address)
            break
        except ConnectionRefusedError:
            threading.Event().wait(0.05)
    stranger.sendall(struct.pack(">Q", 5) + b"hello")  # not the job's worker: closed, the wait goes on
    assert stranger.recv(1) == b""
    greedy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    greedy.connect(address)
    greedy.sendall(struct.pack(">Q", 1 << 40))  # a terabyte "hello": refused before any allocation
    assert greedy.recv(1) == b""
    one.second_device = PeerDevice(address, "the-token", "cpu", "peer")
    try:
        got = _rollout(one, lingbot_examples / "00")
    finally:
        one.second_device = None
    thread.join(timeout=60)
    assert torch.equal(got, expected)
    assert served == [3]  # one unconditional pass per step, on the peer
    assert peer.experts["high"].loads == 1  # the peer's own experts ran them
    with pytest.raises(PeerLost, match="did not listen"):  # nobody at that address any more
        PeerDevice(address, "the-token", "cpu", "peer", connect_s=0.2)


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
