"""The filter's prompt/answer contract: prompts, single-token labels, strict parsing, records."""

from __future__ import annotations

import pytest

from sieverag.inference.filters.filter_format import (
    CHUNK_LABELS,
    IRRELEVANT,
    NO_KEY_SENTENCES,
    RELEVANT,
    FilterAnswerError,
    chunk_prompt,
    chunk_record,
    parse_chunk_answer,
    parse_sentence_answer,
    sentence_answer,
    sentence_prompt,
    sentence_record,
)


def test_chunk_prompt_holds_question_title_and_chunk() -> None:
    prompt = chunk_prompt("Who wrote Hamlet?", "Hamlet is a tragedy.", title="Hamlet")
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert "Yes or No" in prompt[0]["content"]
    assert prompt[1]["content"] == ("Question: Who wrote Hamlet?\nText:\nHamlet\n"
                                    "Hamlet is a tragedy.")
    assert "Hamlet\n" not in chunk_prompt("q", "body")[1]["content"]


def test_sentence_prompt_numbers_sentences_from_one() -> None:
    prompt = sentence_prompt("q?", [" First one.", "Second one."], title="T")
    assert prompt[1]["content"].endswith("Sentences:\nT\n[1] First one.\n[2] Second one.")
    with pytest.raises(ValueError):
        sentence_prompt("q?", [])


def test_chunk_labels_are_one_token_each_after_the_assistant_prefix(tiny_model_dir) -> None:
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu"))
    prompt = chunk_prompt("Who wrote Hamlet?", "Hamlet is a tragedy by Shakespeare.")
    text = backend.render(prompt)
    ids = backend.prompt_ids(prompt)
    tokens = {label: backend.reply_ids(text, ids, label) for label in CHUNK_LABELS}
    assert all(len(t) == 1 for t in tokens.values())
    assert tokens[RELEVANT] != tokens[IRRELEVANT]


def test_parse_chunk_answer_is_strict() -> None:
    assert parse_chunk_answer(" Yes\n") is True
    assert parse_chunk_answer("No") is False
    for bad in ("yes", "Yes.", "Maybe", ""):
        with pytest.raises(FilterAnswerError):
            parse_chunk_answer(bad)


def test_sentence_answer_round_trips_zero_based_indices() -> None:
    assert sentence_answer([2, 0, 2]) == "1, 3"
    assert sentence_answer([]) == NO_KEY_SENTENCES
    assert parse_sentence_answer("1, 3", 3) == [0, 2]
    assert parse_sentence_answer(" none ", 3) == []
    assert parse_sentence_answer(sentence_answer([4, 1]), 5) == [1, 4]


@pytest.mark.parametrize("reply", ["0", "4", "1,3", "1, 3.", "3, 1", "1, 1", "None", "[1]",
                                   "1 and 2", "", "1, ", "01"])
def test_parse_sentence_answer_rejects_anything_off_format(reply: str) -> None:
    with pytest.raises(FilterAnswerError):
        parse_sentence_answer(reply, 3)


def test_records_are_prompt_completion_with_provenance() -> None:
    record = chunk_record(question="q?", chunk_text="text", relevant=True, source="hotpotqa",
                          question_id="id1", title="T", evidence={"strinc": True})
    assert record["completion"] == [{"role": "assistant", "content": "Yes"}]
    assert record["prompt"] == chunk_prompt("q?", "text", "T")
    assert (record["task"], record["source"], record["question_id"]) == ("chunk", "hotpotqa", "id1")
    assert record["evidence"] == {"strinc": True}
    sentences = sentence_record(question="q?", sentences=["a.", "b.", "c."], key_sentences=[2, 0],
                                source="nq", question_id="id2")
    assert sentences["completion"][0]["content"] == "1, 3"
    assert sentences["task"] == "sentence"
    with pytest.raises(ValueError):
        sentence_record(question="q?", sentences=["a."], key_sentences=[1], source="nq",
                        question_id="id3")
