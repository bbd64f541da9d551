"""A causal rollout split over two ranks (worldgen.pipelines.two_gpu, worldgen.models.sequence_parallel): two real
processes on the CPU with the gloo backend give the one-process rollout of the golden tiny causal models (float32),
rolling KV cache included; a rank that dies makes the other fail with PeerLost, and nothing waits forever."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from contracts.model_families import V1_FAST, V2_FAST
from contracts.settings import GenerationSettings
from tests.worldgen.numerics import rel_l2
from worldgen.models.sequence_parallel import PeerLost, SequenceParallel
from worldgen.pipelines import fast_warm_up
from worldgen.pipelines.causal_pretrain import CausalPretrainPipeline
from worldgen.pipelines.fast import FastPipeline
from worldgen.pipelines.fast_plan import FastOptions
from worldgen.pipelines.two_gpu import use_two_devices
from worldgen.runtime.checkpoint import FAST_DIR, load_expert
from worldgen.runtime.residency import ModelSlot

SPLIT_TOL = 1e-6  # two ranks against one, float32: the same math, only GEMM row counts differ
LOOP_TOL = 5e-5  # golden README: loop latents against the reference
TIMEOUT_S = 30.0  # the tests' process-group timeout: a silent peer fails a collective within it


def _pipeline(dit, family, kind=FastPipeline):
    return kind(
        dit=ModelSlot("fast", lambda: dit), dit_config=dit.cfg, tokenizer=None, text_encoder=None, vae=None,
        device=torch.device("cpu"), text_len=dit.cfg.text_len, name="golden", family=family,
    )  # fmt: skip


def _rollout(pipe, io, options, **kwargs) -> torch.Tensor:
    chunks = pipe.rollout_chunks(io["noise"], io["y"], io["context"], io["plucker"], options, **kwargs)
    return torch.cat(list(chunks), dim=1)


@pytest.fixture(scope="module")
def v2_case(golden):
    root = golden / "v2" / "fast"
    spec = json.loads((root / "case.json").read_text())
    run = spec["cases"]["loop_rolling"]
    assert run["cache_rolls"] > 0  # the case rolls its cache: the split must keep the rolling rules
    settings = GenerationSettings(
        model="fast", shift=spec["shift"], attention_frames=run["local_attn_size"], sink_frames=run["sink_size"]
    )
    options = FastOptions.from_settings(settings, spec["frame_seqlen"], V2_FAST)
    options = FastOptions(**{**options.__dict__, "chunk_frames": spec["chunk_size"],
                             "timestep_indices": tuple(spec["timesteps_index"])})  # fmt: skip
    io = load_file(root / "inputs.safetensors")
    expected = load_file(root / "loop_rolling.safetensors")["latent_final"]
    return root / run["checkpoint"], io, options, expected


def test_the_token_split_pads_and_the_heads_exchange_needs_whole_groups():
    """Rank r of P holds rows [r*ceil(L/P), (r+1)*ceil(L/P)) of a chunk, zeros past its end (dropped later)."""
    x = torch.arange(5.0).view(1, 5, 1)
    assert SequenceParallel(0, 2).shard(x).flatten().tolist() == [0, 1, 2]
    assert SequenceParallel(1, 2).shard(x).flatten().tolist() == [3, 4, 0]
    cos = torch.ones(5, 2)
    assert SequenceParallel(1, 2).begin(x, (cos, cos))[1][0].shape == (3, 2)  # the RoPE rows follow the tokens
    with pytest.raises(ValueError, match="3 attention heads do not split over 2 ranks"):
        SequenceParallel(0, 2).attach(type("M", (), {"cfg": type("C", (), {"num_heads": 3})()})())


def test_two_ranks_give_the_one_process_rollout_of_lingbot_world_2_with_its_rolling_cache(v2_case):
    """The v2 causal-fast loop_rolling case (its window rolls, keeping the sink) on two gloo ranks equals the
    one-process rollout; so does the guided causal-pretrain loop (two KV caches a rank) on the same ranks."""
    checkpoint, io, options, expected = v2_case
    dit = load_expert(checkpoint, "cpu", torch.float32)
    pipe = _pipeline(dit, V2_FAST)
    one = _rollout(pipe, io, options, renoise_draws=io["renoise"])
    assert rel_l2(one, expected) < LOOP_TOL
    pretrain = _pipeline(dit, V2_FAST, CausalPretrainPipeline)
    pretrain.steps, pretrain.guide_scale = 3, 5.0
    negative = torch.randn(io["context"].shape, generator=torch.Generator().manual_seed(1))
    one_guided = _rollout(pretrain, io, options, negative_context=negative)

    handle = use_two_devices(pipe, functools.partial(load_expert, checkpoint, "cpu", torch.float32), ["cpu", "cpu"],
                             timeout_s=TIMEOUT_S, load_timeout_s=60)  # fmt: skip
    # whole captured forwards would skip handing rank 1 its call; the blocks' graphs keep the all-to-alls eager
    assert (pipe.use_chunk_graphs, pipe.use_block_graphs) == (False, True)
    try:
        two = _rollout(pipe, io, options, renoise_draws=io["renoise"])
        error = rel_l2(two, one)
        print(f"v2 loop_rolling: two ranks vs one rel-L2 {error:.2e}")
        assert error < SPLIT_TOL
        assert handle.leader.forwards == 3 * 5 - 1  # 3 chunks of 4 steps and a refresh, none after the last
        # the link's bytes as each end counted them: what rank 0 sent, rank 1 received, and back
        peer = handle.peer_stats()
        leader = handle.leader
        assert leader.sent_bytes > 0 and (peer["received_bytes"], peer["sent_bytes"]) == (
            leader.sent_bytes, leader.received_bytes,
        )  # fmt: skip
        assert peer["peak_allocated_bytes"] is None and peer["peak_rss_gib"] > 0  # the CPU: no CUDA figures
        # rank 1's clock: every forward it ran, its host's seconds (no GPU span or allocator on the CPU)
        clock = peer["clock"]
        assert clock["forwards"] == leader.forwards and clock["launch_s"] > 0 and clock["inputs_s"] >= 0
        assert clock["gpu_s"] is None and peer["alloc_retries"] is None
        pretrain.scale_out = handle
        two_guided = _rollout(pretrain, io, options, negative_context=negative)
        error = rel_l2(two_guided, one_guided)
        print(f"v2 causal-pretrain, 3 steps: two ranks vs one rel-L2 {error:.2e}")
        assert error < SPLIT_TOL
    finally:
        handle.close()
    assert handle.process is None


def test_two_ranks_give_the_one_process_rollout_of_fast_and_split_an_odd_chunk(golden):
    """v1 Fast's golden loop on two ranks equals the one-process rollout; then a chunk of 45 tokens (not
    whole halves: rank 1's last row is padding) with a rolling window and a sink, camera and all."""
    checkpoint = golden / "fast" / "lingbot-world-base-cam" / FAST_DIR
    io = load_file(golden / "fast" / "loop" / "io.safetensors")
    dit = load_expert(checkpoint, "cpu", torch.float32)
    pipe = _pipeline(dit, V1_FAST)
    one = _rollout(pipe, io, FastOptions(), renoise_draws=io["renoise"])
    g = torch.Generator().manual_seed(3)
    odd = {  # 9 latent frames of 6 x 10: 15 tokens a frame, 45 a chunk of 3
        "noise": torch.randn(16, 9, 6, 10, generator=g),
        "y": torch.randn(20, 9, 6, 10, generator=g),
        "context": io["context"],
        "plucker": torch.randn(1, 384, 9, 6, 10, generator=g),
    }
    rolling = FastOptions(cache_frames=5, sink_frames=2)  # 2 sink frames + 1 chunk: rolls from chunk 2 on
    one_odd = _rollout(pipe, odd, rolling, generator=torch.Generator().manual_seed(4))

    handle = use_two_devices(pipe, functools.partial(load_expert, checkpoint, "cpu", torch.float32), ["cpu", "cpu"],
                             timeout_s=TIMEOUT_S, load_timeout_s=60)  # fmt: skip
    try:
        error = rel_l2(_rollout(pipe, io, FastOptions(), renoise_draws=io["renoise"]), one)
        print(f"v1 Fast loop: two ranks vs one rel-L2 {error:.2e}")
        assert error < SPLIT_TOL
        two_odd = _rollout(pipe, odd, rolling, generator=torch.Generator().manual_seed(4))
        error = rel_l2(two_odd, one_odd)
        print(f"v1 Fast, 45-token chunks, rolling: two ranks vs one rel-L2 {error:.2e}")
        assert error < SPLIT_TOL
        # compiling ahead (what a CUDA pipeline's load runs) goes through both ranks with whole forwards: a
        # first-block-only forward on rank 0 left the ranks' collectives out of step (it hung on two H200s)
        ahead = GenerationSettings(model="fast", frame_num=17, size="64*128")
        fast_warm_up._forward_each_chunk(pipe, ahead, (64, 128), full=False)
        assert rel_l2(_rollout(pipe, io, FastOptions(), renoise_draws=io["renoise"]), one) < SPLIT_TOL
        # rank 0 gone without a word (its pipe closed): rank 1, idle between jobs, exits on its own
        handle.conn.close()
        handle.process.join(timeout=10)
        assert handle.process.exitcode == 3
    finally:
        handle.close()


@contextlib.contextmanager
def _split_rollout(v2_case) -> Iterator[tuple]:
    """(pipe, handle, chunks): the v2 case's pipeline split over two CPU ranks, its rollout's first chunk made; closed
    within 15 s after, whatever became of rank 1."""
    checkpoint, io, options, _ = v2_case
    pipe = _pipeline(load_expert(checkpoint, "cpu", torch.float32), V2_FAST)
    handle = use_two_devices(pipe, functools.partial(load_expert, checkpoint, "cpu", torch.float32), ["cpu", "cpu"],
                             timeout_s=TIMEOUT_S, load_timeout_s=60)  # fmt: skip
    try:
        chunks = pipe.rollout_chunks(io["noise"], io["y"], io["context"], io["plucker"], options,
                                     renoise_draws=io["renoise"])  # fmt: skip
        next(chunks)
        yield pipe, handle, chunks
    finally:
        began = time.monotonic()
        handle.close()
        assert time.monotonic() - began < 15


def test_a_rank_that_dies_mid_rollout_fails_the_other_with_peer_lost(v2_case):
    """Rank 1 killed after the first chunk: rank 0's next forward raises PeerLost at once (its collective's
    connection is closed), well within the group's timeout; the pipeline's next job starts rank 1 again."""
    _, io, options, expected = v2_case
    with _split_rollout(v2_case) as (pipe, handle, chunks):
        os.kill(handle.peer_pid, signal.SIGKILL)
        handle.process.join(timeout=10)
        began = time.monotonic()
        with pytest.raises(PeerLost, match="peer was lost|is gone"):
            next(chunks)
        assert time.monotonic() - began < TIMEOUT_S
        # the pipeline goes on: its next job starts a new rank 1 and runs (the reference's rollout)
        latent = _rollout(pipe, io, options, renoise_draws=io["renoise"])
        assert handle.starts == 2 and rel_l2(latent, expected) < LOOP_TOL


def test_a_rank_killed_while_the_other_waits_in_a_collective_is_named_with_its_pid(v2_case):
    """Rank 1 frozen, then killed a second into rank 0's chunk (rank 0 waits on it inside a collective, whose
    connection reset fails first, before any watch sees the process gone): the PeerLost names rank 1's pid."""
    with _split_rollout(v2_case) as (_, handle, chunks):
        pid = handle.peer_pid
        os.kill(pid, signal.SIGSTOP)
        killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
        killer.start()
        with pytest.raises(PeerLost, match=rf"rank 1 \(pid {pid}\) is gone"):
            next(chunks)
        killer.join()


def test_load_pipeline_with_two_devices_runs_a_fast_job_on_both(tmp_path):
    """`load_pipeline(devices=[a, b], model="fast")` (what `generate --gpus 0,1` asks for): the whole job
    (text, encode and decode on rank 0) gives the one-device video, each forward split with rank 1."""
    from worldgen.pipelines.loader import load_pipeline

    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    poses = torch.eye(4).repeat(21, 1, 1).numpy()
    intrinsics = torch.tensor([[400.0, 400.0, 416.0, 240.0]]).repeat(21, 1).numpy()
    job = (image, "a room", poses, intrinsics, settings)
    one = load_pipeline("tiny", device="cpu", model="fast", text_cache_dir=tmp_path).generate(*job)
    two = load_pipeline("tiny", devices=["cpu", "cpu"], model="fast", text_cache_dir=tmp_path)
    handle = two.scale_out
    try:
        assert two.engine["devices"] == ["cpu", "cpu"]
        # asked before any job (rank 1 maybe still loading): its "ready" is not taken for the answer
        assert two.scale_out.peer_stats(reset=True)["sent_bytes"] == 0
        two.use_chunk_graphs = True  # as bench_fast's 'g' entries set it: whole-forward graphs stay off on two ranks
        video = two.generate(*job)
        assert not two.chunk_graphs.allowed
        error = rel_l2(video, one)
        print(f"tiny Fast generate: two ranks vs one rel-L2 {error:.2e}")
        assert error < SPLIT_TOL
        assert handle.leader.forwards == 2 * 5 - 1  # 2 chunks: 4 steps each, one refresh between
        _check_link_bytes(two, handle)
        # rank 1 died between jobs: the next job starts a new one and runs, the same video
        os.kill(handle.peer_pid, signal.SIGKILL)
        handle.process.join(timeout=10)
        assert rel_l2(two.generate(*job), one) < SPLIT_TOL and handle.starts == 2
    finally:
        handle.close()
    assert handle.peer_stats_at_close["device"] == "cpu" and handle.peer_stats_at_close["peak_allocated_bytes"] is None


def _check_link_bytes(pipe, handle) -> None:
    """What crossed the link, as counted on both ends: per layer the q/k/v all-to-all and the output's (half
    of each buffer leaves the rank), the head's rows gathered, and rank 0's broadcasts on top of what it sent."""
    cfg, e = pipe.dit_config, 4  # float32
    rows = 3 * (64 // 16) * (96 // 16) // 2  # a chunk of 3 latent frames of 4 x 6 tokens, half a rank
    head = rows * cfg.out_dim * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2] * e
    full = cfg.num_layers * (3 + 1) * rows * cfg.dim * e // 2 + head
    keys_only = (cfg.num_layers - 1) * (3 + 1) * rows * cfg.dim * e // 2 + 2 * rows * cfg.dim * e // 2
    leader, peer = handle.leader, handle.peer_stats()
    assert leader.received_bytes == 8 * full + keys_only == peer["sent_bytes"]
    assert peer["received_bytes"] == leader.sent_bytes > leader.received_bytes  # the broadcasts are rank 0's


def test_a_rank_that_stops_answering_fails_the_other_with_peer_lost_within_the_timeout(v2_case):
    """Rank 1 frozen (SIGSTOP: alive, its connections open, silent): rank 0's collective gives up after the
    group's timeout with PeerLost; nothing waits forever, and closing does not wait for the frozen rank."""
    checkpoint, io, options, _ = v2_case
    pipe = _pipeline(load_expert(checkpoint, "cpu", torch.float32), V2_FAST)
    handle = use_two_devices(pipe, functools.partial(load_expert, checkpoint, "cpu", torch.float32), ["cpu", "cpu"],
                             timeout_s=5, load_timeout_s=60)  # fmt: skip
    try:
        chunks = pipe.rollout_chunks(io["noise"], io["y"], io["context"], io["plucker"], options,
                                     renoise_draws=io["renoise"])  # fmt: skip
        next(chunks)
        os.kill(handle.peer_pid, signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(PeerLost, match="peer was lost"):
            next(chunks)
        assert time.monotonic() - began < 5 + 10
    finally:
        began = time.monotonic()
        handle.close()
        assert time.monotonic() - began < 15


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_replay_the_blocks_as_graphs_and_give_the_one_gpu_video(tmp_path):
    """On two CUDA GPUs (NCCL) each rank replays its blocks as CUDA graphs between the attentions' all-to-alls
    (worldgen.models.block_graphs) and the tiny Fast job gives the one-GPU video."""
    from worldgen.pipelines.loader import load_pipeline

    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    poses = torch.eye(4).repeat(21, 1, 1).numpy()
    intrinsics = torch.tensor([[400.0, 400.0, 416.0, 240.0]]).repeat(21, 1).numpy()
    job = (image, "a room", poses, intrinsics, settings)
    one_pipe = load_pipeline("tiny", device="cuda:0", model="fast", text_cache_dir=tmp_path)
    one = one_pipe.generate(*job)
    assert "replay" in one_pipe.block_graphs.decisions
    del one_pipe
    two = load_pipeline("tiny", devices=["cuda:0", "cuda:1"], model="fast", text_cache_dir=tmp_path)
    try:
        video = two.generate(*job)
        assert "replay" in two.block_graphs.decisions, two.block_graphs.decisions
        error = rel_l2(video, one)
        print(f"tiny Fast on two GPUs, block graphs {two.block_graphs.decisions}: rel-L2 {error:.2e} from one GPU")
        assert error < 1e-2  # bf16: the split changes only the GEMMs' row counts
    finally:
        two.scale_out.close()


@contextlib.contextmanager
def _noted_region(path: Path) -> Iterator[None]:
    """A region for rank 1 (`TwoDevices.peer_region`): what ran inside it, profiled, noted with the process's pid."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield
    names = sorted({event.name for event in prof.events()})
    path.write_text(json.dumps({"pid": os.getpid(), "ops": names}))


@contextlib.contextmanager
def _failing_region() -> Iterator[None]:
    raise OSError("no room for the profile")
    yield


def test_rank_1_runs_a_region_around_its_half_of_the_forwards(tmp_path):
    """`peer_region`: what rank 0 runs around a rollout (the bench's profile), rank 1 runs around its half, in its own
    process, until asked to leave it (the region's work done before the call returns); one that fails is said, and the
    split goes on."""
    from worldgen.pipelines.loader import load_pipeline

    settings = GenerationSettings(model="fast", size="64*96", frame_num=21, seed=3)
    image = torch.linspace(0, 1, 3 * 64 * 96).view(64, 96, 3).mul(255).to(torch.uint8).numpy()
    job = (image, "a room", torch.eye(4).repeat(21, 1, 1).numpy(), np.tile([[400.0, 400.0, 32.0, 48.0]], (21, 1)))
    pipe = load_pipeline("tiny", devices=["cpu", "cpu"], model="fast", text_cache_dir=tmp_path)
    handle, noted = pipe.scale_out, tmp_path / "rank1.json"
    try:
        handle.peer_region(functools.partial(_noted_region, noted))
        video = pipe.generate(*job, settings)
        assert not noted.exists()  # still inside
        handle.peer_region(None)
        seen = json.loads(noted.read_text())
        assert seen["pid"] == handle.peer_pid and seen["pid"] != os.getpid()
        assert any("alltoall" in op or "all_to_all" in op for op in seen["ops"])  # its half of the forwards
        with pytest.raises(RuntimeError, match="rank 1's region: OSError: no room for the profile"):
            handle.peer_region(_failing_region)
        assert torch.equal(pipe.generate(*job, settings), video)  # rank 1 went on
        from bench.kernel_profile import profiled_ranks  # the benchmarks' profile of both ranks (--profile)

        with profiled_ranks(pipe, tmp_path / "profile.txt", "split"):
            pipe.generate(*job, settings)
        assert (tmp_path / "profile.txt").read_text().startswith("split: wall")
        assert (tmp_path / "profile-rank1.txt").read_text().startswith("split, rank 1: wall")
    finally:
        handle.close()
