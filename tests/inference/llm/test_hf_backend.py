"""The hf backend on a tiny random model: every operation checked against a manual forward."""

from __future__ import annotations

import pytest
import torch

from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

CONVERSATIONS = [
    [{"role": "user", "content": "Is the sky blue?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Name a long river in Africa and say why it matters to people."}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> HFBackend:
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2))


def manual_next_token_logprobs(backend: HFBackend, conversation) -> torch.Tensor:
    ids = torch.tensor([backend.prompt_ids(conversation)])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, LLMBackend)


def test_label_logprobs_match_an_unpadded_forward_pass(backend):
    labels = ["Yes", "No"]
    scores = backend.label_logprobs(CONVERSATIONS, labels)
    for conversation, row in zip(CONVERSATIONS, scores, strict=True):
        expected = manual_next_token_logprobs(backend, conversation)
        for label in labels:
            (token,) = backend.reply_ids(backend.render(conversation),
                                         backend.prompt_ids(conversation), label)
            assert row[label] == pytest.approx(expected[token].item(), abs=1e-4)


def test_multi_token_labels_are_scored_as_whole_replies(backend):
    labels = ["relevant", "not relevant at all"]
    scores = backend.label_logprobs(CONVERSATIONS[:1], labels)[0]
    whole = backend.continuation_logprob(CONVERSATIONS[:1] * 2, labels)
    assert scores == {labels[0]: pytest.approx(whole[0]), labels[1]: pytest.approx(whole[1])}


def test_continuation_logprob_sums_reply_tokens(backend):
    conversation, reply = CONVERSATIONS[1], "The Nile river"
    prompt_ids = backend.prompt_ids(conversation)
    reply_ids = backend.reply_ids(backend.render(conversation), prompt_ids, reply)
    ids = torch.tensor([prompt_ids + reply_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(backend.model(input_ids=ids).logits[0].float(), dim=-1)
    expected = sum(logprobs[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(reply_ids))
    # Batched with a shorter and a longer neighbour so the row is left-padded.
    batch = backend.continuation_logprob(CONVERSATIONS, ["Yes", reply, "Hello there friend"])
    assert batch[1] == pytest.approx(expected, abs=1e-4)


def test_padded_and_unpadded_batches_agree(backend):
    together = backend.continuation_logprob(CONVERSATIONS, ["a", "b c", "d e f"])
    alone = [backend.continuation_logprob([c], [r])[0]
             for c, r in zip(CONVERSATIONS, ["a", "b c", "d e f"], strict=True)]
    assert together == pytest.approx(alone, abs=1e-4)


def test_generate_is_greedy_ordered_and_cut_at_stop(backend):
    settings = GenerationSettings(max_new_tokens=8)
    first = backend.generate(CONVERSATIONS, settings)
    assert first == backend.generate(CONVERSATIONS, settings)  # greedy: deterministic
    assert first == [backend.generate([c], settings)[0] for c in CONVERSATIONS]  # order kept
    stop = first[1][2:4] if len(first[1]) >= 4 else None
    if stop:
        cut = backend.generate([CONVERSATIONS[1]], GenerationSettings(max_new_tokens=8,
                                                                       stop=(stop,)))[0]
        assert stop not in cut and first[1].startswith(cut)


def test_usage_is_counted_by_agent(backend):
    before = backend.meter.snapshot()
    backend.generate(CONVERSATIONS[:2], GenerationSettings(max_new_tokens=2), agent="predictor")
    backend.label_logprobs(CONVERSATIONS, ["Yes", "No"], agent="judge")
    usage = backend.meter.since(before)
    assert usage["predictor"].calls == 2 and usage["judge"].calls == 3
    expected_tokens = sum(len(backend.prompt_ids(c)) for c in CONVERSATIONS)
    assert usage["judge"].prompt_tokens == expected_tokens
    assert 0 < usage["predictor"].completion_tokens <= 4
    assert usage["predictor"].seconds > 0 and usage["judge"].seconds > 0  # `metered`


def test_model_is_loaded_once_per_process(tiny_model_dir, backend):
    again = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2))
    assert again.base_model is backend.base_model


def test_bad_config_names_the_field():
    with pytest.raises(Exception, match="batch_size"):
        HFBackendConfig(batch_size=0)
    with pytest.raises(Exception, match="dtype"):
        HFBackendConfig(dtype="float8")


def test_an_adapter_backend_shares_the_base_and_the_plain_backend_stays_plain(
        tiny_model_dir, tmp_path, backend):
    from tiny_adapter import make_lora_adapter

    adapter = make_lora_adapter(tiny_model_dir, tmp_path / "lora")
    conversation = [CONVERSATIONS[0]]
    plain_before = backend.label_logprobs(conversation, ["Yes", "No"])
    adapted = HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(adapter)))
    assert adapted.base_model is backend.base_model  # loaded from disk once
    with_adapter = adapted.label_logprobs(conversation, ["Yes", "No"])
    plain_after = backend.label_logprobs(conversation, ["Yes", "No"])
    assert plain_after[0] == pytest.approx(plain_before[0], abs=1e-6)
    assert with_adapter[0]["Yes"] != pytest.approx(plain_before[0]["Yes"], abs=1e-3)
    again = HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(adapter)))
    assert again.label_logprobs(conversation, ["Yes", "No"])[0] == pytest.approx(with_adapter[0])


SHARED_SYSTEM = ("You answer questions with the help of one document. Give only the answer, a "
                 "few words, and do not repeat the question.")
SHARED = [[{"role": "system", "content": SHARED_SYSTEM},
           {"role": "user", "content": f"Question: Who built the bridge?\nDocument: {doc}"}]
          for doc in ("The Calder Bridge was built by Wren Ivers in 1901.", "Penguins huddle.",
                      "A long passage about rivers, deltas, floods and the towns beside them.")]


def test_shared_prefix_is_computed_once_and_changes_no_result(tiny_model_dir):
    """The KV cache of the prompts' common prefix, reused for every row, gives the scores and
    the replies of the plain left-padded batch."""
    plain = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=4,
                                      shared_prefix_min_tokens=0))
    shared = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=4,
                                       shared_prefix_min_tokens=8))
    inputs, full_ids = shared._batch_inputs([shared.prompt_ids(c) for c in SHARED])
    assert "cache" in inputs and inputs["cache"].get_seq_length() >= 8
    assert full_ids.shape[1] == inputs["cache"].get_seq_length() + inputs["input_ids"].shape[1]

    labels = ["Yes", "No"]
    for mine, theirs in zip(shared.label_logprobs(SHARED, labels),
                            plain.label_logprobs(SHARED, labels), strict=True):
        assert [mine[k] for k in labels] == pytest.approx([theirs[k] for k in labels], abs=1e-4)
    replies = ["Wren Ivers", "No", "rivers and towns"]
    assert shared.continuation_logprob(SHARED, replies) == pytest.approx(
        plain.continuation_logprob(SHARED, replies), abs=1e-4)
    settings = GenerationSettings(max_new_tokens=6)
    assert shared.generate(SHARED, settings) == plain.generate(SHARED, settings)


def test_shared_prefix_setting_is_checked():
    with pytest.raises(Exception, match="shared_prefix_min_tokens"):
        HFBackendConfig(shared_prefix_min_tokens=-1)


def _continued(conversation, reply: str, follow_up: str) -> list[dict]:
    return [*conversation, {"role": "assistant", "content": reply},
            {"role": "user", "content": follow_up}]


def test_label_logprobs_reuse_the_last_generate_calls_prompt_kv(tiny_model_dir):
    """Prompts that continue the last generate call's conversations run only their new tokens
    on the kept KV — rows picked from two kept batches, in any order — and score like the
    uncached forward pass; a prompt that extends nothing runs whole."""
    cached = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2))
    plain = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2,
                                      prompt_cache_tokens=0))
    cached.generate(SHARED, GenerationSettings(max_new_tokens=4))
    # Three prompts at batch size 2, and then the same rows with their replies' KV.
    assert len(cached.prompt_cache.batches) == 4
    follow_ups = [_continued(SHARED[i], answer, "Is the document useful? Yes or No.")
                  for i, answer in ((2, "rivers"), (0, "Wren Ivers"), (1, ""))]
    unrelated = [{"role": "user", "content": "Something else entirely?"}]
    prompts = [*follow_ups, unrelated]
    encoded = [cached.prompt_ids(p) for p in prompts]
    extending = cached.prompt_cache.lookup(encoded)
    assert sorted(extending) == [0, 1, 2]
    for index, (batch, row) in extending.items():
        kept = cached.prompt_cache.batches[batch].rows[row]
        assert encoded[index][:len(kept)] == kept

    labels = ["Yes", "No"]
    for mine, theirs in zip(cached.label_logprobs(prompts, labels),
                            plain.label_logprobs(prompts, labels), strict=True):
        assert [mine[k] for k in labels] == pytest.approx([theirs[k] for k in labels], abs=1e-4)
    assert cached.prompt_cache.reused_tokens == sum(
        len(cached.prompt_ids(SHARED[i])) for i in (0, 1, 2))
    assert plain.prompt_cache.batches == [] and plain.prompt_cache.reused_tokens == 0


def test_greedy_replies_are_kept_with_their_prompts_and_continue_like_an_uncached_pass(
        tiny_model_dir):
    """After greedy decoding (rows drafting and leaving the batch at different steps), the
    prompt cache holds each prompt with its reply's fed tokens; a sequence continuing one runs
    only its new tokens on that KV and gets the logits of the whole sequence run plainly."""
    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=8))
    conversations = [*SHARED, *CONVERSATIONS]
    backend.generate(conversations, GenerationSettings(max_new_tokens=8))
    kept_rows = [row for batch in backend.prompt_cache.batches for row in batch.rows]
    sequences = []
    for conversation in conversations:
        prompt = backend.prompt_ids(conversation)
        longest = max((row for row in kept_rows if row[:len(prompt)] == prompt), key=len)
        assert len(longest) > len(prompt)  # the reply's tokens came with it
        sequences.append(longest + [11, 12, 13])
    extending = backend.prompt_cache.lookup(sequences)
    assert sorted(extending) == list(range(len(sequences)))
    with torch.inference_mode():
        for batch, inputs in backend._continuation_batches(sequences, extending):
            continued = backend.model(**inputs).logits[:, -1]
            for row, index in enumerate(batch):
                whole = backend.model(input_ids=torch.tensor([sequences[index]])).logits[0, -1]
                torch.testing.assert_close(continued[row], whole, rtol=1e-4, atol=1e-4)


def test_gathered_rows_are_kept_shortest_first_left_padded_within_the_budget():
    from sieverag.inference.llm.prompt_cache import PromptCache

    cache = PromptCache(max_tokens=10)
    widths = [2, 5, 3]
    layers = [[(torch.full((1, 1, w, 2), float(w)), torch.full((1, 1, w, 2), -float(w)))]
              for w in widths]
    masks = [torch.ones((1, w), dtype=torch.long) for w in widths]
    assert cache.keep_rows([[1] * w for w in widths], layers, masks)
    # 2 and 3 columns fit as two rows of 3 (6 of 10); all three would take 15.
    (kept,) = cache.batches
    assert kept.rows == [[1, 1], [1, 1, 1]] and cache.kept_tokens == 6
    assert kept.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert kept.layers[0][0][:, 0, :, 0].tolist() == [[0.0, 2.0, 2.0], [3.0, 3.0, 3.0]]
    assert not PromptCache(max_tokens=1).keep_rows([[1, 1]], layers[:1], masks[:1])


def test_prompt_cache_keeps_within_its_token_budget(tiny_model_dir):
    small = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=1,
                                      prompt_cache_tokens=len(SHARED[0][1]["content"])))
    small.generate(SHARED, GenerationSettings(max_new_tokens=2))
    assert 0 < small.prompt_cache.kept_tokens <= small.config.prompt_cache_tokens
    assert len(small.prompt_cache.batches) < len(SHARED)
    with pytest.raises(Exception, match="prompt_cache_tokens"):
        HFBackendConfig(prompt_cache_tokens=-1)


@pytest.mark.parametrize("prefix_tokens", [0, 8])
def test_greedy_decoding_matches_transformers_generate(tiny_model_dir, prefix_tokens):
    """Rows leave the batch as they end, and every reply is still exactly transformers'
    greedy `generate` of that prompt alone, cut at the stop string."""
    mine = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=8,
                                     shared_prefix_min_tokens=prefix_tokens))
    prompts = [*SHARED, *CONVERSATIONS]
    plain = mine.generate(prompts, GenerationSettings(max_new_tokens=12))
    # A stop string that ends some replies early, so rows drop out at different steps.
    stop = next(r[3:5] for r in plain if len(r) > 6)
    for settings in (GenerationSettings(max_new_tokens=12),
                     GenerationSettings(max_new_tokens=12, stop=(stop,))):
        replies = mine.generate(prompts, settings)
        for prompt, reply in zip(prompts, replies, strict=True):
            ids = torch.tensor([mine.prompt_ids(prompt)])
            with torch.no_grad():
                out = mine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=12, do_sample=False, top_p=None,
                                          top_k=None, pad_token_id=mine.tokenizer.pad_token_id,
                                          eos_token_id=mine._stop_token_ids())
            expected = mine.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            cut = expected.find(stop) if stop in settings.stop and stop in expected else None
            assert reply == expected[:cut]
    assert any(stop in r for r in plain) and any(stop not in r for r in plain)


def test_the_memory_agents_read_the_evidence_once_through_the_prompt_cache(tiny_model_dir):
    from sieverag.inference.core.prompt_templates import load_template
    from sieverag.inference.pipelines.amber.memory import MemoryConfig, MemoryUpdater

    evidence = "[1] " + "The bridge was opened in 1901 by the mayor. " * 10
    config = MemoryConfig(review_max_new_tokens=4, refine_max_new_tokens=4)
    updates = {}
    for name, cache_tokens in (("cached", 8192), ("uncached", 0)):
        backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2,
                                            prompt_cache_tokens=cache_tokens))
        updates[name] = MemoryUpdater(backend, config).update("Who opened the bridge?", "",
                                                              evidence)
        if name == "cached":
            reviewer = backend.prompt_ids(load_template("amu_reviewer").messages(
                question="Who opened the bridge?", memory="(empty)", evidence=evidence))
            # The Challenger's prompt extends the Reviewer's, the Refiner's the Challenger's.
            assert backend.prompt_cache.reused_tokens >= 2 * len(reviewer)
        else:
            assert backend.prompt_cache.reused_tokens == 0
    # Reading the evidence once gives the same greedy replies as reading it three times.
    assert updates["cached"] == updates["uncached"]


def test_replies_prefilled_in_several_passes_and_decoded_together_are_the_same(tiny_model_dir):
    """A token budget of one prompt a pass prefills each prompt alone and joins their caches
    for one batched decode: the replies of one wide pass, and scores to float rounding."""
    wide = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=8,
                                     batch_tokens=1 << 20, draft_tokens=0))
    narrow = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=8,
                                       batch_tokens=1, draft_tokens=0))
    chunks = []
    prefill = narrow._prefill
    narrow._prefill = lambda inputs, rows: chunks.append(len(rows)) or prefill(inputs, rows)
    settings = GenerationSettings(max_new_tokens=12)
    assert narrow.generate(CONVERSATIONS, settings) == wide.generate(CONVERSATIONS, settings)
    assert chunks == [1, 1, 1]  # three passes, one decode
    for mine, theirs in zip(narrow.label_logprobs(CONVERSATIONS, ["Yes", "No"]),
                            wide.label_logprobs(CONVERSATIONS, ["Yes", "No"]), strict=True):
        assert mine == pytest.approx(theirs, abs=1e-4)
