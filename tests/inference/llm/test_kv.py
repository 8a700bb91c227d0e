"""The KV-cache and padding module on a tiny random model: padding, prefix reuse, row selection,
the decode batch's growing cache, EOS ids."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers.cache_utils import DynamicCache

from sieverag.inference.llm import kv
from sieverag.inference.llm.hf import load_causal_lm

PREFIX = [5, 17, 230, 41, 9, 77, 1000, 12]
SUFFIXES = [[300, 301, 302, 303, 304], [40], [900, 901, 902]]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[torch.nn.Module, int]:
    """The tiny model and its pad id."""
    model, tokenizer = load_causal_lm(str(tiny_model_dir), "float32", "cpu")
    return model, tokenizer.pad_token_id


def _full_logits(model: torch.nn.Module, pad: int, sequences: list[list[int]]) -> torch.Tensor:
    """Logits of the plain left-padded batch of whole sequences, no cache."""
    with torch.inference_mode():
        return model(**kv.left_pad(sequences, pad)).logits


def test_left_pad_puts_pads_first_masks_them_and_counts_positions_from_the_offset():
    inputs = kv.left_pad([[7, 8, 9], [4]], pad_id=0)
    assert inputs["input_ids"].tolist() == [[7, 8, 9], [0, 0, 4]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert inputs["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    shifted = kv.left_pad([[7, 8, 9], [4]], pad_id=0, offset=5)
    assert shifted["position_ids"].tolist() == [[5, 6, 7], [5, 5, 5]]
    per_row = kv.left_pad([[7, 8], [4]], pad_id=0, offset=torch.tensor([[3], [10]]))
    assert per_row["position_ids"].tolist() == [[3, 4], [10, 10]]
    assert all(t.dtype == torch.long for t in per_row.values())


def test_prefill_then_extend_matches_one_full_forward_pass(tiny):
    """Suffixes of different lengths run after a prefix computed once score exactly like the
    whole sequences run together, and the prefix's own cache is left for the next batch."""
    model, pad = tiny
    full = _full_logits(model, pad, [PREFIX + s for s in SUFFIXES])
    with torch.inference_mode():
        prefix_cache = kv.prefill(model, PREFIX, "cpu")
        for _ in range(2):  # the same prefix cache serves two batches
            ones = torch.ones((len(SUFFIXES), len(PREFIX)), dtype=torch.long)
            inputs = kv.continue_inputs(SUFFIXES, pad, kv.expand_cache(prefix_cache, 3), ones)
            cached = model(**inputs, use_cache=True).logits
            assert prefix_cache.get_seq_length() == len(PREFIX)
            for row, suffix in enumerate(SUFFIXES):
                torch.testing.assert_close(cached[row, -len(suffix):], full[row, -len(suffix):],
                                           atol=1e-4, rtol=0)


def test_selected_rows_of_a_padded_cache_continue_like_the_whole_sequences(tiny):
    """Rows picked (reordered) from a left-padded batch's cache, rebuilt from its layers,
    continue with per-row positions exactly like their whole sequences."""
    model, pad = tiny
    prompts = [PREFIX[:3], PREFIX, PREFIX[2:7]]
    with torch.inference_mode():
        first = kv.left_pad(prompts, pad)
        cache = model(**first, use_cache=True).cache
        layers = kv.cache_layers(cache)
        assert layers is not None and len(layers) == 2
        rebuilt = kv.cache_from_layers(layers, model.config)
        (mask,) = kv.select_rows(rebuilt, [2, 0], first["attention_mask"])
        assert mask.tolist() == first["attention_mask"][[2, 0]].tolist()
        for (keys, values), layer in zip(layers, rebuilt.layers, strict=True):
            torch.testing.assert_close(layer.keys, keys[[2, 0]], atol=0, rtol=0)
            torch.testing.assert_close(layer.values, values[[2, 0]], atol=0, rtol=0)
        assert kv.cache_layers(cache)[0][0].shape[0] == 3  # the source cache is untouched
        extra = [[50, 51], [60, 61, 62, 63]]
        cached = model(**kv.continue_inputs(extra, pad, rebuilt, mask), use_cache=True).logits
    full = _full_logits(model, pad, [prompts[2] + extra[0], prompts[0] + extra[1]])
    for row, suffix in enumerate(extra):
        torch.testing.assert_close(cached[row, -len(suffix):], full[row, -len(suffix):],
                                   atol=1e-4, rtol=0)


def test_selecting_every_row_in_order_changes_nothing(tiny):
    model, pad = tiny
    with torch.inference_mode():
        inputs = kv.left_pad([[1, 2], [3]], pad)
        cache = model(**inputs, use_cache=True).cache
        keys = cache.layers[0].keys
        mask, positions = kv.select_rows(cache, [0, 1], inputs["attention_mask"],
                                         inputs["position_ids"])
    assert mask is inputs["attention_mask"] and positions is inputs["position_ids"]
    assert cache.layers[0].keys is keys


def test_growing_cache_joins_and_trims_and_decodes_like_each_sequence_alone(tiny):
    """Two prefilled groups of different widths joined into one decode batch, a row dropped,
    all-padding columns trimmed: the next step's logits are each sequence's own."""
    model, pad = tiny
    groups = [[PREFIX[:2], PREFIX[:4]], [PREFIX]]
    caches, masks = [], []
    with torch.inference_mode():
        for group in groups:
            cache = kv.growing_cache(model.config, "tiny")
            inputs = kv.left_pad(group, pad)
            model(**inputs, cache=cache, use_cache=True)
            caches.append(cache)
            masks.append(inputs["attention_mask"])
        mask = kv.join_rows(caches[0], caches[1], masks[0], masks[1])
        assert mask.shape == (3, len(PREFIX)) and caches[0].get_seq_length() == len(PREFIX)
        rows = [row for group in groups for row in group]
        (mask,) = kv.select_rows(caches[0], [1, 0], mask)  # drop the longest row
        mask = kv.drop_padding_columns(caches[0], mask)
        assert mask.shape == (2, 4) and caches[0].get_seq_length() == 4
        step = torch.tensor([[88], [99]])
        mask = torch.cat([mask, mask.new_ones((2, 1))], dim=1)
        positions = torch.tensor([[len(rows[1])], [len(rows[0])]])
        logits = model(input_ids=step, attention_mask=mask, position_ids=positions,
                       cache=caches[0], use_cache=True).logits[:, -1]
    for row, sequence in enumerate([rows[1] + [88], rows[0] + [99]]):
        alone = _full_logits(model, pad, [sequence])[0, -1]
        torch.testing.assert_close(logits[row], alone, atol=1e-4, rtol=0)


def test_eos_ids_join_the_tokenizers_and_the_generation_configs():
    tokenizer = SimpleNamespace(eos_token_id=2)
    for generation_eos, expected in ((None, [2]), (7, [2, 7]), ([9, 2, 4], [2, 4, 9])):
        model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=generation_eos))
        assert kv.eos_token_ids(model, tokenizer) == expected
    assert kv.eos_token_ids(SimpleNamespace(), SimpleNamespace(eos_token_id=None)) == []


def test_eos_ids_of_the_tiny_model(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), "float32", "cpu")
    assert tokenizer.eos_token_id in kv.eos_token_ids(model, tokenizer)


def test_a_cache_made_growing_holds_the_same_columns_and_leaves_taken_ones_alone(tiny):
    """`make_growing` turns a prefill's stock cache into in-place layers with the same keys and
    values; decoding on writes new columns without touching a slice taken before (the `hf`
    backend's prompt cache keeps such slices)."""
    model, _ = tiny
    with torch.inference_mode():
        cache = kv.prefill(model, PREFIX, "cpu")
        taken = [(keys.clone(), keys) for keys, _ in kv.cache_layers(cache)]
        kv.make_growing(cache)
        assert all(type(layer) is kv.GrowingLayer for layer in cache.layers)
        for (before, _), (keys, _) in zip(taken, kv.cache_layers(cache), strict=True):
            assert torch.equal(keys, before)
        mask = torch.ones((1, len(PREFIX) + 1), dtype=torch.long)
        model(input_ids=torch.tensor([[3]]), attention_mask=mask,
              position_ids=torch.tensor([[len(PREFIX)]]), cache=cache, use_cache=True)
    assert cache.get_seq_length() == len(PREFIX) + 1
    assert all(torch.equal(copy, view) for copy, view in taken)


def test_a_growing_cache_crops_its_last_columns_and_writes_after_them(tiny):
    """Cropping drops the last positions (a rejected draft's); the next update writes where
    they were, and the stock layer's crop agrees."""
    model = tiny[0]
    cache = kv.growing_cache(model.config, "tiny")
    stock = DynamicCache(config=model.config)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True)
        model(input_ids=ids, cache=stock, use_cache=True)
        for c in (cache, stock):
            c.crop(-2)
            model(input_ids=torch.tensor([[1, 2]]), position_ids=torch.tensor([[3, 4]]),
                  cache=c, use_cache=True)
    assert cache.get_seq_length() == stock.get_seq_length() == 5
    assert torch.equal(cache.layers[0].keys, stock.layers[0].keys)
