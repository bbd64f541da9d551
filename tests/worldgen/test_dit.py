"""DiT parity with the reference golden outputs, from both checkpoint layouts, and bad checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.worldgen.numerics import rel_l2
from worldgen.errors import CheckpointError
from worldgen.runtime.checkpoint import find_checkpoint, load_expert


@pytest.fixture(scope="module")
def io(golden):
    return load_file(golden / "dit" / "io.safetensors")


@pytest.mark.parametrize("t", [900, 250])
@pytest.mark.parametrize("with_camera", [True, False])
def test_bf16_layout_matches_reference(golden, io, t, with_camera):
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)
    with torch.no_grad():
        out = model(
            io["x"][None], torch.tensor([t]), [io["context"]], io["y"][None], io["cam"] if with_camera else None
        )
    ref = io[f"out_{'cam' if with_camera else 'nocam'}_t{t}"]
    assert out.shape == (1, *ref.shape) and out.dtype == torch.float32
    assert rel_l2(out[0], ref) < 1e-4


@pytest.mark.parametrize("t", [900, 250])
def test_nf4_layout_matches_reference(golden, io, t):
    ref = load_file(golden / "dit" / "nf4_io.safetensors")[f"out_cam_t{t}"]
    model = load_expert(golden / "dit" / "nf4_layout", "cpu", torch.float32)
    with torch.no_grad():
        out = model(io["x"][None], torch.tensor([t]), [io["context"]], io["y"][None], io["cam"])
    assert rel_l2(out[0], ref) < 1e-4
    # and the camera actually matters: the no-camera output differs
    with torch.no_grad():
        nocam = model(io["x"][None], torch.tensor([t]), [io["context"]], io["y"][None], None)
    assert rel_l2(nocam[0], ref) > 1e-3


def test_batched_guidance_equals_two_passes(golden, io):
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)
    other = io["context"][:3] * 0.5
    with torch.no_grad():
        both = model(
            io["x"][None].expand(2, -1, -1, -1, -1),
            torch.tensor([900, 900]),
            [io["context"], other],
            io["y"][None].expand(2, -1, -1, -1, -1),
            io["cam"],
        )
        one = model(io["x"][None], torch.tensor([900]), [other], io["y"][None], io["cam"])
    assert rel_l2(both[0], io["out_cam_t900"]) < 1e-4
    assert rel_l2(both[1], one[0]) < 1e-5


def test_chunked_feed_forward_gives_same_output(golden, io):
    model = load_expert(golden / "dit" / "bf16_layout", "cpu", torch.float32)
    model.set_ffn_chunk_tokens(10)  # 72 tokens -> 8 chunks, the last one short
    with torch.no_grad():
        out = model(io["x"][None], torch.tensor([250]), [io["context"]], io["y"][None], io["cam"])
    assert rel_l2(out[0], io["out_cam_t250"]) < 1e-4


def copy_layout(golden, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(golden / "dit" / name, target)
    for f in target.iterdir():
        f.chmod(0o644)
    return target


def test_missing_shard_is_named(golden, tmp_path):
    folder = copy_layout(golden, tmp_path, "bf16_layout")
    (folder / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="00002-of-00002.*missing"):
        load_expert(folder, "cpu", torch.float32)


def test_config_shape_mismatch_is_named(golden, tmp_path):
    folder = copy_layout(golden, tmp_path, "bf16_layout")
    config = json.loads((folder / "config.json").read_text())
    config["ffn_dim"] = 256
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"ffn.*shape.*config"):
        load_expert(folder, "cpu", torch.float32)


def test_missing_quant_component_is_named(golden, tmp_path):
    folder = copy_layout(golden, tmp_path, "nf4_layout")
    state = load_file(folder / "model.safetensors")
    del state["blocks.1.ffn.0.weight.absmax"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"blocks\.1\.ffn\.0 lacks \['absmax'\]"):
        load_expert(folder, "cpu", torch.float32)


def test_truncated_file_is_named(golden, tmp_path):
    folder = copy_layout(golden, tmp_path, "nf4_layout")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_expert(folder, "cpu", torch.float32)


def test_legacy_model_pt_loads_like_safetensors(golden, io, tmp_path):
    folder = copy_layout(golden, tmp_path, "nf4_layout")
    torch.save(load_file(folder / "model.safetensors"), folder / "model.pt")
    (folder / "model.safetensors").unlink()
    model = load_expert(folder, "cpu", torch.float32)
    ref = load_file(golden / "dit" / "nf4_io.safetensors")["out_cam_t900"]
    with torch.no_grad():
        out = model(io["x"][None], torch.tensor([900]), [io["context"]], io["y"][None], io["cam"])
    assert rel_l2(out[0], ref) < 1e-4


def test_folder_of_neither_layout(tmp_path):
    (tmp_path / "something").mkdir()
    with pytest.raises(CheckpointError, match="neither checkpoint layout"):
        find_checkpoint(tmp_path)


def test_partial_download_names_missing_expert_and_files(golden, tmp_path):
    (tmp_path / "high_noise_model").mkdir()
    with pytest.raises(CheckpointError, match="low_noise_model/ is missing"):
        find_checkpoint(tmp_path)
    (tmp_path / "low_noise_model").mkdir()
    for d in ("high_noise_model", "low_noise_model"):
        shutil.copy(golden / "dit" / "bf16_layout" / "config.json", tmp_path / d / "config.json")
    with pytest.raises(CheckpointError, match="models_t5_umt5-xxl-enc-bf16.pth"):
        find_checkpoint(tmp_path)
