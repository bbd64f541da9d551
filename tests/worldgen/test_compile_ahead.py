"""Compiling a Fast job's kernels ahead on a one-block copy of its DiT (`worldgen.pipelines.compile_ahead`):
the copy has the real layout and settings and never touches the real model; the thread's failures are
reported, not raised; on CUDA the job then compiles no graph of its own."""

from __future__ import annotations

import warnings

import pytest
import torch

from contracts.settings import GenerationSettings
from worldgen.kernels.nf4 import NF4Linear
from worldgen.models.dit import Linear
from worldgen.pipelines import compile_ahead
from worldgen.pipelines.fast_plan import FastOptions


def _tiny(device: str = "cpu"):
    from worldgen.pipelines.loader import load_pipeline

    return load_pipeline("tiny", device=device, model="fast", use_text_cache=False)


def test_the_one_block_copy_has_the_checkpoints_layout_and_the_models_settings():
    pipe = _tiny()
    cfg = pipe.dit_config
    for kind, linear_type in (("bf16", Linear), ("nf4", NF4Linear)):
        copy = compile_ahead.one_block_copy(cfg, kind, torch.device("cpu"), torch.float32, "exact", "sdpa", 16)
        assert len(copy.blocks) == 1 and copy.cfg.dim == cfg.dim and copy.cfg.num_heads == cfg.num_heads
        assert isinstance(copy.blocks[0].ffn[0], linear_type) and isinstance(copy.text_embedding[0], linear_type)
        assert not any(p.requires_grad for p in copy.parameters())  # as loaded: compiled code guards on it
        assert copy.blocks[0].ffn_chunk_tokens == 16 and copy.blocks[0].self_attn.attention_backend == "sdpa"
        if kind == "nf4":  # a real NF4 weight (bitsandbytes' components), dequantized on the CPU
            weight = copy.blocks[0].ffn[0].dequantized_weight(torch.float32)
            assert weight.shape == (cfg.ffn_dim, cfg.dim) and torch.isfinite(weight).all() and weight.abs().sum() > 0


def test_compiling_ahead_runs_every_chunk_on_its_own_copy_and_leaves_the_model_unloaded():
    pipe = _tiny()
    options = FastOptions()
    pipe.plan_job(6, 8, 12, options)  # two chunks of 3 latent frames at 64x96
    calls = []
    real_forward = compile_ahead.warm_forwards

    def counting(forward, model, *args):
        def counted(*a, **k):
            calls.append(k["current_start"])
            return forward(*a, **k)

        return real_forward(counted, model, *args)

    compile_ahead.warm_forwards, saved = counting, compile_ahead.warm_forwards
    try:
        ahead = compile_ahead.start_for(pipe, 6, 8, 12, options)
        ahead.join(timeout=120)
    finally:
        compile_ahead.warm_forwards = saved
    report = ahead.report()
    assert report["error"] is None and report["seconds"] > 0
    assert calls == [0, 3 * 4 * 6, 3 * 4 * 6]  # chunk 0, chunk 1 (a new window length), chunk 1 again
    assert not pipe.dit.loaded  # the real DiT was never loaded or run


def test_a_failure_in_the_thread_is_reported_at_the_join_not_raised():
    def broken() -> None:
        raise RuntimeError("no compiler here")

    ahead = compile_ahead.CompileAhead(broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ahead.join(timeout=30)
    assert ahead.report()["error"] == "RuntimeError: no compiler here"
    assert any("compiling ahead failed (RuntimeError: no compiler here)" in str(w.message) for w in caught)


def test_a_cpu_job_compiles_nothing_ahead():
    pipe = _tiny()
    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    text_dim = pipe.residency.use("fast").text_embedding[0].in_features
    pipe.generate(image, None, None, None, settings, context=torch.zeros(7, text_dim))
    assert pipe.compile_ahead is None and pipe.compile_ahead_report is None


@pytest.mark.cuda
def test_on_cuda_the_job_compiles_no_graph_after_compiling_ahead():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the fused kernels compile on CUDA only)")
    torch._dynamo.reset()  # nothing compiled before: every kernel this job needs is compiled here
    pipe = _tiny("cuda")
    settings = GenerationSettings(model="fast", size="64*96", frame_num=33, seed=3)  # 3 chunks: 3 window lengths
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    text_dim = pipe.residency.use("fast").text_embedding[0].in_features
    context = torch.randn(7, text_dim, generator=torch.Generator().manual_seed(1))
    video = pipe.generate(image, None, None, None, settings, context=context)
    report = pipe.compile_ahead_report
    assert report is not None and report["error"] is None and report["graphs"] > 0
    assert compile_ahead.compiled_graphs() == report["graphs"]  # the job's own forwards compiled nothing
    # a second job of the same shapes compiles nothing ahead, and makes the same video
    again = pipe.generate(image, None, None, None, settings, context=context)
    assert pipe.compile_ahead_report is None and torch.equal(again, video)
