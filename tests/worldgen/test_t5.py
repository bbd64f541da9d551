"""umT5 encoder against the reference golden vectors (tiny config, CPU, float32)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.worldgen.golden import golden_model
from tests.worldgen.numerics import rel_l2
from worldgen.errors import CheckpointError
from worldgen.models.t5 import UMT5_XXL, T5Config, UMT5Encoder, encode_prompts, relative_position_buckets


@pytest.fixture(scope="module")
def golden_t5(golden):
    return golden_model(golden / "t5", T5Config, UMT5Encoder, "t5_encoder.pth")


def test_hidden_matches_reference(golden_t5):
    encoder, io = golden_t5
    with torch.no_grad():
        hidden = encoder(io["ids"], io["mask"])
    assert hidden.shape == io["hidden"].shape
    assert hidden.dtype == torch.float32
    assert rel_l2(hidden, io["hidden"]) < 1e-5


def test_encode_prompts_cuts_to_true_length(golden_t5):
    encoder, io = golden_t5
    contexts = encode_prompts(encoder, io["ids"], io["mask"])
    assert [c.shape for c in contexts] == [io["context0"].shape, io["context1"].shape]
    assert rel_l2(contexts[0], io["context0"]) < 1e-5
    assert rel_l2(contexts[1], io["context1"]) < 1e-5


def test_block_by_block_equals_forward(golden_t5):
    encoder, io = golden_t5
    ids, mask = io["ids"], io["mask"]
    with torch.no_grad():
        x = encoder.embed(ids)
        shared = encoder.shared_position_bias(ids.shape[1])
        assert shared is None  # umT5: every block has its own position table
        for block in encoder.blocks:
            x = block(x, mask, shared)
        x = encoder.final(x)
        assert torch.equal(x, encoder(ids, mask))


def test_bf16_runs_and_stays_close(golden_t5):
    encoder, io = golden_t5
    bf16 = UMT5Encoder(encoder.config).to(torch.bfloat16)
    bf16.load_state_dict(encoder.state_dict())  # copies cast to bf16
    with torch.no_grad():
        hidden = bf16(io["ids"], io["mask"])
    assert hidden.dtype == torch.bfloat16
    assert torch.isfinite(hidden).all()
    # bf16 keeps ~3 significant digits; measured 6.9e-3 on these weights.
    assert rel_l2(hidden, io["hidden"]) < 3e-2


def test_shared_position_config_runs():
    """T5 v1.1-style shared tables: one bias from the encoder goes to every block."""
    cfg = T5Config(vocab=50, dim=16, dim_attn=16, dim_ffn=32, num_heads=2, num_layers=2, num_buckets=8,
                   shared_pos=True)  # fmt: skip
    encoder = UMT5Encoder(cfg)
    assert "pos_embedding.embedding.weight" in encoder.state_dict()
    assert not any(k.startswith("blocks.0.pos_embedding") for k in encoder.state_dict())
    ids = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        assert encoder(ids, torch.ones_like(ids)).shape == (1, 5, 16)


def test_padding_does_not_change_valid_positions(golden_t5):
    encoder, io = golden_t5
    ids, mask = io["ids"][:1, :7], io["mask"][:1, :7]  # prompt 0 without its padding
    with torch.no_grad():
        short = encoder(ids, mask)
    assert rel_l2(short[0], io["context0"]) < 1e-5


def test_relative_position_buckets_match_t5_formula():
    buckets = relative_position_buckets(300, num_buckets=32)
    row = buckets[150]  # query at 150; keys before it use buckets 0..15, after it 16..31
    assert row[150] == 0 and row[151] == 17 and row[149] == 1
    assert row[157] == 16 + 7 and row[158] == 16 + 8  # exact distances up to 7, then logarithmic
    assert row[150 + 50] == 16 + 13 and row[150 - 50] == 13  # 8 + int(log(50/8)/log(16)*8)
    assert row[299] == 31 and row[0] == 15  # beyond max distance 128: the last bucket


def test_umt5_xxl_builds_on_meta_with_reference_keys():
    with torch.device("meta"):
        encoder = UMT5Encoder(UMT5_XXL)
    state = encoder.state_dict()
    assert state["token_embedding.weight"].shape == (256384, 4096)
    assert state["blocks.23.ffn.gate.0.weight"].shape == (10240, 4096)
    assert state["blocks.23.pos_embedding.embedding.weight"].shape == (32, 64)
    # 5.7 B parameters: embedding + 24 x (4 attention + 3 FFN matrices + 2 norms + position table) + norm
    per_block = 4 * 4096 * 4096 + 3 * 4096 * 10240 + 2 * 4096 + 32 * 64
    assert sum(p.numel() for p in encoder.parameters()) == 256384 * 4096 + 24 * per_block + 4096


def test_config_from_json_names_missing_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab": 10, "dim": 8}))
    with pytest.raises(CheckpointError, match=r"config\.json.*dim_attn"):
        T5Config.from_json(path)


def test_streamed_on_the_cpu_from_the_mapped_file_matches_reference(golden):
    """--t5-on-cpu: blocks cast and run one at a time straight from the memory-mapped .pth."""
    from worldgen.runtime.checkpoint import load_state_streaming
    from worldgen.runtime.streamed_text_encoder import encode_prompts_streamed
    from worldgen.runtime.tensor_stream import stream_torch_file

    folder = golden / "t5"
    io = load_file(folder / "io.safetensors")
    with torch.device("meta"):
        encoder = UMT5Encoder(T5Config.from_json(folder / "config.json"))
    load_state_streaming(encoder, stream_torch_file(folder / "t5_encoder.pth", "cpu", None, copy=False), folder)
    contexts = encode_prompts_streamed(encoder, io["ids"], io["mask"], "cpu", torch.float32)
    assert rel_l2(contexts[0], io["context0"]) < 1e-5
    assert rel_l2(contexts[1], io["context1"]) < 1e-5
    assert all(p.is_meta for p in encoder.blocks.parameters())  # consumed: nothing left resident


def test_streamed_bf16_file_in_float32_equals_the_resident_encoder():
    from worldgen.models.tokenizer import PromptTokenizer
    from worldgen.runtime.checkpoint import find_checkpoint, load_t5
    from worldgen.runtime.streamed_text_encoder import encode_prompts_streamed
    from worldgen.runtime.tiny import ensure_tiny_checkpoint

    layout = find_checkpoint(ensure_tiny_checkpoint("bf16"))
    ids, mask = PromptTokenizer(layout.tokenizer_dir / "tokenizer.json")(["a robot arm", "warehouse aisle"], 32)
    resident = encode_prompts(load_t5(layout, "cpu", torch.float32), ids, mask)
    streamed = encode_prompts_streamed(
        load_t5(layout, "cpu", torch.float32, stream_blocks=True), ids, mask, "cpu", torch.float32
    )
    assert all(torch.equal(a, b) for a, b in zip(resident, streamed, strict=True))


@pytest.mark.cuda
@pytest.mark.parametrize("staging_bytes", [None, 4096])  # the module's buffers; buffers smaller than most tensors
def test_streamed_to_a_gpu_through_pinned_buffers_equals_the_resident_encoder(staging_bytes, monkeypatch):
    from worldgen.runtime import streamed_text_encoder

    if staging_bytes is not None:  # every tensor past 4 KiB passes through in pieces
        monkeypatch.setattr(streamed_text_encoder, "STAGING_BYTES", staging_bytes)
    from worldgen.models.tokenizer import PromptTokenizer
    from worldgen.runtime.checkpoint import find_checkpoint, load_t5
    from worldgen.runtime.streamed_text_encoder import encode_prompts_streamed
    from worldgen.runtime.tiny import ensure_tiny_checkpoint

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the pinned staging is for copies to one)")
    layout = find_checkpoint(ensure_tiny_checkpoint("bf16"))
    ids, mask = PromptTokenizer(layout.tokenizer_dir / "tokenizer.json")(["a robot arm", "warehouse aisle"], 32)
    resident = encode_prompts(load_t5(layout, "cuda", torch.bfloat16), ids.cuda(), mask.cuda())
    encoder = load_t5(layout, "cpu", torch.bfloat16, stream_blocks=True)
    streamed = encode_prompts_streamed(encoder, ids, mask, "cuda", torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(resident, streamed, strict=True))
    assert all(p.is_meta for p in encoder.blocks.parameters())
