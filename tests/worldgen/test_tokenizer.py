"""Prompt cleaning and tokenization on a real tokenizer.json written to disk."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from worldgen.errors import CheckpointError
from worldgen.models.tokenizer import PromptTokenizer, build_tiny_tokenizer, clean_prompt, find_tokenizer

PAD, EOS, UNK = 0, 1, 2


@pytest.fixture()
def tiny_ckpt(tmp_path: Path) -> Path:
    """A checkpoint folder in the NF4 release layout, holding the tiny preset's tokenizer."""
    (tmp_path / "tokenizer").mkdir()
    build_tiny_tokenizer(100).save(str(tmp_path / "tokenizer" / "tokenizer.json"))
    return tmp_path


def test_clean_prompt_html_entities_twice():
    assert clean_prompt("rock &amp;amp; roll &lt;b&gt;") == "rock & roll <b>"


def test_clean_prompt_fixes_mojibake():
    # "café" and a curly apostrophe encoded as UTF-8 but decoded as Latin-1/Windows-1252.
    assert clean_prompt("caf\u00c3\u00a9 it\u00e2\u20ac\u2122s") == "café it's"


def test_clean_prompt_collapses_whitespace():
    assert clean_prompt("  a robot\n\n\tarm   moves \u00a0 left  ") == "a robot arm moves left"


def test_tiny_tokenizer_ids_and_specials(tiny_ckpt):
    tok = PromptTokenizer.from_checkpoint(tiny_ckpt)
    assert (tok.pad_id, tok.eos_id) == (PAD, EOS)
    ids, mask = tok(["A robot arm moves left.", "go"], text_len=32)
    assert ids.shape == mask.shape == (2, 32)
    assert ids.dtype == mask.dtype == torch.int64
    assert int(ids.max()) < 100  # fits the golden tiny T5 (vocab 100)
    for row, m in zip(ids, mask, strict=True):
        n = int(m.sum())
        assert m[:n].eq(1).all() and m[n:].eq(0).all()
        assert row[n - 1] == EOS  # EOS appended by the post-processor
        assert row[n:].eq(PAD).all()  # padded to text_len with the pad id
        assert not row[: n - 1].eq(EOS).any()
    assert int(mask[1].sum()) == len("▁go") + 1


def test_saved_tokenizer_round_trips(tiny_ckpt):
    tok = PromptTokenizer(find_tokenizer(tiny_ckpt))
    text = "Camera pans right, 2 boxes (red/blue) on a table!"
    ids, mask = tok([text], text_len=64)
    n = int(mask[0].sum())
    assert tok.decode(ids[0, :n].tolist()) == text
    assert UNK not in ids[0].tolist()


def test_unknown_characters_map_to_unk(tiny_ckpt):
    tok = PromptTokenizer.from_checkpoint(tiny_ckpt)
    ids, _ = tok(["日本"], text_len=8)
    assert UNK in ids[0].tolist()


def test_cleaning_applies_before_tokenizing(tiny_ckpt):
    tok = PromptTokenizer.from_checkpoint(tiny_ckpt)
    messy, _ = tok(["  rock &amp;amp;\n roll "], text_len=16)
    clean, _ = tok(["rock & roll"], text_len=16)
    assert torch.equal(messy, clean)


def test_long_prompt_is_truncated_with_warning(tiny_ckpt):
    tok = PromptTokenizer.from_checkpoint(tiny_ckpt)
    prompt = "ab " * 10  # 10 x (▁ a b) = 30 tokens + EOS = 31
    with pytest.warns(UserWarning, match=r"truncated from 31 to 16 tokens"):
        ids, mask = tok([prompt, "ok"], text_len=16)
    assert ids.shape == (2, 16)
    assert mask[0].eq(1).all()
    assert ids[0, -1] == EOS  # EOS kept last after truncation
    full, _ = tok([prompt], text_len=64)
    assert torch.equal(ids[0, :15], full[0, :15])
    # The tokenizer is reusable afterwards: padding and truncation are set per call.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, again_mask = tok(["ok"], text_len=16)
    assert torch.equal(again, ids[1:]) and torch.equal(again_mask, mask[1:])


def test_google_layout_is_found(tmp_path):
    path = tmp_path / "google" / "umt5-xxl" / "tokenizer.json"
    path.parent.mkdir(parents=True)
    build_tiny_tokenizer(100).save(str(path))
    assert find_tokenizer(tmp_path) == path


def test_missing_tokenizer_names_paths_tried(tmp_path):
    with pytest.raises(CheckpointError) as err:
        find_tokenizer(tmp_path)
    assert "google/umt5-xxl/tokenizer.json" in str(err.value)
    assert "tokenizer/tokenizer.json" in str(err.value)


def test_corrupt_tokenizer_json_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        PromptTokenizer(path)


def test_tiny_tokenizer_respects_small_vocab():
    tok = build_tiny_tokenizer(20)
    assert tok.get_vocab_size() == 20
    assert max(tok.encode("Hello World 123 !?").ids) < 20
