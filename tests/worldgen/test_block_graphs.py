"""The causal DiT's blocks through `BlockGraphs`: CUDA graphs between the self-attentions give the eager
blocks' numbers and cache bit for bit, one capture serving every step and chunk whatever the window (on
the CPU the same eager blocks run and the decisions are what CUDA would do), and the memory plan turns
them on only where they change nothing of the job's KV cache and VAE cut."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.worldgen.test_fast import _full_size_plan, _stacked, chunks_io, dit, fast_root  # noqa: F401
from worldgen.kernels import attention as attention_module
from worldgen.kernels.cudnn_attention import fp8_unsupported_reason
from worldgen.models.block_graphs import BlockGraphs
from worldgen.models.chunk_graph import ChunkGraphs
from worldgen.models.dit import WanCameraDiT
from worldgen.models.dit_config import DiTConfig
from worldgen.models.kv_cache import CacheSpec, KVCache
from worldgen.pipelines.fast_plan import FastOptions


@pytest.mark.parametrize("storage", ["model", "fp8"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_blocks_replayed_between_attentions_give_the_eager_blocks_numbers(dit, chunks_io, device, storage):  # noqa: F811
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = dit if device == "cpu" else copy.deepcopy(dit).to(device, dtype)
    io = {name: t.to(device, dtype if t.is_floating_point() else t.dtype) for name, t in chunks_io.items()}
    spec = CacheSpec(60, 10, storage, rolling=True, sink_frames=1)  # chunk 2 evicts: the window moves on
    eager, graphed = (KVCache(spec, 2, 2, 16, dtype, device) for _ in range(2))
    forward = ChunkGraphs(model, allowed=False)  # whole forwards eager: their blocks go to model.block_graphs
    graphs = BlockGraphs()
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    try:
        for c in range(3):
            f = slice(3 * c, 3 * c + 3)
            # three steps (two timesteps), then the cache refresh that only writes the last block's keys
            for x, t, keys_only in (("x", io["t_a"], False), ("x", io["t_b"], False), ("x", io["t_a"], False),
                                    ("x_clean", zero, True)):  # fmt: skip
                args = (io[x][:, f][None], t, [io["context"]], io["y"][:, f][None], io["cam"][:, :, f])
                model.block_graphs = None
                want = forward(*args, cache=eager, current_start=30 * c, keys_only=keys_only)
                model.block_graphs = graphs
                got = forward(*args, cache=graphed, current_start=30 * c, keys_only=keys_only)
                assert (want is None) == (got is None) == keys_only
                assert keys_only or torch.equal(want, got), (c, x, t)
            written = slice(0, eager.local_end)  # an FP8 store's other slots were never written (torch.empty)
            for which in ("k", "v", "k_scale", "v_scale") if storage == "fp8" else ("k", "v"):
                assert torch.equal(_stacked(eager, which, written), _stacked(graphed, which, written)), (c, which)
    finally:
        model.block_graphs = None
    # the first call makes the text keys/values (eager), the next is the first with the rollout's key, the
    # third repeats it and is captured; every later call replays, the refreshes and the moving window too
    assert graphs.decisions == ["eager", "eager", "capture", "replay"] + ["replay"] * 8
    assert graphs.captures == (1 if device == "cuda" else 0)
    graphs.close()
    assert graphs.graphs == [] and graphs.static == {}


def _random_fp8_dit(device: str) -> WanCameraDiT:
    """Blocks wide enough for `--compute fp8`'s kernels (heads of 128, >= 256 tokens a chunk), random weights."""
    cfg = DiTConfig(dim=256, ffn_dim=512, num_heads=2, num_layers=3, text_dim=64, text_len=32)
    torch.manual_seed(0)
    model = WanCameraDiT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * (0.05 if p.ndim > 1 else 0.01))
    model = model.to(device, torch.bfloat16).eval()
    model.set_compute("fp8")
    return model


@pytest.mark.cuda
@pytest.mark.parametrize("decline", [False, True])
def test_fp8_blocks_replayed_give_the_eager_blocks_numbers(decline):
    """--compute fp8 through cuDNN's FP8 attention: the query's quantization and the output projection
    run inside the graphs, the attention writes into their buffer; the same bits as eager blocks. With
    `decline`, cuDNN refuses chunk 2's window: that forward finishes eagerly and the graphs are dropped."""
    if not torch.cuda.is_available() or fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("needs a Hopper GPU and the cuDNN frontend (pip install nvidia-cudnn-frontend)")
    model = _random_fp8_dit("cuda")
    gen = torch.Generator("cuda").manual_seed(1)
    f, h, w, frame = 3, 16, 32, 128  # 384 tokens a chunk

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    x, y, cam = randn(1, 16, 9, h, w), randn(1, 20, 9, h, w), randn(1, 384, 9, h, w)
    context, steps = [randn(20, 64)], (torch.tensor([900.0], device="cuda"), torch.tensor([500.0], device="cuda"))
    spec = CacheSpec(6 * frame, frame, "fp8", rolling=True, sink_frames=1)  # chunk 2 evicts
    eager, graphed = (KVCache(spec, 3, 2, 128, torch.bfloat16, "cuda") for _ in range(2))
    forward, graphs = ChunkGraphs(model, allowed=False), BlockGraphs()
    before = dict(attention_module._fp8_usable)
    try:
        for c in range(3):
            if decline and c == 2:  # what cuDNN's refusal of the shapes it ran (chunk 2's window among them) leaves
                attention_module._fp8_usable.update(
                    {key: False for key in attention_module._fp8_usable if len(key) > 1}
                )
            frames = slice(f * c, f * c + f)
            for t, keys_only in ((steps[0], False), (steps[1], False), (steps[0], False), (steps[1] * 0, True)):
                args = (x[:, :, frames], t, context, y[:, :, frames], cam[:, :, frames])
                model.block_graphs = None
                want = forward(*args, cache=eager, current_start=3 * frame * c, keys_only=keys_only)
                model.block_graphs = graphs
                got = forward(*args, cache=graphed, current_start=3 * frame * c, keys_only=keys_only)
                assert keys_only or torch.equal(want, got), (c, t)
            for which in ("k", "v", "k_scale", "v_scale"):
                written = slice(0, eager.local_end)
                assert torch.equal(_stacked(eager, which, written), _stacked(graphed, which, written)), (c, which)
        ran = {key[1:]: used for key, used in attention_module._fp8_usable.items() if len(key) > 1}
        assert ran and all(used is not decline for used in ran.values()), ran  # chunk 2 met no shape of its own
    finally:
        model.block_graphs = None
        attention_module._fp8_usable.clear()
        attention_module._fp8_usable.update(before)
    assert graphs.captures == 1
    if decline:  # chunk 2's first forward began as a replay, then went eager; eager blocks after it
        assert graphs.decisions[8] == "replay" and set(graphs.decisions[9:]) == {"eager"} and graphs.graphs == []
    else:
        assert graphs.decisions == ["eager", "eager", "capture"] + ["replay"] * 9 and graphs.fp8


def test_a_new_cache_is_captured_again(dit, chunks_io):  # noqa: F811
    io, graphs = chunks_io, BlockGraphs()
    forward = ChunkGraphs(dit, allowed=False)
    dit.block_graphs = graphs
    try:
        for _ in range(2):  # two rollouts: the second cache's text keys/values are not the ones captured
            cache = KVCache(CacheSpec(60, 10), 2, 2, 16, torch.float32, "cpu")
            for _ in range(3):
                forward(io["x"][:, :3][None], io["t_a"], [io["context"]], io["y"][:, :3][None], io["cam"][:, :, :3],
                        cache=cache, current_start=0)  # fmt: skip
    finally:
        dit.block_graphs = None
    assert graphs.decisions == ["eager", "eager", "capture"] * 2


def test_the_plan_takes_block_graphs_only_where_they_change_no_cache_or_cut():
    # 480x832 at 24 GiB: their buffers and pool would cost the rolling window frames: eager blocks
    pipe = _full_size_plan(24)
    spec = pipe.plan_job(21, 58, 104, FastOptions())
    assert not pipe.block_graph_room and "CUDA graphs" not in pipe.describe_plan()
    plain = _full_size_plan(24)
    plain.use_block_graphs = False
    assert plain.plan_job(21, 58, 104, FastOptions()) == spec
    # 320x560 at 24 GiB: the whole video's cache either way, so the graphs take room nothing else wanted
    pipe, plain = _full_size_plan(24), _full_size_plan(24)
    plain.use_block_graphs = False
    small = pipe.plan_job(21, 40, 70, FastOptions())
    assert small == plain.plan_job(21, 40, 70, FastOptions()) and not small.rolling
    assert pipe.block_graph_room and (pipe.vae_cut, pipe.stream_encode) == (plain.vae_cut, plain.stream_encode)
    assert "blocks replayed as CUDA graphs between self-attentions" in pipe.describe_plan()
    assert pipe.camera_blocks <= plain.camera_blocks  # their memory comes out of the camera's spare first
    unbounded = _full_size_plan(None)
    unbounded.plan_job(21, 58, 104, FastOptions())
    assert unbounded.block_graph_room
    chunk_graphs = _full_size_plan(None)
    chunk_graphs.use_chunk_graphs = True  # the opt-in whole-forward graphs replace them
    chunk_graphs.plan_job(21, 58, 104, FastOptions())
    assert not chunk_graphs.block_graph_room
