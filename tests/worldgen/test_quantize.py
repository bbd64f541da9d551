"""`quantize`: original bf16 release -> community NF4 layout, byte for byte what bitsandbytes writes."""

from __future__ import annotations

import subprocess
import sys

import torch
from bitsandbytes.functional import QuantState, dequantize_4bit, quantize_4bit
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import REPO
from tests.worldgen.numerics import rel_l2
from worldgen.kernels.nf4 import QUANT_SUFFIXES
from worldgen.runtime.checkpoint import find_checkpoint, load_expert
from worldgen.runtime.quantize import quantize_expert
from worldgen.runtime.tiny import ensure_tiny_checkpoint


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lingbot_cli", "quantize", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_golden_expert_quantizes_to_the_bytes_bitsandbytes_wrote(golden, tmp_path):
    target = tmp_path / "high_noise_model_bnb_nf4"
    stats = quantize_expert(golden / "dit/bf16_layout", target, torch.device("cpu"), show_progress=False)
    ours = load_file(target / "model.safetensors")
    theirs = load_file(golden / "dit/nf4_layout/model.safetensors")
    assert set(ours) == set(theirs)
    different = [k for k in theirs if ours[k].dtype != theirs[k].dtype or not torch.equal(ours[k], theirs[k])]
    assert different == []
    assert stats["quantized_layers"] == sum(k.endswith(".quant_state.bitsandbytes__nf4") for k in theirs)
    assert (target / "quantization_meta.json").exists() and (target / "config.json").exists()
    assert not list(tmp_path.glob(".*partial*"))


def test_output_is_readable_by_bitsandbytes_quantstate_from_dict(golden, tmp_path):
    target = tmp_path / "low_noise_model_bnb_nf4"
    quantize_expert(golden / "dit/bf16_layout", target, torch.device("cpu"), show_progress=False)
    source = {}
    for shard in sorted((golden / "dit/bf16_layout").glob("*.safetensors")):
        source.update(load_file(shard))
    with safe_open(target / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        owners = [
            k.removesuffix(".weight.quant_state.bitsandbytes__nf4") for k in keys if k.endswith("bitsandbytes__nf4")
        ]
        assert owners
        for owner in owners:
            parts = {s.removeprefix("weight."): f.get_tensor(f"{owner}.{s}") for s in QUANT_SUFFIXES}
            state = QuantState.from_dict(parts, device="cpu")
            dense = dequantize_4bit(f.get_tensor(f"{owner}.weight"), state).float()
            weight = source[f"{owner}.weight"]
            packed, direct = quantize_4bit(weight.bfloat16(), blocksize=64, compress_statistics=True, quant_type="nf4")
            assert torch.equal(dense, dequantize_4bit(packed, direct).float())  # the state bitsandbytes itself built
            assert rel_l2(dense, weight) < 0.25  # NF4 rounding: 0.09 to 0.20 on these seeded layers


def test_cli_converts_the_tiny_release_into_the_tiny_nf4_layout(tmp_path):
    """The tiny bf16 and NF4 checkpoints share their seeded weights: quantizing one must give the other."""
    source, reference = ensure_tiny_checkpoint("bf16"), ensure_tiny_checkpoint("nf4")
    target = tmp_path / "converted"
    done = _cli(str(source), str(target), "--device", "cpu", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "NF4 checkpoint ready" in done.stdout and "peak RSS" in done.stdout
    layout = find_checkpoint(target)
    assert layout.kind == "nf4" and layout.tokenizer_dir == target / "tokenizer"
    for expert in ("high", "low"):
        ours = load_file(layout.experts[expert] / "model.safetensors")
        theirs = load_file(reference / f"{expert}_noise_model_bnb_nf4" / "model.safetensors")
        assert set(ours) == set(theirs)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert (target / "models_t5_umt5-xxl-enc-bf16.pth").read_bytes() == (
        source / "models_t5_umt5-xxl-enc-bf16.pth"
    ).read_bytes()
    model = load_expert(layout.experts["high"], "cpu", torch.float32)
    assert sum(p.numel() for p in model.buffers()) > 0

    again = _cli(str(source), str(target), "--device", "cpu", "--quiet")
    assert again.returncode == 2 and "--force" in again.stderr
    assert load_file(layout.experts["high"] / "model.safetensors").keys() == ours.keys()  # untouched


def test_cli_refuses_an_nf4_source_and_a_partial_release(tmp_path):
    done = _cli(str(ensure_tiny_checkpoint("nf4")), str(tmp_path / "out"), "--device", "cpu", "--quiet")
    assert done.returncode == 2
    assert "already in the NF4 layout" in done.stderr

    partial = tmp_path / "partial"
    source = ensure_tiny_checkpoint("bf16")
    subprocess.run(["cp", "-r", str(source), str(partial)], check=True)
    shard = next((partial / "low_noise_model").glob("*-00002-of-00002.safetensors"))
    shard.unlink()
    done = _cli(str(partial), str(tmp_path / "out2"), "--device", "cpu", "--quiet")
    assert done.returncode == 2
    assert shard.name in done.stderr and "partial" in done.stderr
    assert not (tmp_path / "out2" / "low_noise_model_bnb_nf4").exists()
    assert not list((tmp_path / "out2").glob(".*partial*"))
