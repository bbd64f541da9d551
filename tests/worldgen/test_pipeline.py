"""End-to-end image-to-video against the reference run in golden/pipeline, step by step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from contracts.settings import GenerationSettings
from tests.worldgen.numerics import rel_l2
from worldgen.models.t5 import T5Config, UMT5Encoder
from worldgen.models.vae import WanVAE
from worldgen.models.vae_config import VAEConfig
from worldgen.pipelines.base import Pipeline, prepare_image
from worldgen.runtime.checkpoint import load_expert
from worldgen.runtime.residency import ModelSlot


def _load(module, path):
    module.load_state_dict(torch.load(path, weights_only=True))
    return module.eval()


@pytest.fixture(scope="module")
def case(golden, lingbot_examples):
    root = golden / "pipeline"
    spec = json.loads((root / "case.json").read_text())
    pipe = Pipeline(
        tokenizer=None,
        text_encoder=ModelSlot(
            "t5",
            lambda: _load(
                UMT5Encoder(T5Config.from_json(golden / "t5" / "config.json")), golden / "t5" / "t5_encoder.pth"
            ),
        ),
        vae=ModelSlot(
            "vae",
            lambda: _load(WanVAE(VAEConfig.from_json(golden / "vae" / "config.json")), golden / "vae" / "vae.pth"),
        ),
        experts={
            e: ModelSlot(e, lambda e=e: load_expert(root / f"{e}_noise_model", "cpu", torch.float32))
            for e in ("high", "low")
        },
        device=torch.device("cpu"),
        text_len=16,
        name="golden",
    )
    settings = GenerationSettings(
        size=f"{spec['height']}*{spec['width']}",
        frame_num=spec["frame_num"],
        steps=spec["steps"],
        shift=spec["shift"],
        guide_scale=tuple(spec["guide_scale_low_high"]),
        boundary=spec["boundary"],
    )
    assert settings.max_area == spec["max_area"] or spec["height"] * spec["width"] <= spec["max_area"]
    settings = settings.replace(size="64*112")  # max_area 7168 of the case
    example = lingbot_examples / "00"
    io = load_file(root / "io.safetensors")
    return pipe, settings, example, io


def test_image_resize(case):
    pipe, settings, example, io = case
    assert rel_l2(prepare_image(example / "image.jpg", settings.max_area), io["image_resized"]) < 1e-5


def test_condition_y(case):
    pipe, settings, example, io = case
    assert rel_l2(pipe.condition(io["image_resized"], 9), io["y"]) < 1e-4


def test_end_to_end_video(case):
    pipe, settings, example, io = case
    context, negative = pipe.encode_ids(io["ids"], io["mask"])
    seen = []
    video = pipe.generate(
        example / "image.jpg",
        None,
        np.load(example / "poses.npy"),
        np.load(example / "intrinsics.npy"),
        settings,
        progress=lambda phase, step, total: seen.append((phase, step, total)),
        noise=io["noise"],
        context=context,
        negative_context=negative,
    )
    assert video.shape == io["video"].shape
    assert rel_l2(video, io["video"]) < 1e-3
    assert ("denoise", 6, 6) in seen and seen[0][0] == "text" and seen[-1][0] == "decode"
    # expert switch: both experts were loaded once (high for t >= 947, low after)
    assert pipe.experts["high"].loads == 1 and pipe.experts["low"].loads == 1


def test_final_latent(case):
    pipe, settings, example, io = case
    context, negative = pipe.encode_ids(io["ids"], io["mask"])
    from worldgen.pipelines.camera import camera_conditioning

    plucker = camera_conditioning(
        np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), 9, 48, 112
    ).plucker
    assert rel_l2(plucker, io["plucker"]) < 1e-5
    latent = pipe.denoise(io["noise"], io["y"], context, negative, plucker, settings)
    assert rel_l2(latent, io["latent_final"]) < 1e-3


def test_cancel_through_progress_stops_denoising(case):
    pipe, settings, example, io = case
    context, negative = pipe.encode_ids(io["ids"], io["mask"])

    class Cancelled(Exception):
        pass

    def progress(phase, step, total):
        if phase == "denoise" and step == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        pipe.denoise(io["noise"], io["y"], context, negative, None, settings, progress)


def test_text_encoder_on_cpu_gives_the_same_embeddings(tmp_path):
    """--t5-on-cpu streams umT5 block by block; on a CPU-only run it must equal the resident encoder."""
    from worldgen.pipelines.loader import load_pipeline

    streamed = load_pipeline("tiny", device="cpu", text_encoder_on_cpu=True, use_text_cache=False)
    resident = load_pipeline("tiny", device="cpu", use_text_cache=False)
    assert streamed.plan.stream_text_encoder and streamed.plan.text_encoder_device.type == "cpu"
    assert "streamed block by block" in streamed.plan.describe()
    prompts = ["a robot arm over a table", "blurry"]
    for a, b in zip(streamed.encode_text(prompts), resident.encode_text(prompts), strict=True):
        assert torch.equal(a, b)
    assert not streamed.text_encoder.loaded  # consumed on the way through, nothing kept
