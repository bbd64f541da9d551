"""The benchmarks' own tools: the profile's kernel families and the host-bound timing of a forward's blocks."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file
from torch.profiler import ProfilerActivity, profile

from bench.host_bound import blocks_timed
from bench.kernel_profile import GAP_US, call_site, family_of, idle_gaps, launch_site, profiled
from bench.two_gpu_link import LinkMeter
from worldgen.models.dit import Block, LayerNorm, WanCameraDiT
from worldgen.runtime.checkpoint import load_expert

# names as an H100 profile of a Fast fp8 rollout printed them (docs/benchmarks.md, "Session 15: Fast")
PROFILED = {
    "nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_bias_TNT": "gemm fp8",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f8_knob_32_64x256x128_4x1x1_cga1x1x1_kernel0_0": "attention",
    "sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x32x32_stage4_warpsize4x1x1_g1_"
    "tensor16x8x16_execute_kernel__5x_cudnn": "conv (VAE)",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>": "conv (VAE)",
    "_nf4_rows_kernel": "nf4 weights",
    "_layer_norm_kernel": "triton hand-written",
    "_rms_norm_silu_kernel": "triton hand-written",
    "triton_poi_fused_add_mul_0": "triton fused",
    "Memcpy DtoH (Device -> Pageable)": "copy / cast",
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda": "copy / cast",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>": "other elementwise",
    # an H200 profile of an int8 rollout (docs/benchmarks.md, "Session 29"): SageAttention's Triton kernel, our epilogue
    "_attn_fwd": "attention",
    "_dequantize_kernel": "triton hand-written",
    "void cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_128x64_128x3_tn_align16>": "gemm int8",
    "_gemm_kernel": "gemm int8",  # worldgen.kernels.int8_triton's W8A8 GEMM
    "_attention_kernel": "attention",  # worldgen.kernels.int8_attention_triton's
    "_quantize_blocks_kernel": "triton hand-written",
}


@pytest.mark.parametrize("name", list(PROFILED))
def test_each_profiled_kernel_lands_in_its_family(name):
    assert family_of(name) == PROFILED[name]


def test_a_forwards_blocks_are_timed_and_the_model_left_as_it_was(golden):
    dit = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)
    io = load_file(golden / "dit" / "io.safetensors")
    inputs = (io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None], io["cam"])
    with torch.no_grad():
        plain = dit(*inputs)
        with blocks_timed(2) as times:
            first, second, third, fourth = dit(*inputs), dit(*inputs), dit(*inputs), dit(*inputs)
    assert len(times.cpu) == len(dit.blocks) and all(t > 0 for t in times.cpu) and times.gpu == []  # no GPU here
    assert all(torch.equal(out, plain) for out in (first, second, third, fourth))
    # forward 4 would be timed whole behind a sleep on the GPU; here there is none
    assert times.whole is None and times.as_dict()["whole_cpu_gpu_ms"] is None
    assert times.summary().startswith(
        f"host bound: forward 4 whole not timed: no GPU; forward 2, {len(dit.blocks)} blocks: CPU enqueue"
    )
    # forward 3 ran under cProfile: the engine's steps by cumulative time, the blocks' own among them
    assert any(name.startswith("dit.py") and calls == len(dit.blocks) for name, calls, _ in times.engine_functions)
    assert WanCameraDiT.forward_tokens.__module__ == Block.forward.__module__ == "worldgen.models.dit"
    with blocks_timed(99) as unreached:
        dit(*inputs)
    assert "not reached" in unreached.summary()


def test_a_profiled_op_is_put_down_to_the_op_our_code_called_and_its_shapes():
    norm = LayerNorm(8, 1e-6, elementwise_affine=False)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        norm(torch.ones(2, 8, dtype=torch.bfloat16))
    sites = {call_site(e) for e in prof.events() if e.name in ("aten::copy_", "aten::native_layer_norm")}
    # the cast inside `x.float()` is put down to the call LayerNorm.forward made (aten::to), not to its inner copy_
    assert sites == {("aten::to", "2x8"), ("aten::layer_norm", "2x8")}


def test_idle_stretches_are_summed_by_the_launches_around_them_with_streams_merged():
    kernels = [
        (0.0, 100.0, "a"),
        (50.0, 400.0, "b"),  # another stream: overlaps a, so no idle between them
        (420.0, 500.0, "c"),  # 20 us after b: a launch gap
        (800.0, 900.0, "d"),  # 300 us idle after c
        (1900.0, 2000.0, "d"),  # 1000 us idle after d
        (2500.0, 2600.0, "d"),  # 500 us after d
    ]
    lines = idle_gaps(kernels)
    assert lines[0] == f"idle stretches >= {GAP_US:g} us: 3, 0.002 s; shorter: 1, 0.000 s"
    assert lines[2].split() == ["0.002", "2", "0.0010", "d", "<-", "d"]
    assert lines[3].split() == ["0.000", "1", "0.0003", "d", "<-", "c"]
    assert len(lines) == 4


def test_a_launch_is_put_down_to_the_innermost_named_range_around_its_op():
    norm = LayerNorm(8, 1e-6, elementwise_affine=False)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.profiler.record_function("outer"), torch.profiler.record_function("vae decode push"):
            norm(torch.ones(2, 8, dtype=torch.bfloat16))
        norm(torch.ones(3, 8, dtype=torch.bfloat16))
    sites = {launch_site(e) for e in prof.events() if e.name == "aten::native_layer_norm"}
    assert sites == {"vae decode push: aten::layer_norm [2x8]", "aten::layer_norm [3x8]"}


def test_a_profiled_region_is_written_whole_with_its_named_ranges_not_counted_as_gpu_work(tmp_path):
    norm = LayerNorm(8, 1e-6, elementwise_affine=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU its kernels and their call sites are listed
    with profiled(tmp_path / "profile.txt", "a norm"), torch.profiler.record_function("a named range"):
        norm(torch.ones(2, 8, dtype=torch.bfloat16, device=device))
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith("a norm: wall ") and "GPU busy" in text
    for heading in ("family totals", "top kernels", "top call sites", "longest idle"):
        assert heading in text
    kernels = text.split("top kernels")[1].split("top call sites")[0]
    assert "a named range" not in kernels  # the profiler draws it on the GPU's timeline too: not a kernel
    if device == "cuda":
        assert "aten::layer_norm [2x8]" in text.split("top call sites")[1]
        put_down = re.search(r"kernels put down to the host event that launched them: (\d+) of (\d+)", text)
        assert put_down and put_down[1] == put_down[2] != "0"


def test_a_one_device_pipeline_has_no_link_figures_and_bench_fast_refuses_gpus_it_lacks():
    """`bench.two_gpu_link.LinkMeter` over a pipeline without a second rank: nothing to report; `bench_fast.py
    --gpus 0,1` on a machine without those GPUs: a usage error naming the fix, before anything loads."""
    import subprocess
    import sys
    from pathlib import Path

    from worldgen.pipelines.loader import load_pipeline

    meter = LinkMeter(load_pipeline("tiny", device="cpu", model="fast"))  # the built-in tiny model, one device
    meter.mark()
    assert meter.figures() == {} and meter.moved == [0, 0]
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs: bench_fast.py --gpus 0,1 would run")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "bench/bench_fast.py", "--gpus", "0,1", "--frames", "17", "--action-path", "data/sample_room"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--gpus 0,1: this machine has" in done.stderr and "leave --gpus out" in done.stderr


def test_a_two_rank_rollout_reports_rank_1s_forwards_and_the_link(tmp_path):
    """`LinkMeter` over a real two-rank pipeline (two CPU processes, gloo): the link's bytes and rank 1's own clock
    a forward (what it waited for its inputs and spent launching; no GPU span or allocator on the CPU), one line."""
    from bench.two_gpu_link import describe
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline

    two = load_pipeline("tiny", devices=["cpu", "cpu"], model="fast", text_cache_dir=tmp_path)
    try:
        meter = LinkMeter(two)
        image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
        poses, intrinsics = (
            torch.eye(4).repeat(21, 1, 1).numpy(),
            torch.tensor([[400.0, 400.0, 48.0, 32.0]] * 21).numpy(),
        )
        two.generate(image, "a room", poses, intrinsics, GenerationSettings(model="fast", size="64*96", frame_num=21))
        meter.mark()
        figures = meter.figures()
    finally:
        two.scale_out.close()
    assert figures["devices"] == ["cpu", "cpu"] and figures["link_mb_per_chunk"][0] > 0
    forward = figures["peer_forward_ms"]
    assert set(forward) == {"inputs", "launch"} and forward["launch"] > 0 and forward["inputs"] >= 0
    assert figures["peer_alloc_retries"] is None
    assert "rank 1 a forward, ms: inputs " in describe(figures) and describe({}) == ""


def test_the_vae_pass_bytes_scale_with_the_frame_and_the_element():
    """bench/vae_pass_bytes.py's arithmetic (the full-size VAE on the meta device): the bytes the join and the taps'
    sum in their reader save grow with a frame's pixels and with the element's size, and the taps' outweigh the
    join's (4T frames of the output against 2T of the input)."""
    from bench.vae_pass_bytes import pass_bytes

    small, large, half = pass_bytes(128, 192, 4), pass_bytes(256, 384, 4), pass_bytes(128, 192, 2)
    for push in ("decode", "encode"):
        assert all(b > 0 for b in small[push])
        assert large[push] == pytest.approx(tuple(4 * b for b in small[push]), rel=1e-9)
        assert half[push] == pytest.approx(tuple(b / 2 for b in small[push]), rel=1e-9)
        assert small[push][1] > small[push][0]
