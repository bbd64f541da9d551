"""LingBot-World-Fast against the reference (golden/fast), plus its loader, cache plans and decoding."""

from __future__ import annotations

import json
import shutil
import time
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.worldgen.numerics import rel_l2
from worldgen.errors import CheckpointError, InputError
from worldgen.models.kv_cache import CacheSpec, KVCache, plan_cache
from worldgen.pipelines.base import prepare_image
from worldgen.pipelines.camera import validate_action
from worldgen.pipelines.fast import FastPipeline, y_from_latent
from worldgen.pipelines.fast_conditioning import FastCamera, fast_camera
from worldgen.pipelines.fast_plan import FastOptions, camera_blocks, fast_frames, fast_schedule
from worldgen.runtime.checkpoint import FAST_DIR, find_fast_checkpoint, load_expert
from worldgen.runtime.residency import ModelSlot

DIT_TOL = 1e-5  # golden README: DiT outputs and KV caches
LOOP_TOL = 5e-5  # loop x0 / latents


@pytest.fixture(scope="module")
def fast_root(golden):
    return golden / "fast"


@pytest.fixture(scope="module")
def dit(fast_root):
    return load_expert(fast_root / "lingbot-world-base-cam" / FAST_DIR, "cpu", torch.float32)


@pytest.fixture(scope="module")
def chunks_io(fast_root):
    return load_file(fast_root / "dit_chunks" / "io.safetensors")


def _frames(t: torch.Tensor, c: int) -> torch.Tensor:
    return t[:, 3 * c : 3 * c + 3] if t.dim() == 4 else t[:, :, 3 * c : 3 * c + 3]


def _call(dit, io, cache, c, x="x", t=None):
    t = io["t_a"] if t is None else t
    out = dit(
        _frames(io[x], c)[None], t, [io["context"]], _frames(io["y"], c)[None], _frames(io["cam"], c),
        cache=cache, current_start=30 * c,
    )  # fmt: skip
    return out[0]


def _cache(spec: CacheSpec) -> KVCache:
    return KVCache(spec, num_layers=2, num_heads=2, head_dim=16, dtype=torch.float32, device="cpu")


def _stacked(cache: KVCache, which: str, tokens: slice = slice(None)) -> torch.Tensor:
    return torch.stack([getattr(layer, which)[0, tokens] for layer in cache.layers])


def test_case_a_causal_chunks_and_cache(dit, chunks_io):
    io = chunks_io
    cache = _cache(CacheSpec(60, 10))
    assert rel_l2(_call(dit, io, cache, 0), io["a_out_chunk0"]) < DIT_TOL
    assert rel_l2(_stacked(cache, "k", slice(0, 30)), io["a_cache_k_after_chunk0"]) < DIT_TOL
    assert rel_l2(_stacked(cache, "v", slice(0, 30)), io["a_cache_v_after_chunk0"]) < DIT_TOL
    assert rel_l2(_call(dit, io, cache, 1, t=io["t_b"]), io["a_out_chunk1"]) < DIT_TOL
    assert rel_l2(_stacked(cache, "k"), io["a_cache_k_final"]) < DIT_TOL
    assert rel_l2(_stacked(cache, "v"), io["a_cache_v_final"]) < DIT_TOL


def test_case_a_attention_window(dit, chunks_io):
    io = chunks_io
    cache = _cache(CacheSpec(60, 10, max_attention_tokens=40))
    _call(dit, io, cache, 0)
    out = _call(dit, io, cache, 1, t=io["t_b"])
    assert rel_l2(out, io["a_out_chunk1_window"]) < DIT_TOL
    # the window matters: the full-attention output is further away than the tolerance
    assert rel_l2(io["a_out_chunk1"], io["a_out_chunk1_window"]) > 10 * DIT_TOL


def test_case_d_rolling_cache_with_sink(dit, chunks_io, fast_root):
    io = chunks_io
    ends = json.loads((fast_root / "dit_chunks" / "case.json").read_text())["case_d"]
    cache = _cache(CacheSpec(60, 10, rolling=True, sink_frames=1))
    for c in range(3):
        assert rel_l2(_call(dit, io, cache, c), io[f"d_out_chunk{c}_noisy"]) < DIT_TOL
        clean = _call(dit, io, cache, c, x="x_clean", t=torch.zeros(1, dtype=torch.int64))
        assert rel_l2(clean, io[f"d_out_chunk{c}_t0"]) < DIT_TOL
        assert [cache.global_end, cache.local_end] == ends["global_local_end_index_after_each_chunk"][c]
    assert rel_l2(_stacked(cache, "k"), io["d_cache_k_final"]) < DIT_TOL
    assert rel_l2(_stacked(cache, "v"), io["d_cache_v_final"]) < DIT_TOL


@pytest.mark.parametrize("storage", ["model", "fp8"])
@pytest.mark.parametrize("evict", [7, 40, 50])
def test_a_rolling_shift_moves_the_kept_slots_as_a_copy_of_them_would(storage, evict):
    """The shift copies in pieces no longer than the eviction (no temporary): every kept slot, values and
    fp8 scales, lands where a copy of the whole kept range would put it; the sink and the rest stay."""
    from worldgen.models.kv_cache import _Step

    cache = KVCache(CacheSpec(100, 10, storage, rolling=True, sink_frames=1), 1, 2, 4, torch.float32, "cpu")
    layer = cache.layers[0]
    tensors = layer._tensors()
    for i, t in enumerate(tensors):  # distinct values in every slot (e4m3 holds small integers exactly)
        t.copy_((torch.arange(t.numel()).reshape(t.shape) % 200 + i).to(t.dtype))
    before = [t.clone() for t in tensors]
    sink, kept = 10, 90 - evict
    layer.shift(_Step(0, 0, 0, evict=evict, kept=kept, sink=sink))
    for t, old in zip(tensors, before, strict=True):
        assert torch.equal(t[:, sink : sink + kept].float(), old[:, sink + evict : sink + evict + kept].float())
        assert torch.equal(t[:, :sink].float(), old[:, :sink].float())
        assert torch.equal(t[:, sink + kept :].float(), old[:, sink + kept :].float())


@pytest.fixture(scope="module")
def loop_case(fast_root, dit):
    io = load_file(fast_root / "loop" / "io.safetensors")
    spec = json.loads((fast_root / "loop" / "case.json").read_text())
    pipe = FastPipeline(
        dit=ModelSlot("fast", lambda: dit),
        dit_config=dit.cfg,
        tokenizer=None,
        text_encoder=None,
        vae=None,
        device=torch.device("cpu"),
        text_len=dit.cfg.text_len,
        name="golden fast",
    )
    return pipe, io, spec


def test_loop_schedule(loop_case):
    _, io, spec = loop_case
    schedule = fast_schedule(spec["shift"], tuple(spec["timesteps_index"]))
    assert list(schedule.timesteps) == io["timesteps"].tolist() == spec["timesteps"]
    assert torch.equal(torch.tensor(schedule.sigmas_x0, dtype=torch.float32), io["sigmas_x0"])
    # add_noise takes the second of a repeated integer timestep; only entries 1.. are used
    assert torch.equal(torch.tensor(schedule.sigmas_add_noise[1:], dtype=torch.float32), io["sigmas_add_noise"][1:])


def test_loop_inputs(loop_case, lingbot_examples):
    _, io, spec = loop_case
    example = lingbot_examples / "00"
    poses, intrinsics = validate_action(np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"))
    with pytest.warns(UserWarning, match="whole chunks"):
        frames = fast_frames(spec["frame_num_requested"], len(poses), spec["chunk_size"])
    assert frames.frames == spec["frame_num_used"] and frames.latent_frames == spec["latent_grid"][0]
    image = prepare_image(example / "image.jpg", spec["max_area"])
    assert rel_l2(image, io["image_resized"]) < 1e-5
    plucker = fast_camera(poses, intrinsics, frames, spec["height"], spec["width"])
    assert rel_l2(plucker, io["plucker"]) < 1e-5
    # the camera a batch job's loop gets chunk by chunk is the whole camera's chunks, bit for bit
    by_chunk = FastCamera(poses, intrinsics, frames, spec["height"], spec["width"], chunk_frames=3)
    chunks = [by_chunk(c) for c in range(frames.latent_frames // 3)]
    assert all(chunk.shape[2] == 3 for chunk in chunks) and torch.equal(torch.cat(chunks, dim=2), plucker)
    assert rel_l2(y_from_latent(io["y_vae"], frames.frames), io["y"]) < 1e-6


def _rollout(pipe, io, options):
    chunks = pipe.rollout_chunks(
        io["noise"], io["y"], io["context"], io["plucker"], options, renoise_draws=io["renoise"]
    )
    return torch.cat(list(chunks), dim=1)


def test_loop_full_attention(loop_case):
    pipe, io, _ = loop_case
    assert rel_l2(_rollout(pipe, io, FastOptions()), io["latent_final"]) < LOOP_TOL


def test_loop_window_and_sink(loop_case):
    pipe, io, spec = loop_case
    case = spec["case_c"]
    options = FastOptions(max_attention_tokens=case["max_attention_size"], sink_frames=case["sink_size"])
    latent = _rollout(pipe, io, options)
    assert rel_l2(latent, io["window_latent_final"]) < LOOP_TOL
    assert rel_l2(io["latent_final"], io["window_latent_final"]) > 2 * LOOP_TOL  # the case tests the window


@pytest.mark.parametrize("storage", ["model", "fp8"])
def test_a_cache_of_the_attention_window_gives_the_whole_video_caches_latents(loop_case, storage):
    """With an attention window the plan holds only the window's frames (a rolling cache, no sink): the
    golden window case (4 of 9 latent frames) gives the same bits as the reference's whole-video cache."""
    pipe, io, spec = loop_case
    case = spec["case_c"]
    options = FastOptions(max_attention_tokens=case["max_attention_size"], sink_frames=case["sink_size"])
    frame_tokens, latent_frames = spec["frame_seqlen"], spec["latent_grid"][0]
    dims = dict(num_layers=pipe.dit_config.num_layers, num_heads=pipe.dit_config.num_heads)
    dims.update(head_dim=pipe.dit_config.head_dim, compute_dtype=torch.float32)
    window, why = plan_cache(
        latent_frames, frame_tokens, 3, room_bytes=None, mode="full" if storage == "model" else storage,
        sink_frames=case["sink_size"], max_attention_tokens=case["max_attention_size"], **dims,
    )  # fmt: skip
    assert window.capacity_tokens == 4 * frame_tokens and window.rolling and window.sink_frames == 0
    assert window.storage == storage and "the attention window's 4 latent frames" in why
    whole = CacheSpec(latent_frames * frame_tokens, frame_tokens, storage, True, 1, case["max_attention_size"])
    latents = []
    for pipe.cache_spec in (window, whole):
        try:
            latents.append(_rollout(pipe, io, options))
        finally:
            pipe.cache_spec = None
    assert torch.equal(latents[0], latents[1])
    if storage == "model":
        assert rel_l2(latents[0], io["window_latent_final"]) < LOOP_TOL


def test_the_cache_plan_holds_the_window_not_the_video_once_a_window_is_set():
    gib = 2**30
    window = 21 * 720  # 21 latent frames at 320x576, a 161-frame job (41 latent frames)
    spec, why = plan_cache(41, 720, 3, room_bytes=12 * gib, max_attention_tokens=window, **FULL_SIZE)
    assert spec.capacity_tokens == window and spec.storage == "model" and spec.rolling and spec.sink_frames == 0
    assert "attention window's 21 latent frames" in why and "rolling window with no attention sink" in spec.describe()
    # a window shorter than a chunk still holds the chunk; one as long as the video changes nothing
    spec, _ = plan_cache(41, 720, 3, room_bytes=None, max_attention_tokens=720, **FULL_SIZE)
    assert spec.capacity_tokens == 3 * 720
    spec, why = plan_cache(21, 720, 3, room_bytes=None, max_attention_tokens=window, sink_frames=1, **FULL_SIZE)
    assert spec.capacity_tokens == window and spec.sink_frames == 1 and "whole video" in why


def test_loop_progress_counts_steps_and_refreshes(loop_case):
    pipe, io, _ = loop_case
    seen = []
    chunks = pipe.rollout_chunks(
        io["noise"], io["y"], io["context"], io["plucker"], FastOptions(), renoise_draws=io["renoise"],
        progress=lambda phase, step, total: seen.append((step, total)),
    )  # fmt: skip
    next(chunks)
    # a chunk is handed out after its 4 steps, before its cache refresh; 3 chunks: 4+1, 4+1, 4 forwards
    assert seen[-1] == (4, 14)
    next(chunks)
    assert seen[-1] == (9, 14)
    next(chunks)
    assert seen[-1] == (14, 14)
    assert next(chunks, None) is None and seen[-1] == (14, 14)  # no refresh after the last chunk


@pytest.mark.parametrize("blocks", [1, 2])
def test_a_chunks_forwards_share_its_camera_modulation_and_give_the_same_latent(loop_case, blocks):
    pipe, io, _ = loop_case
    model = pipe.residency.use("fast")
    computed = []
    hook = model.blocks[0].cam_scale_layer.register_forward_hook(lambda *_: computed.append(1))
    try:
        pipe.camera_blocks = 0
        plain = _rollout(pipe, io, FastOptions())
        every_forward = len(computed)
        pipe.camera_blocks, computed[:] = blocks, []
        shared = _rollout(pipe, io, FastOptions())
    finally:
        pipe.camera_blocks = 0
        hook.remove()
    assert torch.equal(shared, plain)
    assert every_forward == 14 and len(computed) == 3  # 3 chunks: once each, not in each of their forwards
    assert model.camera_cache is None  # detached when the rollout ends


def test_a_rollout_computes_each_timesteps_conditioning_once_for_the_same_latent(loop_case):
    pipe, io, _ = loop_case
    model = pipe.residency.use("fast")
    projected = []
    hook = model.time_projection[1].register_forward_hook(lambda *_: projected.append(1))
    try:
        cached = _rollout(pipe, io, FastOptions())
        in_loop = len(projected)
        pipe.use_chunk_graphs, projected[:] = True, []  # graphs asked for (none on the CPU): no time cache
        each_forward = _rollout(pipe, io, FastOptions())
    finally:
        pipe.use_chunk_graphs = False
        hook.remove()
    assert in_loop == 5 and len(projected) == 14  # 4 steps and the refresh's 0 once each, not in 14 forwards
    assert torch.equal(cached, each_forward) and rel_l2(cached, io["latent_final"]) < LOOP_TOL
    assert model.time_cache is None  # detached when the rollout ends


def test_fp8_cache_stays_close(dit, chunks_io):
    io = chunks_io
    exact, fp8 = _cache(CacheSpec(60, 10)), _cache(CacheSpec(60, 10, storage="fp8"))
    _call(dit, io, exact, 0), _call(dit, io, fp8, 0)
    err = rel_l2(_call(dit, io, fp8, 1, t=io["t_b"]), _call(dit, io, exact, 1, t=io["t_b"]))
    assert 0 < err < 2e-2
    assert fp8.nbytes < 0.7 * exact.nbytes


def test_the_fp8_window_for_fp8_attention_is_the_stored_window_with_one_scale():
    """`update(fp8_window=True)` hands FP8 attention the cache's window re-scaled to one scale, made from
    the stored bytes: it dequantizes to the same values as the bf16 window within e4m3's rounding, its
    largest magnitude is the e4m3 maximum (the scale is the window's largest), and the slots written
    are the same bytes either way."""
    torch.manual_seed(0)
    spec = CacheSpec(40, 10, storage="fp8")
    k, v = (torch.randn(1, 20, 2, 8) * torch.logspace(-2, 1, 20).view(1, 20, 1, 1) for _ in range(2))
    windows, stored = [], []
    for fp8_window in (False, True):
        cache = KVCache(spec, 1, 2, 8, torch.float32, "cpu")
        cache.begin(0, 20)
        windows.append(cache.layers[0].update(k, v, fp8_window=fp8_window))
        stored.append(
            torch.cat([cache.layers[0].k[:, :20].view(torch.uint8), cache.layers[0].v[:, :20].view(torch.uint8)])
        )
    (k_exact, v_exact), (k_q, v_q) = windows
    for exact, quantized, original in ((k_exact, k_q, k), (v_exact, v_q, v)):
        assert quantized.data.dtype == torch.float8_e4m3fn and quantized.data.shape == exact.shape
        assert quantized.data.float().abs().max().item() == 448.0
        assert rel_l2(quantized.dequantize(torch.float32), exact) < 5e-2  # one e4m3 rounding more
        assert rel_l2(exact, original) < 5e-2
    assert torch.equal(stored[0], stored[1])


# -- frame counts ------------------------------------------------------------------------------------


def test_frame_counts_round_down_to_whole_chunks():
    with pytest.warns(UserWarning, match="generating 45 frames"):
        assert fast_frames(49, 1000, 3).frames == 45  # 13 latent frames -> 4 chunks of 3
    with pytest.warns(UserWarning, match="generating 69 frames"):
        assert fast_frames(81, 73, 3).frames == 69  # the poses cover 73 frames: 19 latent -> 18
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fast_frames(81, 1000, 3).frames == 81  # 21 latent frames: whole chunks, no warning
        assert fast_frames(81, None, 7).frames == 81
    with pytest.raises(InputError, match="at least 9 frames"):
        fast_frames(5, None, 3)


# -- KV-cache plans ---------------------------------------------------------------------------------

FULL_SIZE = dict(num_layers=40, num_heads=40, head_dim=128, compute_dtype=torch.bfloat16)  # the 14B model


def test_cache_plan_prefers_the_reference_then_fp8_then_rolling():
    gib = 2**30
    spec, _ = plan_cache(21, 1560, 3, room_bytes=None, **FULL_SIZE)
    assert spec.storage == "model" and spec.capacity_tokens == 32760 and not spec.rolling
    assert spec.bytes(**FULL_SIZE) == 2 * 40 * 32760 * 5120 * 2  # 26.8 GB, as the reference doc says
    spec, why = plan_cache(21, 1560, 3, room_bytes=14 * gib, **FULL_SIZE)
    assert spec.storage == "fp8" and not spec.rolling and "bf16 would not fit" in why
    spec, why = plan_cache(21, 1560, 3, room_bytes=8 * gib, **FULL_SIZE)
    assert spec.rolling and spec.sink_frames == 1 and (spec.capacity_tokens // 1560 - 1) % 3 == 0
    assert spec.bytes(**FULL_SIZE) <= 8 * gib and "rolling" in why
    with pytest.raises(ValueError, match="smallest rolling KV cache"):
        plan_cache(21, 1560, 3, room_bytes=1 * gib, **FULL_SIZE)


def _full_size_plan(budget_gib: float):
    """A FastPipeline with the real 14B config under a VRAM budget: planning only, no model loaded."""
    from worldgen.models.dit_config import DiTConfig
    from worldgen.runtime.memory import plan_memory
    from worldgen.runtime.residency import ModelSlot

    plan = plan_memory(torch.device("cuda"), budget_gib, expert_gib=8.9, checkpoint_kind="nf4", gpu_total_gib=80)
    empty = ModelSlot("none", lambda: None)
    return FastPipeline(
        dit=empty, dit_config=DiTConfig(), dtype=torch.bfloat16, tokenizer=None, text_encoder=empty, vae=empty,
        device=torch.device("cuda"), text_len=512, name="full size", plan=plan,
    )  # fmt: skip


def test_full_size_plan_at_24_gib_streams_in_strips_with_a_rolling_window():
    pipe = _full_size_plan(24)
    spec = pipe.plan_job(21, 58, 104, FastOptions())  # 480p, 81 frames (what the H100 run measured)
    assert spec.storage == "fp8" and spec.rolling and spec.capacity_tokens == 10 * 1508
    assert pipe.vae_cut.tiles == 2 and pipe.stream_encode
    assert "2 spatial tiles" in pipe.describe_plan() and "the first chunk's frames first" in pipe.describe_plan()
    # 720p: at 24 GiB no float32 decode fits beside the DiT and the smallest window; with the decoder's tiles parked
    # in host memory, in bf16, a 7-frame window does (said in the record); at 16 GiB nothing does, and it says why
    pipe = _full_size_plan(24)
    assert pipe.plan_job(21, 90, 160, FastOptions()).capacity_tokens == 7 * 3600
    assert pipe.vae_cut.parked and pipe.vae_dtype == torch.bfloat16 and "decodes in bf16" in pipe.describe_plan()
    with pytest.raises(InputError, match=r"At 720x1280 the Fast DiT \(8.9 GiB\).*no room for a KV cache"):
        _full_size_plan(16).plan_job(21, 90, 160, FastOptions())
    pipe = _full_size_plan(40)
    assert pipe.plan_job(21, 90, 160, FastOptions()).rolling and not pipe.vae_cut.parked  # with more memory


def test_a_plan_split_over_two_gpus_counts_each_ranks_half_of_the_heads():
    """Each rank's KV cache holds half the heads (worldgen.pipelines.two_gpu): at 24 GiB a GPU, the 480p job's
    whole 21 frames fit where one GPU holds a 10-frame window, and the reason says the figures are one rank's."""
    one = _full_size_plan(24)
    assert one.plan_job(21, 58, 104, FastOptions()).capacity_tokens == 10 * 1508
    two = _full_size_plan(24)
    two.ranks = 2
    spec = two.plan_job(21, 58, 104, FastOptions())
    assert two.cache_heads == 20 and spec.capacity_tokens > 10 * 1508
    print(f"two ranks at 24 GiB each: {spec.describe()} -- {two.cache_reason}")
    assert "each of 2 GPUs holds 20 of the 40 heads" in two.cache_reason
    # fp8 (a bf16 VAE): each rank's forward works on half the chunk's rows and its blocks' graphs may take what the
    # bf16 VAE leaves of float32's figures, so they run beside the same cache and tiles (eager, the forwards waited on
    # the link: docs/benchmarks.md, "Session 36"); one GPU keeps that room for the camera and its blocks eager
    planned = []
    for ranks in (1, 2):
        fp8 = _full_size_plan(24)
        fp8.ranks, fp8.vae_dtype = ranks, torch.bfloat16
        spec = fp8.plan_job(21, 58, 104, FastOptions())
        planned.append((spec.capacity_tokens, fp8.vae_cut.tiles, fp8.block_graph_room, fp8.camera_blocks))
    assert planned == [(10 * 1508, 2, False, 31), (21 * 1508, 2, True, 24)]
    assert "blocks replayed as CUDA graphs" in fp8.describe_plan()


def test_the_camera_modulation_is_kept_in_as_many_blocks_as_the_plan_has_room_for():
    assert camera_blocks(None, 4524, 5120, 40, torch.bfloat16) == 40  # no plan (the CPU): every block
    per_block = 1.1 * 2 * 4524 * 5120 * 2 / 2**30
    assert camera_blocks(40 * per_block, 4524, 5120, 40, torch.bfloat16) == 40
    # one block short: 39, the camera tokens (half a block) kept for the 40th
    assert camera_blocks(40 * per_block - 0.01, 4524, 5120, 40, torch.bfloat16) == 39
    assert camera_blocks(39.4 * per_block, 4524, 5120, 40, torch.bfloat16) == 38
    assert (
        camera_blocks(0.05, 4524, 5120, 40, torch.bfloat16) == 0 == camera_blocks(-2.0, 4524, 5120, 40, torch.bfloat16)
    )
    # 24 GiB at 480p: beside a bf16 VAE (fp8), the half of its float32 figures it leaves unused, kept through
    # the decodes; beside a float32 one (exact) none, but 8 from each chunk's first step to its decode
    exact = _full_size_plan(24)
    exact.plan_job(21, 58, 104, FastOptions())
    fp8 = _full_size_plan(24)
    fp8.vae_dtype = torch.bfloat16
    assert fp8.plan_job(21, 58, 104, FastOptions()) == exact.cache_spec  # the same KV cache either way
    saving = fp8.vae_cut.bf16_saving_gib
    assert saving == pytest.approx(3.01, abs=0.01)  # two 464x448 strips' decoder caches and push, halved
    assert fp8.camera_blocks == camera_blocks(saving, 4524, 5120, 40, torch.bfloat16) == 31
    assert (exact.camera_blocks, exact.camera_until_decode, fp8.camera_until_decode) == (7, True, False)
    assert "camera modulation kept a chunk in 31 of 40 blocks" in fp8.describe_plan()
    assert "until its decode" not in fp8.describe_plan()
    assert "in 7 of 40 blocks until its decode (one slab)" in exact.describe_plan()
    # no budget: what the card leaves beside everything resident; every block on an 80 GB card
    unlimited = _full_size_plan(None)
    unlimited.plan_job(21, 58, 104, FastOptions())
    assert unlimited.camera_blocks == 40 and not unlimited.decode_after_loop
    unlimited.plan_job(21, 58, 104, FastOptions(), streamed=False)
    assert not unlimited.decode_after_loop  # nothing to gain: chunks still decode as they are made


def test_a_batch_job_at_24_gib_decodes_after_the_loop_and_keeps_every_blocks_camera():
    # float32: 7 in the push of two 464x448 strips (8 in 464x464 ones', since the time taps' larger push: the slab is
    # freed for it; 8 and 16 ran, "Session 21")
    for vae_dtype, streamed_blocks in ((torch.float32, 7), (torch.bfloat16, 31)):
        streamed, batch = _full_size_plan(24), _full_size_plan(24)
        streamed.vae_dtype = batch.vae_dtype = vae_dtype
        streamed.plan_job(21, 58, 104, FastOptions())
        spec = batch.plan_job(21, 58, 104, FastOptions(), streamed=False)
        # the same KV cache and tiles (so the same video); the decoder's room goes to the camera
        assert spec == streamed.cache_spec and batch.decode_tile_pixels == streamed.decode_tile_pixels
        assert (streamed.camera_blocks, streamed.decode_after_loop) == (streamed_blocks, False)
        # a streamed exact job (no block kept through the decodes) keeps 7 blocks from each chunk's first step
        # to its decode, in one slab freed whole for the decoder's push (measured: 8 and 16 ran, "Session 21")
        assert streamed.camera_until_decode == (vae_dtype == torch.float32)
        assert (batch.camera_blocks, batch.decode_after_loop) == (40, True)
        assert "in 40 of 40 blocks" in batch.describe_plan() and "after the loop" in batch.describe_plan()
        assert "after the loop" not in streamed.describe_plan() and not batch.camera_until_decode
        assert ("until its decode (one slab)" in streamed.describe_plan()) == streamed.camera_until_decode
    # the decode overlap (the default) costs the batch job nothing: it decodes after the loop, no second stream;
    # a streamed one decodes each chunk on the second stream, with the same KV cache, cut and camera blocks
    overlap, plain = _full_size_plan(24), _full_size_plan(24)
    overlap.vae_dtype = plain.vae_dtype = torch.bfloat16
    assert overlap.overlap_decode and not overlap.use_chunk_graphs  # the defaults
    plain.overlap_decode = False
    overlap.plan_job(21, 58, 104, FastOptions(), streamed=False)
    assert overlap.decode_after_loop and not overlap.graph_room
    spec = overlap.plan_job(21, 58, 104, FastOptions())
    assert not overlap.decode_after_loop and overlap.graph_room
    assert spec == plain.plan_job(21, 58, 104, FastOptions()) and not plain.graph_room
    assert (overlap.vae_cut, overlap.camera_blocks) == (plain.vae_cut, plain.camera_blocks)
    # chunk graphs asked for keep their pool's room beside the loop, a batch job's too
    graphs = _full_size_plan(24)
    graphs.vae_dtype, graphs.use_chunk_graphs = torch.bfloat16, True
    graphs.plan_job(21, 58, 104, FastOptions(), streamed=False)
    assert not graphs.decode_after_loop and graphs.graph_room


def test_rolling_cache_runs_a_video_longer_than_itself(loop_case):
    pipe, io, _ = loop_case
    pipe.cache_spec = CacheSpec(70, 10, storage="fp8", rolling=True, sink_frames=1)  # 7 frames for 9
    try:
        latent = _rollout(pipe, io, FastOptions())
    finally:
        pipe.cache_spec = None
    assert latent.shape == io["latent_final"].shape and torch.isfinite(latent).all()
    # chunks 0 and 1 fit whole, so they equal the reference up to FP8 rounding
    assert rel_l2(latent[:, :6], io["latent_final"][:, :6]) < 5e-2


# -- loader errors -----------------------------------------------------------------------------------


def _base_folder(tmp_path, fast_root):
    from worldgen.runtime.tiny import ensure_tiny_checkpoint

    root = tmp_path / "base"
    shutil.copytree(ensure_tiny_checkpoint("bf16"), root, ignore=shutil.ignore_patterns("lingbot_world_fast*"))
    return root


def test_fast_folder_found_inside_the_base_folder_or_on_its_own(tmp_path, fast_root):
    root = _base_folder(tmp_path, fast_root)
    with pytest.raises(CheckpointError, match=f"expected {FAST_DIR}/ inside it"):
        find_fast_checkpoint(root)
    shutil.copytree(fast_root / "lingbot-world-base-cam" / FAST_DIR, root / FAST_DIR)
    layout = find_fast_checkpoint(root)
    assert layout.experts == {"fast": root / FAST_DIR} and layout.kind == "bf16" and layout.t5.exists()
    assert find_fast_checkpoint(root / FAST_DIR).experts == layout.experts


def test_partial_fast_folder_errors_name_the_file(tmp_path, fast_root):
    root = _base_folder(tmp_path, fast_root)
    folder = root / FAST_DIR
    shutil.copytree(fast_root / "lingbot-world-base-cam" / FAST_DIR, folder)
    (folder / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match="00002-of-00002.safetensors listed in .* is missing; the download is partial"
    ):
        find_fast_checkpoint(root)
    shutil.rmtree(folder)
    folder.mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        find_fast_checkpoint(root)


def test_fast_folder_alone_needs_the_shared_parts(tmp_path, fast_root):
    alone = tmp_path / FAST_DIR
    shutil.copytree(fast_root / "lingbot-world-base-cam" / FAST_DIR, alone)
    with pytest.raises(CheckpointError, match="umT5.*put lingbot_world_fast/ inside the lingbot-world-base-cam"):
        find_fast_checkpoint(alone)


# -- chunk-by-chunk decoding and the whole path on the tiny model -----------------------------------


@pytest.mark.parametrize("tile_pixels", [None, 24 * 24])
def test_streamed_decode_equals_whole_decode(tile_pixels):
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE
    from worldgen.models.vae_tiling import StreamingDecoder, decode_tiled

    torch.manual_seed(0)
    import dataclasses

    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8, num_res_blocks=1)).eval()
    latent = torch.randn(1, 16, 6, 4, 6)
    whole = decode_tiled(vae, latent, tile_pixels, overlap=16)
    decoder = StreamingDecoder(vae, tile_pixels, overlap=16)
    pieces = [decoder.push(latent[:, :, i : i + 3]) for i in (0, 3)]
    assert [p.shape[2] for p in pieces] == [9, 12]
    assert torch.equal(torch.cat(pieces, dim=2), whole)


@pytest.mark.parametrize("tile_pixels", [None, 24 * 24])
def test_streamed_encode_equals_whole_encode(tile_pixels):
    """The Fast loop encodes each chunk's conditioning frames as it goes: 9 frames, then 12 at a time."""
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE
    from worldgen.models.vae_tiling import StreamingEncoder, encode_tiled

    torch.manual_seed(0)
    import dataclasses

    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8, num_res_blocks=1)).eval()
    video = torch.rand(1, 3, 21, 32, 48) * 2 - 1
    whole = encode_tiled(vae, video, tile_pixels, overlap=16)
    encoder = StreamingEncoder(vae, tile_pixels, overlap=16)
    pieces = [encoder.push(video[:, :, a:b]) for a, b in ((0, 9), (9, 21))]
    assert [p.shape[2] for p in pieces] == [3, 3]
    assert torch.equal(torch.cat(pieces, dim=2), whole)
    assert encoder.cache_bytes() > 0
    with pytest.raises(InputError, match="4k frames"):
        encoder.push(video[:, :, :3])


@pytest.mark.slow
def test_tiny_fast_generates_chunk_by_chunk(lingbot_examples):
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline

    pipe = load_pipeline("tiny", device="cpu", model="fast")
    example = lingbot_examples / "00"
    seen, plans = [], []
    pipe.on_plan = plans.append
    settings = GenerationSettings(size="32*48", frame_num=25, seed=3)
    video = pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"),
        settings, on_chunk=lambda i, n, frames: seen.append((i, n, frames.clone())),
    )  # fmt: skip
    assert [(i, n) for i, n, _ in seen] == [(0, 2), (1, 2)]
    assert pipe.chunk_timings[1]["encode"] > 0  # chunk 1 encodes the rest of the conditioning frames
    assert torch.equal(torch.cat([f for *_, f in seen], dim=1), video) and video.shape[1] == 21
    assert "kv cache" in plans[-1] and "Fast DiT" in pipe.name + plans[-1]
    streamed = []  # what each job told its plan: a job without on_chunk is a batch job (`generate`'s CLI)
    plan_job = pipe.plan_job
    pipe.plan_job = lambda *args, **kwargs: (streamed.append(kwargs["streamed"]), plan_job(*args, **kwargs))[1]
    again = pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), settings
    )
    pipe.plan_job = plan_job
    assert streamed == [False] and not pipe.decode_after_loop  # no budget on the CPU: nothing to gain
    assert torch.equal(again, video)  # seeded: a non-streamed run is the same video
    # a batch job whose plan decodes after the loop (as a 24 GiB card's does): the same video, and the
    # chunks come after the last forward, each with a decode step
    events = []
    pipe.plan_job = _plan_with(plan_job, pipe, decode_after_loop=True)
    batch = pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"),
        settings, progress=lambda phase, done, total: events.append((phase, done)),
        on_chunk=lambda i, n, frames: events.append(("chunk", i)), stream=False,
    )  # fmt: skip
    pipe.plan_job = plan_job
    assert torch.equal(batch, video) and "chunk by chunk after the loop" in plans[-1]
    last_forward = max(i for i, (phase, _) in enumerate(events) if phase == "denoise")
    assert events[last_forward + 1 :] == [("chunk", 0), ("decode", 1), ("chunk", 1), ("decode", 2)]
    assert [t["decode"] > 0 for t in pipe.chunk_timings] == [True, True]
    assert "the first chunk's frames first" in plans[-1]  # conditioning encoded as the loop goes
    # a streamed job whose chunk's camera modulation is freed before each decode (24 GiB, exact): the same video
    pipe.plan_job = _plan_with(plan_job, pipe, camera_blocks=1, camera_until_decode=True)
    freed = pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), settings
    )
    assert torch.equal(freed, video) and "1 of 2 blocks until its decode" in plans[-1]
    pipe.plan_job = _plan_with(plan_job, pipe, stream_encode=False)
    up_front = pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), settings
    )
    assert "every frame before the loop" in plans[-1]
    assert torch.equal(up_front, video)  # the streamed encoder gives the whole-video encoder's latents
    pipe.plan_job = plan_job
    # a live camera that ends after chunk 0: the video is that chunk's frames, the same as in the whole run
    from worldgen.pipelines.fast_conditioning import fast_camera
    from worldgen.pipelines.fast_plan import FastOptions, fast_frames

    poses, intrinsics = np.load(example / "poses.npy"), np.load(example / "intrinsics.npy")
    n = FastOptions().chunk_frames
    plucker = fast_camera(poses, intrinsics, fast_frames(25, len(poses), n), *video.shape[2:])

    def late_camera(c: int) -> torch.Tensor | None:  # chunk 0's poses come 0.5 s late; the job ends after it
        if c:
            return None
        time.sleep(0.5)
        return plucker[:, :, :n]

    short = pipe.generate(example / "image.jpg", "a room", None, None, settings, camera=late_camera)
    assert torch.equal(short, seen[0][2]) and short.is_contiguous()
    (timing,) = pipe.chunk_timings  # the wait for the poses is the chunk's own part, not its DiT's
    parts = ("dit", "encode", "decode", "poses")
    assert timing["poses"] >= 0.5 and timing["wall"] == pytest.approx(sum(timing[k] for k in parts), abs=1e-6)
    # a live camera for the whole job: the same video, every conditioning frame encoded at chunk 0 while
    # its poses are on their way (no later chunk carries an encode)
    live = pipe.generate(
        example / "image.jpg", "a room", None, None, settings, camera=lambda c: plucker[:, :, c * n : (c + 1) * n]
    )
    assert torch.equal(live, video)
    assert pipe.chunk_timings[0]["encode"] > 0 and pipe.chunk_timings[1]["encode"] == 0


def _plan_with(plan_job, pipe, **chosen):
    """The plan as chosen, except the pipeline attributes `chosen`: what another budget or job gets (every
    conditioning frame encoded before the loop where the streamed encoder does not fit: `stream_encode=False`;
    a batch job's chunks decoded after the loop: `decode_after_loop=True`)."""

    def plan(*args, **kwargs):
        spec = plan_job(*args, **kwargs)
        for name, value in chosen.items():
            setattr(pipe, name, value)
        pipe.on_plan(pipe.describe_plan())
        return spec

    return plan


def test_doctor_reports_the_fast_folder(tmp_path, fast_root):
    import subprocess
    import sys

    from tests.conftest import REPO

    root = _base_folder(tmp_path, fast_root)

    def doctor():
        return subprocess.run([sys.executable, "-m", "lingbot_cli", "doctor", "--ckpt-dir", str(root)], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    result = doctor()
    assert "fast     not installed (optional)" in result.stdout and result.returncode in (0, 1)
    base_rc = result.returncode  # whatever the other checks say about this machine
    shutil.copytree(fast_root / "lingbot-world-base-cam" / FAST_DIR, root / FAST_DIR)
    result = doctor()
    assert "LingBot-World-Fast, bf16 (--model fast)" in result.stdout and result.returncode == base_rc
    (root / FAST_DIR / "diffusion_pytorch_model-00001-of-00002.safetensors").unlink()
    result = doctor()
    assert "fast     PROBLEM" in result.stdout and "download is partial" in result.stdout and result.returncode == 1


def test_quantize_converts_the_fast_folder_to_nf4(tmp_path, fast_root):
    from worldgen.runtime.quantize import quantize_checkpoint

    root = _base_folder(tmp_path, fast_root)
    shutil.copytree(fast_root / "lingbot-world-base-cam" / FAST_DIR, root / FAST_DIR)
    report = quantize_checkpoint(root, tmp_path / "nf4", torch.device("cpu"), show_progress=False)
    assert any(line.startswith("lingbot_world_fast_bnb_nf4/model.safetensors") for line in report)
    layout = find_fast_checkpoint(tmp_path / "nf4")
    assert layout.kind == "nf4" and layout.experts["fast"].name == "lingbot_world_fast_bnb_nf4"
    nf4 = load_expert(layout.experts["fast"], "cpu", torch.float32)
    bf16 = load_expert(root / FAST_DIR, "cpu", torch.float32)
    io = load_file(fast_root / "dit_chunks" / "io.safetensors")
    outs = [_call(m, io, _cache(CacheSpec(60, 10)), 0) for m in (nf4, bf16)]
    # NF4 rounding of a dim-32 model compounds to ~0.3 here; another model's output is ~1.4 away
    assert 0 < rel_l2(*outs) < 0.5
    q = nf4.blocks[0].self_attn.q
    weight = bf16.blocks[0].self_attn.q.weight
    # NF4 (blocksize 64, double quant) of a 32x32 Gaussian is ~0.15 off; these weights are heavier-tailed
    assert rel_l2(q(torch.eye(32)).T - q.bias[:, None], weight) < 0.3


def test_an_nf4_dit_holds_its_8bit_weights_where_the_plan_leaves_room():
    """`fast_plan.hold_planned_weights`: without a budget (an 80 GB card) every block of the NF4 14B holds its fp8
    weights beside the NF4 bytes (no NF4 -> e4m3 pass a Linear and forward), said in the plan; exact holds none; under
    24 GiB what the loop's fit leaves after the camera's kept blocks decides (the KV cache and the camera come first)."""
    from worldgen.pipelines.fast_plan import held_block_gib

    unlimited = _full_size_plan(None)
    unlimited.compute = "fp8"
    unlimited.plan_job(21, 58, 104, FastOptions())
    assert unlimited.held_blocks == 40
    assert "fp8 weights held beside the NF4 ones in 40 blocks" in unlimited.describe_plan()
    exact = _full_size_plan(None)
    exact.plan_job(21, 58, 104, FastOptions())
    assert exact.held_blocks == 0 and "weights held" not in exact.describe_plan()
    for ranks in (1, 2):
        fp8 = _full_size_plan(24)
        fp8.ranks, fp8.vae_dtype, fp8.compute = ranks, torch.bfloat16, "fp8"
        fp8.plan_job(21, 58, 104, FastOptions())
        camera = fp8.camera_blocks * 1.1 * 2 * fp8.rank_rows(4524) * 5120 * 2 / 2**30
        assert fp8.held_blocks == max(0, int((fp8.loop_left_gib - camera - 0.5) // held_block_gib(fp8.dit_config)))
