"""The one-pass filter format: both granularities read from one forward pass per chunk.

The format (`filter_format.passage_prompt`, `passage_training_ids`), the in-process reading
(`HFBackend.marked_label_logprobs`, checked against one plain forward pass per prompt), MCF
on a one-pass card (one call, sentence verdicts from it, no generation), the dataset builder's
passage records and a two-step training run whose card says one_pass.
"""

from __future__ import annotations

import json

import pytest
import torch

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.combination import FILTER_ALONE, PRIORS_ONLY, card_combination
from sieverag.inference.filters.filter_format import (
    IGNORED,
    PASSAGE_TEMPLATE,
    FilterAnswerError,
    card_format,
    passage_prompt,
    passage_record,
    passage_training_ids,
    passage_verdicts,
)
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.llm.backend_protocol import LABEL_MARK, marked_prompt_ids

QUESTION = "Who founded the Bridge Company?"
SENTENCES = ["The Bridge Company builds bridges.", "It was founded by Ada Byron.",
             "Bananas are yellow."]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=4))


def plain_reads(backend, prompt, labels=("Yes", "No")) -> list[dict[str, float]]:
    """The verdicts read from one unbatched forward pass over the whole sequence."""
    ids, marks = marked_prompt_ids(backend.tokenizer, backend.render(prompt))
    with torch.no_grad():
        logprobs = torch.log_softmax(backend.model(torch.tensor([ids])).logits[0].float(), -1)
    tokens = [backend.tokenizer(label, add_special_tokens=False)["input_ids"][0]
              for label in labels]
    return [{label: logprobs[p, t].item() for label, t in zip(labels, tokens, strict=True)}
            for p in [*marks, len(ids) - 1]]


def test_the_passage_prompt_marks_each_sentence_and_the_model_never_reads_a_mark(backend):
    prompt = passage_prompt(QUESTION, [*SENTENCES[:2], f"Odd{LABEL_MARK} text."], "Bridge")
    text = backend.render(prompt)
    assert text.count(LABEL_MARK) == 3  # the mark inside the text was taken out
    ids, marks = marked_prompt_ids(backend.tokenizer, text)
    assert len(marks) == 3 and marks == sorted(marks)
    assert LABEL_MARK not in backend.tokenizer.decode(ids)
    # Each mark falls after its sentence's last token.
    assert backend.tokenizer.decode(ids[:marks[1] + 1]).endswith("founded by Ada Byron.")
    with pytest.raises(ValueError, match="at least one sentence"):
        passage_prompt(QUESTION, [])


def test_marked_reads_equal_one_plain_forward_pass_per_prompt(backend):
    prompts = [passage_prompt(QUESTION, SENTENCES, "Bridge"),
               passage_prompt(QUESTION, SENTENCES[:1]),
               passage_prompt(QUESTION, [SENTENCES[0], "Another one here.", "And a third."]),
               passage_prompt(QUESTION, SENTENCES, "Bridge")]  # a duplicate: shared prefix
    reads = backend.marked_label_logprobs(prompts, ["Yes", "No"], agent="filter_passage")
    assert [len(r) for r in reads] == [4, 2, 4, 4]
    for prompt, read in zip(prompts, reads, strict=True):
        for got, want in zip(read, plain_reads(backend, prompt), strict=True):
            assert got == pytest.approx(want, abs=1e-4)
    assert backend.meter.by_agent["filter_passage"].calls == 4


def test_a_prompt_without_marks_reads_what_label_logprobs_reads(backend):
    from sieverag.inference.filters.filter_format import chunk_prompt

    prompt = chunk_prompt(QUESTION, " ".join(SENTENCES))
    (read,) = backend.marked_label_logprobs([prompt], ["Yes", "No"])
    (plain,) = backend.label_logprobs([prompt], ["Yes", "No"])
    assert len(read) == 1 and read[0] == pytest.approx(plain, abs=1e-4)
    assert backend.marked_label_logprobs([], ["Yes", "No"]) == []
    with pytest.raises(ValueError, match="more than one"):
        backend.marked_label_logprobs([prompt], ["Yes", "Nope maybe"])


def test_training_ids_put_each_verdict_after_its_read_position(backend):
    record = passage_record(question=QUESTION, sentences=SENTENCES, key_sentences=[1],
                            relevant=True, source="s", question_id="q1", title="Bridge")
    assert record["task"] == "passage" and record["sentence_labels"] == ["No", "Yes", "No"]
    trained = passage_training_ids(backend.tokenizer, record)
    ids, marks = marked_prompt_ids(backend.tokenizer, backend.render(record["prompt"]))
    assert trained["input_ids"][:-1] == ids  # the prompt as every backend reads it
    yes, no = (backend.tokenizer(w, add_special_tokens=False)["input_ids"][0]
               for w in ("Yes", "No"))
    assert trained["input_ids"][-1] == yes  # the passage's verdict, as the completion
    labelled = {i: t for i, t in enumerate(trained["labels"]) if t != IGNORED}
    assert labelled == {marks[0] + 1: no, marks[1] + 1: yes, marks[2] + 1: no, len(ids): yes}
    unknown = passage_record(question=QUESTION, sentences=SENTENCES, key_sentences=None,
                             relevant=True, source="s", question_id="q1", title="Bridge")
    only_passage = passage_training_ids(backend.tokenizer, unknown)["labels"]
    assert [i for i, t in enumerate(only_passage) if t != IGNORED] == [len(ids)]
    with pytest.raises(ValueError, match="out of range"):
        passage_record(question=QUESTION, sentences=SENTENCES, key_sentences=[3],
                       relevant=True, source="s", question_id="q1")


def test_a_card_names_its_format_and_an_unknown_one_is_refused():
    assert card_format(None) == "two_stage" and card_format({}) == "two_stage"
    assert card_format({"filter_format": "one_pass"}) == "one_pass"
    assert card_combination({"filter_format": "one_pass"}).filter_format == "one_pass"
    assert card_combination({"filter_format": "one_pass"}).weights == FILTER_ALONE.weights
    with pytest.raises(FilterAnswerError, match="three_pass"):
        card_format({"filter_format": "three_pass"})
    with pytest.raises(FilterAnswerError, match="verdicts"):
        passage_verdicts([{"Yes": 0.0, "No": 0.0}] * 3, 1)


def documents() -> list[Document]:
    return [Document(id="a", title="Bridge", text=" ".join(SENTENCES),
                     sentences=tuple(SENTENCES)),
            Document(id="b", title="Fruit", text="Bananas are yellow. Apples are red.",
                     sentences=("Bananas are yellow.", "Apples are red.")),
            Document(id="c", text="One sentence only.")]


def test_mcf_on_a_one_pass_filter_reads_both_granularities_in_one_call(backend):
    from dataclasses import replace

    combination = replace(PRIORS_ONLY, filter_format="one_pass")
    before = backend.meter.snapshot()
    config = MCFConfig(lexical_weight=0.0, bar="top_k", top_k=3, sentence_stage=True,
                       sentence_p_min=0.5)
    result = MultiGranularFilter(backend, config, combination).select(QUESTION, documents())
    used = backend.meter.since(before)
    assert set(used) == {"filter_passage"} and used["filter_passage"].calls == 3
    reads = backend.marked_label_logprobs(
        [passage_prompt(QUESTION, list(d.sentences) if d.sentences else [d.text], d.title)
         for d in documents()], ["Yes", "No"])
    for scored, read in zip(result.scored, reads, strict=True):
        passage, sentence_scores = passage_verdicts(read, len(read) - 1)
        assert scored.details["filter_score"] == pytest.approx(passage, abs=1e-3)
        assert scored.details["sentence_scores"] == pytest.approx(sentence_scores, abs=1e-3)
    assert result.kept
    for kept in result.kept:
        scores = kept.details["sentence_scores"]
        if len(scores) == 1:
            assert kept.details["sentence_status"] == "single"
            continue
        # At P >= 0.5, and at least the best one.
        wanted = sorted({i for i, s in enumerate(scores) if s >= 0.0}
                        | {max(range(len(scores)), key=lambda i: scores[i])})
        assert kept.details["key_sentences"] == wanted
        assert kept.details["sentence_status"] == "parsed"
        assert len(kept.document.sentences) == len(wanted)


def test_the_sentence_bar_decides_which_sentences_stay(backend):
    from dataclasses import replace

    combination = replace(PRIORS_ONLY, filter_format="one_pass")
    loose = MCFConfig(lexical_weight=0.0, bar="top_k", top_k=1, sentence_stage=True,
                      sentence_p_min=1e-9)
    strict = replace(loose, sentence_p_min=1 - 1e-9, sentence_min_keep=0,
                     empty_sentence_answer="drop_chunk")
    kept_all = MultiGranularFilter(backend, loose, combination).select(QUESTION, documents()[:2])
    assert kept_all.kept[0].details["key_sentences"] == list(
        range(len(kept_all.kept[0].details["sentence_scores"])))
    dropped = MultiGranularFilter(backend, strict, combination).select(QUESTION, documents()[:2])
    assert dropped.kept == ()
    assert [s.details["sentence_status"] for s in dropped.scored if s.details.get(
        "sentence_status")] == ["none_dropped"]


def test_key_sentences_are_those_at_the_bar_and_at_least_the_best():
    from sieverag.inference.filters.mcf import key_sentence_indices

    scores = [-3.0, 1.0, -0.5, None, 2.0]
    assert key_sentence_indices(scores, 0.5, 1) == [1, 4]
    assert key_sentence_indices(scores, 0.99, 1) == [4]  # none at the bar: the best
    assert key_sentence_indices(scores, 0.99, 2) == [1, 4]
    assert key_sentence_indices(scores, 0.99, 0) == []
    assert key_sentence_indices([None, None], 0.1, 1) == []  # unread sentences are never key
    assert key_sentence_indices([0.0, 0.0], 0.99, 1) == [0]  # a tie: the earlier


def test_build_dataset_writes_passage_records_from_the_labels(tmp_path):
    from sieverag.data_gen.dataset import DatasetConfig, build_dataset
    from sieverag.data_gen.labelling import LABELS_FILE

    def chunk(key: str, sentences: list[str], gold: bool, gold_sentences: list[int],
              strinc: list[bool]) -> dict:
        return {"id": key, "title": key, "text": " ".join(sentences), "sentences": sentences,
                "sentences_given": True, "gold": gold, "gold_sentences": gold_sentences,
                "strinc": any(strinc), "sentence_strinc": strinc, "cxmi": None,
                "sentence_cxmi": None, "teacher": None}

    rows = []
    for n in range(6):
        rows.append({
            "source": "hotpotqa", "question_id": f"q{n}", "question": f"Who built bridge {n}?",
            "answers": ["Ada"], "no_context_logprobs": None,
            "chunks": [
                chunk(f"g{n}", [f"Bridge {n} is old.", "Ada built it."], True, [1],
                      [False, True]),
                chunk(f"x{n}", ["Bananas are yellow.", "Apples are red."], False, [],
                      [False, False]),
                # Relevant by gold, but no sentence says why: it teaches its verdict only.
                chunk(f"h{n}", ["A hint.", "Another."], True, None, [False, False]),
            ]})
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / LABELS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows),
                                      encoding="utf-8")
    summary = build_dataset(DatasetConfig(labels=(str(labels),), out=str(tmp_path / "out"),
                                          filter_format="one_pass", chunk_positive_fraction=0,
                                          validation_fraction=0.3), progress=False)
    records = [json.loads(line) for split in ("train", "validation") for line in
               (tmp_path / "out" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 18 and {r["task"] for r in records} == {"passage"}
    by_chunk = {r["evidence"]["chunk_id"][0]: r for r in records}
    assert by_chunk["g"]["sentence_labels"] == ["No", "Yes"]
    assert by_chunk["g"]["completion"][0]["content"] == "Yes"
    assert by_chunk["x"]["sentence_labels"] == ["No", "No"]
    assert by_chunk["h"]["sentence_labels"] == [None, None]
    assert by_chunk["h"]["completion"][0]["content"] == "Yes"
    assert summary.counts["train"]["passage"] + summary.counts["validation"]["passage"] == 18


def test_one_pass_training_trains_at_the_verdicts_and_its_card_says_so(tmp_path,
                                                                       tiny_model_dir):
    from datasets import Dataset, DatasetDict
    from sft_runs import assert_trained_adapter, launch_training

    def records(prefix: str, questions: int) -> list[dict]:
        out = []
        for n in range(questions):
            common = {"question": f"Who founded company {prefix}{n}?", "source": "synthetic",
                      "question_id": f"{prefix}{n}"}
            out += [passage_record(sentences=[f"Company {prefix}{n} is old.",
                                              f"Ada Byron {n} founded it."],
                                   key_sentences=[1], relevant=True, **common),
                    passage_record(sentences=["Bananas are yellow.", "They grow in warm places."],
                                   key_sentences=[], relevant=False, **common),
                    passage_record(sentences=["Rain falls."], key_sentences=[], relevant=False,
                                   **common)]
        return out

    DatasetDict({"train": Dataset.from_list(records("t", 4)),
                 "validation": Dataset.from_list(records("v", 1))}
                ).save_to_disk(tmp_path / "data" / "dataset")
    out = tmp_path / "run"
    weights = launch_training("cpu.yaml", tmp_path / "data", tiny_model_dir, out)
    card = json.loads((out / "sieverag_adapter.json").read_text(encoding="utf-8"))
    assert card["filter_format"] == "one_pass"
    assert list(card["prompt_templates"]) == [PASSAGE_TEMPLATE]
    assert card["dataset"]["tasks"]["train"] == {"passage": 12}
    # The validation split: 5 sentence verdicts, 1 Yes; 3 passage verdicts, 1 Yes.
    assert card["metrics"]["base_rate_loss"] == pytest.approx(0.5514, abs=1e-4)
    assert_trained_adapter(out, tiny_model_dir, weights, records={"train": 12, "eval": 3},
                           tasks={"passage": 12})


def test_a_split_mixing_formats_is_refused():
    from datasets import Dataset

    from sieverag.inference.core.errors import DatasetError
    from sieverag.inference.filters.filter_format import chunk_record
    from sieverag.training.sft.data import filter_format_of

    common = {"question": QUESTION, "source": "s", "question_id": "q"}
    mixed = Dataset.from_list([
        chunk_record(chunk_text="x", relevant=True, **common),
        {**passage_record(sentences=["x"], key_sentences=[], relevant=False, **common)}])
    with pytest.raises(DatasetError, match="mixes one-pass passage records"):
        filter_format_of(mixed)


def test_the_sentence_stage_scores_chunks_given_without_a_reading(backend):
    """As eval-filter's oracle row does: gold chunks handed straight to the sentence stage
    are read once, in one call, then cut by the sentence bar."""
    from dataclasses import replace

    from sieverag.inference.filters.document_filter import ScoredDocument

    mcf = MultiGranularFilter(backend, MCFConfig(sentence_stage=True, sentence_p_min=1e-9),
                              replace(PRIORS_ONLY, filter_format="one_pass"))
    before = backend.meter.snapshot()
    narrowed = mcf.sentence_stage(QUESTION, [ScoredDocument(d, 0.0, True)
                                             for d in documents()[:2]])
    assert backend.meter.since(before)["filter_passage"].calls == 2
    assert [s.details["key_sentences"] for s in narrowed] == [[0, 1, 2], [0, 1]]
    assert all(s.details["sentence_status"] == "parsed" for s in narrowed)


def test_ranked_spans_carry_each_sentences_score(backend):
    """`rank_by_filter` on a one-pass filter: each sentence's span holds its P(relevant) from
    the one reading, the key ones marked, the pruned text what MCF passes on."""
    from dataclasses import replace

    from sieverag.inference.filters.filter_format import p_relevant
    from sieverag.inference.filters.ranking import as_documents, rank_by_filter
    from sieverag.inference.retrieval.sentences import split_sentences

    combination = replace(PRIORS_ONLY, filter_format="one_pass")
    config = MCFConfig(lexical_weight=0.0, bar="top_k", top_k=1, sentence_stage=True,
                       sentence_p_min=0.5)
    texts = [" ".join(SENTENCES), "Bananas are yellow. They grow in bunches."]
    ranked = rank_by_filter(backend, config, QUESTION, as_documents(texts), combination)
    selected = MultiGranularFilter(backend, config, combination).select(
        QUESTION, as_documents(texts))
    assert sum(r.kept for r in ranked) == 1
    for result, scored in zip(ranked, selected.scored, strict=True):
        text = texts[result.index]
        assert [text[s.start:s.end] for s in result.spans] == split_sentences(text)
        assert [s.score for s in result.spans] == pytest.approx(
            [p_relevant(v) for v in scored.details["sentence_scores"]])
        keys = scored.details["key_sentences"] if result.kept else []
        assert [i for i, s in enumerate(result.spans) if s.kept] == keys
        assert result.pruned_text == (scored.document.text if result.kept else "")
