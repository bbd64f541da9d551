"""Prompt cleaning and umT5 tokenization into fixed-length id/mask tensors.

Reads the checkpoint's `tokenizer.json` with the `tokenizers` library (no `transformers`), which
is what the reference's fast tokenizer does underneath: its post-processor appends EOS, and
truncation keeps room for that EOS. Also builds the tiny character-level tokenizer that the
built-in `tiny` preset ships, with the same special-token ids as umT5 (pad 0, eos 1, unk 2).
"""

from __future__ import annotations

import html
import re
import string
import warnings
from pathlib import Path

import ftfy
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from worldgen.errors import CheckpointError

# Where the two release layouts keep the tokenizer (relative to the checkpoint folder).
TOKENIZER_PATHS = ("google/umt5-xxl/tokenizer.json", "tokenizer/tokenizer.json")

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
TEXT_LEN = 512


def clean_prompt(text: str) -> str:
    """Fix mojibake (ftfy), html-unescape twice, collapse whitespace, strip: as the reference."""
    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def find_tokenizer(ckpt_dir: str | Path) -> Path:
    """Path of `tokenizer.json` inside a checkpoint folder, in either release layout."""
    ckpt_dir = Path(ckpt_dir)
    tried = [ckpt_dir / rel for rel in TOKENIZER_PATHS]
    for path in tried:
        if path.is_file():
            return path
    raise CheckpointError(
        "no tokenizer found in checkpoint folder "
        f"{ckpt_dir}: tried {', '.join(str(p) for p in tried)}; copy the umT5 tokenizer.json there"
    )


class PromptTokenizer:
    """`tokenizer(prompts, text_len) -> (ids [B, text_len] int64, mask [B, text_len] int64)`."""

    def __init__(self, tokenizer_json: str | Path):
        self.path = Path(tokenizer_json)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust library raises plain Exception on bad files
            raise CheckpointError(f"cannot read tokenizer {self.path}: {exc}") from exc
        pad_id = self._tok.token_to_id(PAD)
        eos_id = self._tok.token_to_id(EOS)
        if pad_id is None or eos_id is None:
            raise CheckpointError(
                f"tokenizer {self.path} has no {PAD!r} or {EOS!r} token; it is not a umT5 tokenizer.json"
            )
        self.pad_id, self.eos_id = pad_id, eos_id

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str | Path) -> PromptTokenizer:
        return cls(find_tokenizer(ckpt_dir))

    def __call__(self, prompts: list[str], text_len: int = TEXT_LEN) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(prompts, str):
            prompts = [prompts]
        cleaned = [clean_prompt(p) for p in prompts]
        tok = self._tok
        tok.enable_truncation(max_length=text_len)
        tok.enable_padding(length=text_len, pad_id=self.pad_id, pad_token=PAD)
        encodings = tok.encode_batch(cleaned)
        for prompt, enc in zip(cleaned, encodings, strict=True):
            if enc.overflowing:
                full = self._untruncated_length(prompt)
                warnings.warn(
                    f"prompt was truncated from {full} to {text_len} tokens: {prompt[:60]!r}...",
                    UserWarning,
                    stacklevel=2,
                )
        ids = torch.tensor([enc.ids for enc in encodings], dtype=torch.int64)
        mask = torch.tensor([enc.attention_mask for enc in encodings], dtype=torch.int64)
        return ids, mask

    def _untruncated_length(self, prompt: str) -> int:
        self._tok.no_truncation()
        self._tok.no_padding()
        return len(self._tok.encode(prompt).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def build_tiny_tokenizer(vocab_size: int) -> Tokenizer:
    """Character-level Unigram tokenizer shaped like umT5's (Metaspace, EOS post-processor).

    Ids: 0 `<pad>`, 1 `</s>`, 2 `<unk>`, 3 the word-start marker, then lowercase letters, digits,
    punctuation and uppercase letters, as many as fit below `vocab_size`; other characters -> unk.
    """
    specials = [PAD, EOS, UNK]
    chars = list("\u2581" + string.ascii_lowercase + string.digits + string.punctuation)
    chars += list(string.ascii_uppercase)
    if vocab_size < len(specials) + 1:
        raise ValueError(f"vocab_size {vocab_size} is too small: need at least {len(specials) + 1}")
    pieces = specials + chars[: vocab_size - len(specials)]
    tok = Tokenizer(models.Unigram([(p, 0.0 if p in specials else -1.0) for p in pieces], unk_id=2))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, 1)]
    )
    tok.add_special_tokens(specials)
    return tok
