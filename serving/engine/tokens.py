"""Prompt encoding and token text for the OpenAI response formats.

`text_offset` must index the text the response returns, character for character: the OpenAI
backend finds a continuation's tokens by it. Text prompts take offsets from the fast
tokenizer's offset mapping (a token inside a multi-byte character points at that character);
token-id prompts and generated tokens take them from decoding each prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

PREFIX_BATCH = 256  # prefixes decoded per call in `prefix_offsets`


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt's text, token ids and each token's character offset in the text."""

    text: str
    ids: tuple[int, ...]
    offsets: tuple[int, ...]


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, *, add_special_tokens: bool
                ) -> EncodedPrompt:
    """Tokenise `text` (BOS added when the tokenizer adds one and `add_special_tokens`)."""
    encoding = tokenizer(text, add_special_tokens=add_special_tokens,
                         return_offsets_mapping=True)
    return EncodedPrompt(text, tuple(encoding["input_ids"]),
                         tuple(start for start, _ in encoding["offset_mapping"]))


def encode_ids(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> EncodedPrompt:
    """A prompt given as token ids; its text is their decoding (special tokens kept)."""
    return EncodedPrompt(tokenizer.decode(list(ids)), tuple(ids),
                         tuple(prefix_offsets(tokenizer, ids, skip_special_tokens=False)))


def prefix_offsets(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], *,
                   skip_special_tokens: bool) -> list[int]:
    """Character offset of each token in the decoding of `ids`: the length of its prefix.

    Decoding every prefix costs time quadratic in len(ids) (bounded by the context length);
    memory stays bounded, as at most PREFIX_BATCH prefixes are decoded at a time.
    """
    offsets: list[int] = []
    for start in range(0, len(ids), PREFIX_BATCH):
        prefixes = tokenizer.batch_decode(
            [list(ids[:n]) for n in range(start, min(start + PREFIX_BATCH, len(ids)))],
            skip_special_tokens=skip_special_tokens)
        # A prefix ending inside a multi-byte character decodes with trailing U+FFFD; the next
        # token then points at that character's start, as the offset mapping does.
        offsets.extend(len(prefix.rstrip("\ufffd")) for prefix in prefixes)
    return offsets


def max_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters of text one token can stand for: its longest vocabulary entry.

    Exact for byte-level BPE vocabularies (an entry spells one character per byte, and each
    character of text takes at least one byte) and for SentencePiece ones (an entry spells
    its text); only a normaliser that merges characters could beat it.
    """
    return max(map(len, tokenizer.get_vocab()))


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """One token as text (a lone piece of a multi-byte character decodes to U+FFFD)."""
    return tokenizer.decode([token_id])
