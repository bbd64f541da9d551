"""LingBot-World 2.0 against the reference (golden/v2): causal-fast with the whole-video and rolling
caches, a 1.3B-shaped DiT read from its own config.json, and causal-pretrain with guidance. Every
setting (example, sizes, chunk size, window, sink, shift, steps, guidance) is read from the case files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from contracts.checkpoint_layout import find_model, find_v2_checkpoint
from contracts.model_families import V2_FAST, V2_PRETRAIN, dit_size, family_for
from tests.worldgen.numerics import rel_l2
from worldgen.errors import CheckpointError
from worldgen.models.kv_cache import CacheSpec
from worldgen.pipelines.base import prepare_image
from worldgen.pipelines.camera import validate_action
from worldgen.pipelines.causal_pretrain import NEGATIVE_PROMPT, CausalPretrainPipeline
from worldgen.pipelines.fast import FastPipeline
from worldgen.pipelines.fast_conditioning import fast_camera
from worldgen.pipelines.fast_plan import FastOptions, fast_frames, fast_schedule, full_cache_spec
from worldgen.runtime.checkpoint import load_expert
from worldgen.runtime.residency import ModelSlot

DIT_TOL = 1e-5  # golden README, v2/: DiT outputs and KV caches
LOOP_TOL = 5e-5  # x0 and latents
PRETRAIN_TOL = 2e-5  # causal_pretrain's sample steps and latent_final


@pytest.fixture(scope="module")
def v2_root(golden):
    return golden / "v2"


def _pipeline(kind, dit, family):
    return kind(
        dit=ModelSlot("fast", lambda: dit), dit_config=dit.cfg, tokenizer=None, text_encoder=None, vae=None,
        device=torch.device("cpu"), text_len=dit.cfg.text_len, name="golden v2", family=family,
    )  # fmt: skip


def _shared(v2_root):
    return v2_root.parent.parent  # paths in case.json are relative to shared/


def test_fast_inputs_follow_the_case(v2_root):
    spec = json.loads((v2_root / "fast" / "case.json").read_text())
    io = load_file(v2_root / "fast" / "inputs.safetensors")
    shared = _shared(v2_root)
    poses, intrinsics = validate_action(np.load(shared / spec["poses"]), np.load(shared / spec["intrinsics"]))
    with pytest.warns(UserWarning, match="whole chunks"):
        frames = fast_frames(spec["frame_num_requested"], len(poses), spec["chunk_size"])
    assert (frames.frames, frames.latent_frames) == (spec["frame_num_used"], spec["latent_grid"][0])
    assert rel_l2(prepare_image(shared / spec["image"], spec["max_area"]), io["image_resized"]) < 1e-5
    plucker = fast_camera(poses, intrinsics, frames, spec["height"], spec["width"])
    assert rel_l2(plucker, io["plucker"]) < 1e-5
    schedule = fast_schedule(spec["shift"], tuple(spec["timesteps_index"]))
    assert list(schedule.timesteps) == io["timesteps"].tolist() == spec["timesteps"]


def test_the_families_defaults_are_the_reference_generate_defaults():
    """generate.py's own defaults (the golden README's v2/ section), which the family rows state once."""
    assert (V2_FAST.chunk_frames, V2_FAST.timestep_indices) == (4, (0, 250, 500, 750))
    assert (V2_PRETRAIN.chunk_frames, V2_PRETRAIN.guidance_steps, V2_PRETRAIN.guide_scale) == (4, 40, 5.0)


@pytest.mark.parametrize("case", ["loop_global", "loop_rolling", "loop_1p3b"])
def test_fast_loop(v2_root, case):
    """The chunk loop with the case's chunk, steps, shift, window (local_attn_size) and sink, through the
    settings a job gives (`FastOptions.from_settings` with the v2 family's window rule)."""
    spec = json.loads((v2_root / "fast" / "case.json").read_text())
    run = spec["cases"][case]
    io = load_file(v2_root / "fast" / "inputs.safetensors")
    out = load_file(v2_root / "fast" / f"{case}.safetensors")
    dit = load_expert(v2_root / "fast" / run["checkpoint"], "cpu", torch.float32)
    assert {k: getattr(dit.cfg, k) for k in run["model_dims"]} == run["model_dims"]  # its sizes: its config.json
    family = family_for(v2_root / "fast" / run["checkpoint"].split("/")[0], "fast")
    assert family is V2_FAST
    from contracts.settings import GenerationSettings

    window = max(run["local_attn_size"], 0)
    settings = GenerationSettings(
        model="fast", shift=spec["shift"], attention_frames=window, sink_frames=run["sink_size"]
    )
    options = FastOptions.from_settings(settings, spec["frame_seqlen"], family)
    options = FastOptions(**{**options.__dict__, "chunk_frames": spec["chunk_size"],
                             "timestep_indices": tuple(spec["timesteps_index"])})  # fmt: skip
    cache = full_cache_spec(spec["latent_grid"][0], spec["frame_seqlen"], options)
    assert cache.capacity_tokens == run["kv_cache_tokens"] and cache.rolling == (run["cache_rolls"] > 0)
    pipe = _pipeline(FastPipeline, dit, family)
    steps = []
    latent = torch.cat(
        list(
            pipe.rollout_chunks(
                io["noise"],
                io["y"],
                io["context"],
                io["plucker"],
                options,
                renoise_draws=io["renoise"],
                progress=lambda *a: steps.append(a),
            )
        ),  # fmt: skip
        dim=1,
    )
    assert rel_l2(latent, out["latent_final"]) < LOOP_TOL
    if case != "loop_global":  # the window and sink change the result: the case tests them
        whole = load_file(v2_root / "fast" / "loop_global.safetensors")["latent_final"]
        assert rel_l2(whole, out["latent_final"]) > 4 * LOOP_TOL


def test_a_rolling_cache_is_the_reference_window_in_the_plan():
    from worldgen.models.kv_cache import plan_cache

    spec, why = plan_cache(
        90, 1560, 4, room_bytes=None, num_layers=30, num_heads=12, head_dim=128, compute_dtype=torch.bfloat16,
        sink_frames=6, cache_frames=18,
    )  # fmt: skip
    assert spec == CacheSpec(18 * 1560, 1560, "model", True, 6, None)
    assert "rolling window of 18 latent frames (6-frame sink)" in why
    tight, why = plan_cache(
        90, 1560, 4, room_bytes=8 * 2**30, num_layers=40, num_heads=40, head_dim=128, compute_dtype=torch.bfloat16,
        sink_frames=6, cache_frames=18,
    )  # fmt: skip
    assert tight.storage == "fp8" and tight.sink_frames == 6 and tight.capacity_tokens < 18 * 1560
    assert "rolling FP8 window" in why
    # a room for 6 frames (the 14B at 464x832 under 24 GiB): the 6-frame sink and a 4-frame chunk do not fit, so
    # the sink shrinks to what does, and the record says so
    per_frame = tight.planned_bytes(40, 40, 128, torch.bfloat16) / (tight.capacity_tokens // 1560)
    small, why = plan_cache(
        90, 1560, 4, room_bytes=6.5 * per_frame, num_layers=40, num_heads=40, head_dim=128, compute_dtype=torch.bfloat16,
        sink_frames=6, cache_frames=18,
    )  # fmt: skip
    assert (small.capacity_tokens // 1560, small.sink_frames) == (6, 2) and "the sink cut from 6 to 2" in why


def test_causal_pretrain_loop(v2_root):
    spec = json.loads((v2_root / "causal_pretrain" / "case.json").read_text())
    io = load_file(v2_root / "causal_pretrain" / "io.safetensors")
    dit = load_expert(v2_root / "causal_pretrain" / spec["checkpoint"], "cpu", torch.float32)
    family = family_for(v2_root / "causal_pretrain" / "ckpt", "causal")
    assert family is V2_PRETRAIN and spec["negative_prompt"] == NEGATIVE_PROMPT  # hard-coded by the reference
    pipe = _pipeline(CausalPretrainPipeline, dit, family)
    pipe.steps, pipe.guide_scale = spec["sampling_steps"], spec["guide_scale"]
    options = FastOptions(shift=spec["shift"], chunk_frames=spec["chunk_size"])
    latent = torch.cat(
        list(
            pipe.rollout_chunks(
                io["noise"], io["y"], io["context"], io["plucker"], options, negative_context=io["context_null"]
            )
        ),  # fmt: skip
        dim=1,
    )
    assert rel_l2(latent, io["latent_final"]) < PRETRAIN_TOL
    chunk = spec["chunk_size"]
    assert rel_l2(latent[:, :chunk], io["sample_steps"][1, 0]) > 0  # chunk 1 starts from its own noise
    assert torch.equal(io["sample_steps"][1, 0], io["noise"][:, chunk : 2 * chunk])


def test_v2_folders_are_recognised_with_their_size_and_assets(tmp_path, v2_root):
    import shutil

    fast = v2_root / "fast" / "ckpt_14b"
    small = tmp_path / "lingbot-world-v2-1.3b-causal-fast"
    shutil.copytree(v2_root / "fast" / "ckpt_1p3b", small)
    assert dit_size(small / "transformers" / "config.json") == "dim 24, 3 layers"
    with pytest.raises(CheckpointError, match=r"--assets-dir with the 14B causal-fast folder") as info:
        find_v2_checkpoint(small, V2_FAST)
    assert str(small) in str(info.value)  # where it looked
    with pytest.raises(CheckpointError, match="--model fast"):
        find_model(small, "base")
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ("models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"):
        (assets / name).write_bytes(b"x")
    (assets / "google" / "umt5-xxl").mkdir(parents=True)
    (assets / "google" / "umt5-xxl" / "tokenizer.json").write_text("{}")
    family, layout = find_model(small, "fast", assets)
    assert family is V2_FAST and layout.root == assets and layout.experts["fast"] == small / "transformers"
    sibling = tmp_path / "lingbot-world-v2-14b-causal-fast"
    shutil.move(assets, sibling)
    assert find_model(small, "fast")[1].root == sibling  # the 14B download beside it
    shard = next((small / "transformers").glob("*-00002-*.safetensors"))
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shard {shard.name} .* is missing"):
        find_model(small, "fast", sibling)
    assert family_for(fast, "fast") is V2_FAST


def test_quantize_converts_a_v2_download_its_dit_alone(tmp_path, v2_root):
    """A 1.3B download (its DiT alone): `quantize` writes `transformers_bnb_nf4/`, which the layout rule
    then prefers, with the shared parts still taken from the 14B folder beside it."""
    import shutil

    from worldgen.runtime.quantize import quantize_checkpoint

    small = tmp_path / "lingbot-world-v2-1.3b-causal-fast"
    shutil.copytree(v2_root / "fast" / "ckpt_1p3b", small)
    report = quantize_checkpoint(small, tmp_path / "out", torch.device("cpu"), show_progress=False)
    assert len(report) == 1 and report[0].startswith("transformers_bnb_nf4/model.safetensors")
    shutil.move(tmp_path / "out" / "transformers_bnb_nf4", small / "transformers_bnb_nf4")
    assets = tmp_path / "lingbot-world-v2-14b-causal-fast"
    (assets / "google" / "umt5-xxl").mkdir(parents=True)
    (assets / "google" / "umt5-xxl" / "tokenizer.json").write_text("{}")
    for name in ("models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"):
        (assets / name).write_bytes(b"x")
    family, layout = find_model(small, "fast")
    assert family is V2_FAST and layout.kind == "nf4" and layout.experts["fast"].name == "transformers_bnb_nf4"
    nf4 = load_expert(layout.experts["fast"], "cpu", torch.float32)
    bf16 = load_expert(small / "transformers", "cpu", torch.float32)
    assert nf4.cfg == bf16.cfg and (nf4.cfg.dim, nf4.cfg.num_layers) == (24, 3)  # the shape: its own config.json
    io = load_file(v2_root / "fast" / "inputs.safetensors")
    outs = []
    for model in (nf4, bf16):
        cache = _one_chunk_cache(model)
        chunk = slice(0, 4)
        x, y, cam = io["noise"][:, chunk][None], io["y"][:, chunk][None], io["plucker"][:, :, chunk]
        outs.append(model(x, torch.tensor([999]), [io["context"]], y, cam, cache=cache, current_start=0)[0])
    assert 0 < rel_l2(*outs) < 0.5  # NF4 rounding of a tiny model (as the v1 Fast test measures)


def _one_chunk_cache(model):
    from worldgen.models.kv_cache import KVCache

    cfg = model.cfg
    return KVCache(CacheSpec(72, 6), cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.float32, "cpu")


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--ckpt-dir", "{small}"], "pass --assets-dir with the 14B causal-fast folder"),
        (["--ckpt-dir", "tiny-v2", "--model", "fast", "--steps", "10"], "steps: not used by LingBot-World 2.0"),
        (["--ckpt-dir", "{small}", "--model", "fast", "--guide-scale", "3"], "guide_scale: not used by"),
        (["--ckpt-dir", "{broken}", "--assets-dir", "{assets}"], "diffusion_pytorch_model-00002-of-00002.safetensors"),
    ],
)
def test_generate_refuses_bad_v2_input_in_one_line_before_loading(tmp_path, v2_root, capsys, flags, says):
    """A 1.3B folder without reachable assets, a v1-only setting on a v2 model, a v2 folder with a missing shard:
    one line naming the file or field and the fix, exit 2, nothing written, no model loaded."""
    import shutil

    from lingbot_cli.main import main

    small = tmp_path / "lingbot-world-v2-1.3b-causal-fast"
    shutil.copytree(v2_root / "fast" / "ckpt_1p3b", small)
    broken = tmp_path / "broken" / "lingbot-world-v2-14b-causal-fast"
    shutil.copytree(v2_root / "fast" / "ckpt_14b", broken)
    next((broken / "transformers").glob("*-00002-*")).unlink()
    assets = tmp_path / "elsewhere" / "assets"  # not beside the 1.3B download: only --assets-dir finds it
    (assets / "google" / "umt5-xxl").mkdir(parents=True)
    (assets / "google" / "umt5-xxl" / "tokenizer.json").write_text("{}")
    for name in ("models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"):
        (assets / name).write_bytes(b"x")
    example = _shared(v2_root) / "reference" / "lingbot_v2_examples" / "05"
    out = tmp_path / "out.mp4"
    args = [f.format(small=small, broken=broken, assets=assets) for f in flags]
    code = main(["generate", *args, "--action-path", str(example), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_a_narrow_dit_plans_its_own_activations_under_a_small_budget():
    """The 1.3B (dim 1536, 3.2 GiB of bf16 weights) plans under 8 GiB; a 14B-wide DiT of the same weight size
    would not (its activations are measured at dim 5120 and scale with the width)."""
    from worldgen.errors import InputError
    from worldgen.runtime.memory import activation_gib, plan_memory

    assert activation_gib(6240, 1536) == pytest.approx(activation_gib(6240) * 1536 / 5120)
    args = dict(expert_gib=3.2, checkpoint_kind="bf16", gpu_total_gib=139.0)
    plan = plan_memory(torch.device("cuda"), 8.0, width=1536, **args)
    assert plan.usable_gib == pytest.approx(7.4) and plan.width == 1536
    with pytest.raises(InputError, match="does not fit --vram-budget 8"):
        plan_memory(torch.device("cuda"), 8.0, **args)
