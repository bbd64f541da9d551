"""The Fast chunk forward through `ChunkGraphs`: which calls are captured / replayed (on the CPU the same
eager path runs and the decisions are what CUDA would do), eviction done before the forward gives the
very same cache and outputs as eviction inside it, and the memory plan's say on the graph's pool."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.worldgen.test_fast import _cache, _call, _full_size_plan, _stacked, chunks_io, dit, fast_root  # noqa: F401
from worldgen.models.chunk_graph import ChunkGraphs
from worldgen.models.kv_cache import CacheSpec, KVCache
from worldgen.pipelines.fast_plan import FastOptions


def _graph_call(graphs, io, cache, c, x="x", t=None):
    f = slice(3 * c, 3 * c + 3)
    t = io["t_a"] if t is None else t
    out = graphs(io[x][:, f][None], t, [io["context"]], io["y"][:, f][None], io["cam"][:, :, f], cache=cache,
                 current_start=30 * c)  # fmt: skip
    return out[0]


def test_eviction_before_the_forward_equals_eviction_inside_it(dit, chunks_io):  # noqa: F811
    io = chunks_io
    spec = CacheSpec(60, 10, rolling=True, sink_frames=1)  # 6 frames: chunk 2 evicts 3 frames after the sink
    direct, graphed = _cache(spec), _cache(spec)
    graphs = ChunkGraphs(dit)
    zero = torch.zeros(1, dtype=torch.int64)
    for c in range(3):
        for x, t in (("x", None), ("x", None), ("x_clean", zero)):
            assert torch.equal(_call(dit, io, direct, c, x, t), _graph_call(graphs, io, graphed, c, x, t))
        assert (direct.global_end, direct.local_end) == (graphed.global_end, graphed.local_end)
    for which in ("k", "v"):
        assert torch.equal(_stacked(direct, which), _stacked(graphed, which))
    # a call is captured when it repeats the last call's key (shapes, cache buffers, slots), replayed
    # while the key holds; the first call (text keys/values made) and a changed window run eagerly.
    # Chunk 2 evicts: after the eviction it writes and reads the slots chunk 1 did, so it replays.
    assert graphs.decisions == ["eager", "capture", "replay", "eager", "capture", "replay"] + ["replay"] * 3


def test_a_new_cache_is_never_replayed_into(dit, chunks_io):  # noqa: F811
    graphs = ChunkGraphs(dit)
    for _ in range(2):  # two rollouts, one cache each: the second one's calls do not match the first's graph
        cache = _cache(CacheSpec(60, 10))
        for _ in range(3):
            _graph_call(graphs, chunks_io, cache, 0)
    assert graphs.decisions == ["eager", "capture", "replay"] * 2


def _asked(budget_gib, vae_dtype=torch.bfloat16, graphs=True, overlap=True):
    pipe = _full_size_plan(budget_gib)
    pipe.vae_dtype, pipe.use_chunk_graphs, pipe.overlap_decode = vae_dtype, graphs, overlap
    return pipe


def test_under_a_budget_graphs_and_the_decode_overlap_get_room_only_when_asked_beside_a_bf16_vae():
    # a captured forward keeps its pool (1.24 GiB at 4,524 tokens, measured) and a decode on a second stream
    # runs beside a forward: the plan counts them at once, out of the KV cache or the decoder's tiles. Measured
    # on the H100 at 24 GiB: beside the bf16 VAE (fp8) 7 frames ran (two 464x464 strips, before three narrower
    # strips were a cut of their own); beside the float32 one the pool ran out of memory.
    pipe = _full_size_plan(24)
    assert pipe.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508
    assert not pipe.graph_room and pipe.vae_cut.tiles == 2
    asked = _asked(24)  # the pool beside two strips' push leaves 7 frames; beside three strips' smaller one, 10
    assert asked.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508
    assert asked.graph_room and asked.vae_cut.tiles == 3
    overlap_only = _asked(24, graphs=False)  # a forward's activations beside a decode, no pool kept
    assert overlap_only.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508
    assert overlap_only.graph_room
    exact = _asked(24, vae_dtype=torch.float32)
    assert exact.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508
    assert not exact.graph_room  # refused: every forward eager, decodes after them
    unbounded = _asked(None, vae_dtype=torch.float32)
    unbounded.plan_job(21, 58, 104, FastOptions())
    assert unbounded.graph_room


def test_the_fast_vae_computes_in_bf16_only_under_fp8_on_cuda():
    from worldgen.pipelines.fast_plan import vae_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert vae_dtype("fast", "fp8", cuda) == torch.bfloat16
    assert vae_dtype("fast", "int8", cuda) == torch.bfloat16  # approximate too: its chunk is not held up by the decode
    assert vae_dtype("fast", "exact", cuda) == torch.float32
    assert vae_dtype("base", "fp8", cuda) == torch.float32  # base jobs may switch compute per job
    assert vae_dtype("fast", "fp8", cpu) == torch.float32
    # the bf16 VAE does not change the plan: its savings are slack (halving the figures ran out of memory)
    half = _full_size_plan(24)
    half.vae_dtype = torch.bfloat16
    assert half.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508


@pytest.mark.slow
def test_warm_up_runs_the_jobs_shapes_and_changes_no_video():
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline

    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    poses = torch.eye(4).repeat(21, 1, 1).numpy()
    intrinsics = torch.tensor([[400.0, 400.0, 416.0, 240.0]]).repeat(21, 1).numpy()
    cold = load_pipeline("tiny", device="cpu", model="fast")
    text_dim = cold.residency.use("fast").text_embedding[0].in_features
    context = torch.randn(7, text_dim, generator=torch.Generator().manual_seed(1))
    video = cold.generate(image, None, poses, intrinsics, settings, context=context)
    warm = load_pipeline("tiny", device="cpu", model="fast")
    assert warm.warm_up(settings, image_size=(64, 96)) > 0
    # 2 chunks of 3 latent frames: one forward each, and a second on the last (where a graph is captured)
    assert warm.chunk_graphs is None and warm.cache_spec.capacity_tokens == 6 * 4 * 6
    assert torch.equal(warm.generate(image, None, poses, intrinsics, settings, context=context), video)


def _tiny_job():
    """A tiny Fast pipeline on `device`, a 2-chunk job's inputs, and its video from a pipeline never warmed."""
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline

    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    poses = torch.eye(4).repeat(21, 1, 1).numpy()
    intrinsics = torch.tensor([[400.0, 400.0, 416.0, 240.0]]).repeat(21, 1).numpy()
    job = (image, "a room", poses, intrinsics, settings)
    return load_pipeline, job


def test_compiling_ahead_runs_the_first_block_once_a_chunk_and_changes_no_video():
    from worldgen.pipelines import fast_warm_up

    load_pipeline, job = _tiny_job()
    settings = job[-1]
    cold = load_pipeline("tiny", device="cpu", model="fast")
    video = cold.generate(*job)
    warm = load_pipeline("tiny", device="cpu", model="fast")
    model = warm.residency.use("fast")
    blocks, calls = list(model.blocks), [0, 0]
    hooks = [
        b.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1)) for i, b in enumerate(blocks[:2])
    ]
    fast_warm_up._forward_each_chunk(warm, settings, (64, 96), full=False)  # what compile_ahead runs (CUDA only)
    assert calls == [2, 0] and list(model.blocks) == blocks  # 2 chunks, block 0 only; all blocks back
    for hook in hooks:
        hook.remove()
    assert torch.equal(warm.generate(*job), video)


@pytest.mark.cuda
def test_a_fast_pipeline_on_cuda_compiles_ahead_at_load_and_gives_the_same_video(monkeypatch):
    from worldgen.pipelines import fast_warm_up

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (compiling ahead is for CUDA kernels)")
    load_pipeline, job = _tiny_job()
    ahead = load_pipeline("tiny", device="cuda", model="fast")
    assert ahead.engine["compile_ahead_s"] > 0
    video = ahead.generate(*job)
    monkeypatch.setattr(fast_warm_up, "COMPILE_AHEAD", False)
    plain = load_pipeline("tiny", device="cuda", model="fast")
    assert "compile_ahead_s" not in plain.engine
    assert torch.equal(plain.generate(*job), video)


@pytest.mark.slow  # the tiny Fast DiT at the default 480x832 frame: ~30 s of CPU
def test_a_worker_asked_to_warm_up_does_it_at_load():
    from contracts.engine_options import EngineOptions
    from worldgen.worker import PipelineEngine

    assert PipelineEngine(EngineOptions(model="fast", warm_up=True)).describe()["warm_up_s"] > 0
    assert PipelineEngine(EngineOptions(model="fast")).describe()["warm_up_s"] is None


def test_a_worker_warms_up_for_the_job_defaults_it_was_sent():
    """A server sends its generation preset as `warm_up_settings`: the warm-up runs that job's shapes."""
    from contracts.engine_options import EngineOptions
    from contracts.settings import SettingsError
    from worldgen.worker import PipelineEngine

    engine = PipelineEngine(
        EngineOptions(model="fast", warm_up=True, warm_up_settings={"size": "48*80", "frame_num": 9})
    )
    assert engine.describe()["warm_up_s"] > 0
    spec = engine.pipe.cache_spec  # the plan of the job warmed: 48*80, 9 frames, not 464x832's 1,508 tokens a frame
    assert (spec.frame_tokens, spec.capacity_tokens) == (10, 30)
    with pytest.raises(SettingsError, match="warm_up_settings.*size"):
        PipelineEngine(EngineOptions(model="fast", warm_up=True, warm_up_settings={"size": "huge"}))


def test_text_and_vae_run_ahead_once_with_the_job_shapes_and_change_no_video(tmp_path):
    import warnings

    from worldgen.pipelines.text_cache import TextCache

    load_pipeline, job = _tiny_job()
    settings = job[-1]
    cold = load_pipeline("tiny", device="cpu", model="fast", text_cache_dir=tmp_path / "cold")
    video = cold.generate(*job)
    ahead = load_pipeline("tiny", device="cpu", model="fast", text_cache_dir=tmp_path / "ahead")
    assert isinstance(ahead.text_cache, TextCache)
    vae = ahead.residency.use("vae")
    pushed: dict[str, list[tuple[int, ...]]] = {"encode": [], "decode": []}
    originals = vae.encode_chunk, vae.decode_chunk

    def spy(kind, original):
        return lambda x, cache: pushed[kind].append(tuple(x.shape)) or original(x, cache)

    vae.encode_chunk, vae.decode_chunk = spy("encode", originals[0]), spy("decode", originals[1])
    encoded_prompts, encode_ids = [], ahead.encode_ids
    ahead.encode_ids = lambda ids, mask: encoded_prompts.append(ids.shape) or encode_ids(ids, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failure inside would only warn: here it fails the test
        assert ahead.first_use_ahead(settings, (64, 96)) > 0
    vae.encode_chunk, vae.decode_chunk = originals
    assert encoded_prompts == [(1, ahead.text_len)]  # umT5 ran once, on one prompt of the model's text length
    # chunk 0's 9 frames at the job's 64x96 (frame 0 alone, then 4 + 4), two chunks of 3 latents decoded
    assert pushed["encode"] == [(1, 3, 1, 64, 96), (1, 3, 4, 64, 96), (1, 3, 4, 64, 96)]
    assert pushed["decode"] == [(1, 16, 1, 8, 12)] * 6
    assert not any((tmp_path / "ahead").glob("*"))  # the placeholder prompt's embedding is not kept
    assert torch.equal(ahead.generate(*job), video)


@pytest.mark.cuda
def test_a_server_pipeline_on_cuda_runs_text_and_vae_ahead_and_gives_the_same_video(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (running ahead is for CUDA's kernels and plans)")
    load_pipeline, job = _tiny_job()
    ahead = load_pipeline("tiny", device="cuda", model="fast", first_use_ahead=True, text_cache_dir=tmp_path)
    assert ahead.engine["first_use_ahead_s"] > 0
    assert not any(tmp_path.glob("*"))
    video = ahead.generate(*job)
    plain = load_pipeline("tiny", device="cuda", model="fast", use_text_cache=False)
    assert "first_use_ahead_s" not in plain.engine
    assert torch.equal(plain.generate(*job), video)


@pytest.mark.parametrize("storage", ["model", "fp8"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_keys_only_refresh_writes_the_cache_a_whole_refresh_writes(dit, chunks_io, device, storage):  # noqa: F811
    """The cache refresh's last block only writes its keys and values (its output is not read): the same
    cache bit for bit, so the same next chunks (on CUDA through the same hand-written kernels)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = dit if device == "cpu" else copy.deepcopy(dit).to(device, dtype)
    io = {name: t.to(device, dtype if t.is_floating_point() else t.dtype) for name, t in chunks_io.items()}
    spec = CacheSpec(60, 10, storage, rolling=True, sink_frames=1)  # chunk 2 evicts after the sink
    whole, keys = (KVCache(spec, 2, 2, 16, dtype, device) for _ in range(2))
    graphs = ChunkGraphs(model)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    for c in range(3):
        for cache in (whole, keys):
            out = _graph_call(graphs, io, cache, c)
        assert torch.equal(out, _graph_call(graphs, io, whole, c))
        f = slice(3 * c, 3 * c + 3)
        args = (io["x_clean"][:, f][None], zero, [io["context"]], io["y"][:, f][None], io["cam"][:, :, f])
        assert graphs(*args, cache=whole, current_start=30 * c) is not None
        assert graphs(*args, cache=keys, current_start=30 * c, keys_only=True) is None
        assert (whole.global_end, whole.local_end) == (keys.global_end, keys.local_end)
        written = slice(0, whole.local_end)  # an FP8 store's other slots were never written (torch.empty)
        for which in ("k", "v", "k_scale", "v_scale") if storage == "fp8" else ("k", "v"):
            assert torch.equal(_stacked(whole, which, written), _stacked(keys, which, written)), (c, which)
