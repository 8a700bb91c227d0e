"""Prompt-lookup drafts: what they propose, how their length adapts, and that greedy decoding
with them writes what it writes without them, in fewer passes where the reply copies."""

from __future__ import annotations

import pytest
import torch

from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.prompt_lookup import Drafter, agreed, draft


def test_a_draft_continues_the_latest_occurrence_of_the_longest_tail() -> None:
    sequence = [1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 2, 3]
    # The tail [2, 3] occurs twice before; the latest occurrence is followed by 7, 8.
    assert draft(sequence, ngram=2, tokens=2) == [7, 8]
    # With a 3-token tail, [5, 2, 3] never occurred: the 2-token tail decides.
    assert draft(sequence, ngram=3, tokens=3) == [7, 8, 5]
    # [1, 2, 3] occurs at the start only when it is the tail.
    assert draft([1, 2, 3, 4, 0, 1, 2, 3], ngram=3, tokens=5) == [4, 0, 1, 2, 3]
    assert draft([4, 5, 6], ngram=3, tokens=4) == []  # nothing repeats
    assert draft([], ngram=3, tokens=4) == [] and draft([1, 1], ngram=3, tokens=0) == []


def test_agreed_counts_the_draft_tokens_up_to_the_first_the_model_would_not_choose() -> None:
    assert agreed([5, 6, 7], [5, 6, 9, 1]) == 2
    assert agreed([5, 6], [5, 6, 4]) == 2
    assert agreed([5], [4, 5]) == 0
    assert agreed([], [3]) == 0


def test_the_draft_length_grows_when_kept_whole_and_shrinks_otherwise() -> None:
    drafter = Drafter(limit=7)
    assert drafter.length == 2
    drafter.kept(2, 2)
    assert drafter.length == 4
    drafter.kept(4, 4)
    drafter.kept(6, 6)
    assert drafter.length == 7  # the limit
    drafter.kept(7, 2)
    assert drafter.length == 6
    drafter.kept(0, 0)  # no draft: nothing learnt
    assert drafter.length == 6
    for _ in range(10):
        drafter.kept(1, 0)
    assert drafter.length == 1
    assert Drafter(limit=1).length == 1
    # The room left before the length cap bounds a draft.
    assert Drafter(limit=8).propose([1, 2, 3, 4, 1, 2], room=1) == [3]


def test_the_draft_setting_is_checked_and_reaches_the_in_process_backend(tiny_model_dir) -> None:
    from sieverag.inference.llm.backend_registry import BackendSpec, _build_hf

    for bad in (lambda: HFBackendConfig(draft_tokens=-1), lambda: BackendSpec(draft_tokens=-1)):
        with pytest.raises(Exception, match="draft_tokens must be >= 0, got -1"):
            bad()
    backend = _build_hf(BackendSpec(model=str(tiny_model_dir), draft_tokens=0))
    assert backend.config.draft_tokens == 0


PROMPTS = [
    [{"role": "user", "content": "Is the sky blue?"}],
    [{"role": "user", "content": "Name a long river in Africa and say why it matters."}],
    [{"role": "user", "content": "Hi"}],
]


def _backend(tiny_model_dir, draft_tokens: int, batch_size: int = 1
             ) -> tuple[HFBackend, list[int]]:
    """A backend of `batch_size` prompts a batch, and the widths of the passes its decoder
    makes."""
    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=batch_size,
                                        draft_tokens=draft_tokens, prompt_cache_tokens=0))
    widths: list[int] = []
    decoder = backend.decoder

    def counted(ids, *args, **kwargs):
        widths.append(ids.shape[1])
        return decoder(ids, *args, **kwargs)
    backend.decoder = counted
    return backend, widths


@pytest.mark.parametrize("batch_size", [1, 3], ids=["alone", "three rows"])
@pytest.mark.parametrize("stop", [(), ("the",)], ids=["no stop", "stop string"])
def test_drafted_greedy_decoding_writes_what_token_by_token_decoding_writes(
        tiny_model_dir, monkeypatch, stop: tuple[str, ...], batch_size: int) -> None:
    """Drafts that are right, then wrong from their second token on (in turn), and a real
    lookup: the same replies as one token a step, a prompt alone or rows drafting together
    (each its own draft length, rows ending at different passes); right drafts take fewer
    passes."""
    settings = GenerationSettings(max_new_tokens=24, stop=stop)
    plain, plain_widths = _backend(tiny_model_dir, 0, batch_size)
    written: list[list[int]] = []  # each prompt and the ids the model writes after it
    decode = plain._decode

    def recorded(*prefilled_and_settings, rows):
        tokens = decode(*prefilled_and_settings, rows)
        written.extend(row + new for row, new in zip(rows, tokens, strict=True))
        return tokens
    plain._decode = lambda *args: recorded(*args[:-1], rows=args[-1])
    expected = plain.generate(PROMPTS, settings)
    assert set(plain_widths) == {1} and len(written) == len(PROMPTS)

    class Oracle(Drafter):
        """Proposes what the model will write, every other draft spoiled after its first
        token."""
        turn = 0

        def propose(self, sequence, room):
            full = next(w for w in written if w[:len(sequence)] == list(sequence))
            proposal = full[len(sequence):len(sequence) + min(self.length, room)]
            Oracle.turn += 1
            if Oracle.turn % 2 and len(proposal) > 1:
                proposal[1] = (proposal[1] + 1) % 1000
            return proposal

    for drafter in (Oracle, Drafter):
        monkeypatch.setattr("sieverag.inference.llm.greedy.Drafter", drafter)
        backend, widths = _backend(tiny_model_dir, 16, batch_size)
        assert backend.generate(PROMPTS, settings) == expected
        if drafter is Oracle:
            assert max(widths) > 2  # drafts were checked
            assert len(widths) < len(plain_widths)  # and kept: fewer passes, same tokens


def test_a_checked_draft_gets_the_logits_of_token_by_token_steps(tiny_model_dir) -> None:
    """Several tokens in one pass of the written-out step: each position's logits are those of
    feeding the tokens one at a time (to float rounding), padded rows included, and the cache
    then holds the same columns."""
    from transformers import AutoModelForCausalLM

    from sieverag.inference.llm import kv
    from sieverag.inference.llm.decode_step import DecodeStep

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()
    step = DecodeStep(model)
    prompts, new = [[5, 17, 29, 41, 53], [9, 8]], torch.tensor([[3, 4, 5, 6], [7, 3, 2, 1]])
    results = []
    with torch.inference_mode():
        for width in (1, 4):
            inputs = kv.left_pad(prompts, 0)
            cache = kv.growing_cache(model.config, "tiny")
            model(**inputs, cache=cache, use_cache=True)
            mask, positions = inputs["attention_mask"], inputs["position_ids"][:, -1:]
            logits = []
            for start in range(0, 4, width):
                ids = new[:, start:start + width]
                mask = torch.cat([mask, mask.new_ones((2, width))], dim=1)
                offsets = torch.arange(1, width + 1)[None, :]
                logits.append(step(ids, positions + offsets, mask, cache))
                positions = positions + width
            results.append((torch.cat(logits, dim=1), cache.layers[0].keys.clone()))
    (one_by_one, keys_one), (together, keys_together) = results
    assert together.shape == one_by_one.shape == (2, 4, model.config.vocab_size)
    torch.testing.assert_close(together, one_by_one, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(keys_together, keys_one, rtol=1e-4, atol=1e-5)
