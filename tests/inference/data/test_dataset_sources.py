"""Benchmarks from their standard sources: each published schema (rows built here) read through
`load_examples` from a jsonl or parquet file, a save_to_disk folder or `hf:NAME[:CONFIG]:SPLIT`
(`datasets.load_dataset` replaced by a local table, or run for real on a local folder), the
question-only datasets a run that retrieves may read, and the errors of each source."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sieverag.cli import main
from sieverag.inference.composition.compose import plan_run
from sieverag.inference.composition.config import RetrievalConfig, RunConfig
from sieverag.inference.core.errors import DatasetError
from sieverag.inference.data import dataset_fingerprint, detect_format, load_examples
from sieverag.inference.eval.runner import selected_examples
from sieverag.inference.pipelines.auto import AutoConfig

datasets = pytest.importorskip("datasets")

HOTPOT_SENTENCES = {
    "Radio City": ["Radio City is India's first private FM radio station.",
                   " It was started on 3 July 2001."],
    "Arthur's Magazine": ["Arthur's Magazine (1844–1846) was an American literary periodical.",
                          " It was published in Philadelphia."],
    "First for Women": ["First for Women is a woman's magazine.", " It was started in 1989."],
}
# The hub's `hotpot_qa` row: context and supporting facts as columns.
HOTPOT_HUB = {
    "id": "5a7a06935542990198eaf050",
    "question": "Which magazine was started first Arthur's Magazine or First for Women?",
    "answer": "Arthur's Magazine",
    "type": "comparison",
    "level": "medium",
    "supporting_facts": {"title": ["Arthur's Magazine", "First for Women"], "sent_id": [0, 0]},
    "context": {"title": list(HOTPOT_SENTENCES), "sentences": list(HOTPOT_SENTENCES.values())},
}
# The official release's row: the same as [title, x] pairs, `_id` for `id`.
HOTPOT_OFFICIAL = {
    "_id": HOTPOT_HUB["id"],
    "question": HOTPOT_HUB["question"],
    "answer": HOTPOT_HUB["answer"],
    "type": "comparison",
    "level": "medium",
    "supporting_facts": [["Arthur's Magazine", 0], ["First for Women", 0]],
    "context": [[title, sentences] for title, sentences in HOTPOT_SENTENCES.items()],
}
TWOWIKI = {
    "_id": "13f5ad2c088c11ebbd6fac1f6bf848b6",
    "type": "comparison",
    "question": "Who was born first, Ann Lee or Bob Ray?",
    "context": [["Ann Lee", ["Ann Lee was born in 1900.", "She was a painter."]],
                ["Bob Ray", ["Bob Ray was born in 1910."]],
                ["Cid Moe", ["Cid Moe is a river."]]],
    "supporting_facts": [["Ann Lee", 0], ["Bob Ray", 0]],
    "evidences": [["Ann Lee", "date of birth", "1900"], ["Bob Ray", "date of birth", "1910"]],
    "answer": "Ann Lee",
}
TRIVIA = {
    "question": "Which Lloyd Webber musical premiered in the US on 10th December 1993?",
    "question_id": "tc_33",
    "question_source": "http://www.triviacountry.com/",
    "entity_pages": {"doc_source": ["TagMe"], "filename": ["Andrew_Lloyd_Webber.txt"],
                     "title": ["Andrew Lloyd Webber"],
                     "wiki_context": ["Andrew Lloyd Webber wrote Sunset Boulevard."]},
    "search_results": {"description": ["A musical"], "filename": ["1.txt"], "rank": [0],
                       "title": ["Sunset Boulevard (musical)"], "url": ["http://x"],
                       "search_context": ["Sunset Boulevard opened on Broadway in 1994."]},
    "answer": {"aliases": ["Sunset Blvd", "Sunset Boulevard"], "normalized_aliases": [],
               "matched_wiki_entity_name": "", "normalized_matched_wiki_entity_name": "",
               "normalized_value": "sunset boulevard", "type": "WikipediaEntity",
               "value": "Sunset Boulevard"},
}
POPQA = {
    "id": 4222362, "subj": "George Rankin", "prop": "occupation", "obj": "politician",
    "subj_id": 1, "prop_id": 22, "obj_id": 2, "s_aliases": '["George James Rankin"]',
    "o_aliases": '["political leader"]', "s_uri": "http://www.wikidata.org/entity/Q1",
    "o_uri": "http://www.wikidata.org/entity/Q2", "s_wiki_title": "George Rankin",
    "o_wiki_title": "Politician", "s_pop": 142, "o_pop": 25692,
    "question": "What is George Rankin's occupation?",
    "possible_answers": '["politician", "political leader", "polit.", "pol"]',
}
NQ_OPEN = [{"question": "where did they film hot tub time machine",
            "answer": ["Fernie Alpine Resort"]},
           {"question": "who sang i ran all the way home", "answer": ["The Impalas"]}]
SQUAD_FLAT = {
    "id": "56be4db0acb8001400a502ec",
    "title": "Super_Bowl_50",
    "context": "Super Bowl 50 was won by the Denver Broncos.",
    "question": "Which NFL team represented the AFC at Super Bowl 50?",
    "answers": {"text": ["Denver Broncos", "Denver Broncos"], "answer_start": [29, 29]},
}
ARC = {
    "id": "Mercury_7175875",
    "question": "An astronomer observes that a planet rotates faster after a meteorite impact. "
                "Which is the most likely effect of this increase in rotation?",
    "choices": {"text": ["Planetary density will decrease.", "Planetary days will become "
                         "shorter."], "label": ["A", "B"]},
    "answerKey": "B",
}
ASQA = {
    "ambiguous_question": "Who played bonnie in gone with the wind?",
    "qa_pairs": [
        {"context": "No context provided",
         "question": "Who played Bonnie Blue Butler in the 1939 film?",
         "short_answers": ["Cammie King"], "wikipage": "Cammie King"},
        {"context": "Eleanore Cammack King played Bonnie Blue Butler as a child.",
         "question": "Who played Bonnie Blue Butler as a child?",
         "short_answers": ["Eleanore Cammack King", "Cammie King"], "wikipage": "Cammie King"},
    ],
    "wikipages": [{"title": "Cammie King", "url": "https://en.wikipedia.org/wiki/Cammie_King"}],
    "annotations": [{"knowledge": [{"content": "Cammie King was an actress.",
                                    "wikipage": "Cammie King"}],
                     "long_answer": "Cammie King played Bonnie Blue Butler."}],
    "sample_id": "-4377718773044986307",
}
FLASHRAG = {"id": "test_0", "question": "who got the first nobel prize in physics",
            "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {}}


@pytest.fixture(autouse=True)
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every `datasets` cache in tmp_path; the hub offline."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return cache


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def hub_returns(monkeypatch: pytest.MonkeyPatch, rows: list[dict]) -> list[tuple]:
    """Make `datasets.load_dataset` return a local table of `rows`; returns its calls."""
    calls: list[tuple] = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


# ---- each schema through its source ----------------------------------------------------------


def test_hotpotqa_from_the_hub_and_the_official_jsonl_read_alike(tmp_path, monkeypatch):
    calls = hub_returns(monkeypatch, [HOTPOT_HUB])
    spec = "hf:hotpotqa/hotpot_qa:distractor:validation"
    (hub,) = load_examples(spec)
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "validation")]
    assert detect_format(spec) == "hotpotqa-original"
    (official,) = load_examples(write_jsonl(tmp_path / "hotpot_dev.jsonl", [HOTPOT_OFFICIAL]))
    assert hub == official
    assert hub.id == "5a7a06935542990198eaf050" and hub.answers == ("Arthur's Magazine",)
    assert hub.metadata == {"dataset": "hotpotqa", "type": "comparison", "level": "medium"}
    assert [d.title for d in hub.documents] == list(HOTPOT_SENTENCES)
    assert [d.is_gold for d in hub.documents] == [False, True, True]
    assert [d.supporting_sentences for d in hub.documents] == [(), (0,), (0,)]
    magazine = hub.documents[1]
    assert magazine.id == f"{hub.id}/1"
    assert magazine.text == ("Arthur's Magazine (1844–1846) was an American literary "
                             "periodical. It was published in Philadelphia.")


def test_hotpotqa_hub_columns_from_parquet(tmp_path):
    path = tmp_path / "validation.parquet"
    datasets.Dataset.from_list([HOTPOT_HUB]).to_parquet(str(path))
    assert detect_format(path) == "hotpotqa-original"
    (example,) = load_examples(path)
    assert [d.is_gold for d in example.documents] == [False, True, True]


def test_2wikimultihopqa_official_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "dev.jsonl", [TWOWIKI])
    assert detect_format(path) == "2wikimultihopqa"
    (example,) = load_examples(path)
    assert example.id == TWOWIKI["_id"] and example.answers == ("Ann Lee",)
    assert example.metadata == {"dataset": "2wikimultihopqa", "type": "comparison"}
    assert [d.is_gold for d in example.documents] == [True, True, False]
    # Its sentences carry no spaces: a space joins them.
    assert example.documents[0].text == "Ann Lee was born in 1900. She was a painter."
    assert example.documents[0].sentences == ("Ann Lee was born in 1900.", "She was a painter.")


def test_triviaqa_from_a_save_to_disk_folder_with_splits(tmp_path):
    no_context = {**TRIVIA, "question_id": "tc_40",
                  "entity_pages": {key: [] for key in TRIVIA["entity_pages"]},
                  "search_results": {key: [] for key in TRIVIA["search_results"]}}
    folder = tmp_path / "trivia_qa_rc"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list([TRIVIA]),
        "validation": datasets.Dataset.from_list([TRIVIA, no_context]),
    }).save_to_disk(str(folder))
    assert detect_format(f"{folder}:train") == "triviaqa-original"
    (example,) = load_examples(f"{folder}:train")
    assert example.id == "tc_33"
    assert example.answers == ("Sunset Boulevard", "Sunset Blvd")
    assert [(d.id, d.title) for d in example.documents] == [
        ("tc_33/0", "Andrew Lloyd Webber"), ("tc_33/1", "Sunset Boulevard (musical)")]
    assert example.metadata == {"dataset": "triviaqa",
                                "question_source": "http://www.triviacountry.com/"}
    # A row without contexts (the nocontext configs) is a question alone.
    with pytest.raises(DatasetError, match=r"trivia_qa_rc:validation, row 1: record has no "
                                           r"documents \(expected in 'entity_pages' or"):
        load_examples(f"{folder}:validation")
    questions = load_examples(f"{folder}:validation", require_documents=False)
    assert [len(e.documents) for e in questions] == [2, 0]


def test_popqa_from_the_hub_has_no_documents(monkeypatch):
    hub_returns(monkeypatch, [POPQA])
    spec = "hf:akariasai/PopQA:test"
    assert detect_format(spec) == "popqa"
    with pytest.raises(DatasetError, match=r"hf:akariasai/PopQA:test, row 0: record has no "
                                           "documents"):
        load_examples(spec)
    (example,) = load_examples(spec, require_documents=False)
    assert example.id == "4222362" and example.documents == ()
    assert example.answers == ("politician", "political leader", "polit.", "pol")
    assert example.metadata["s_pop"] == 142 and example.metadata["prop"] == "occupation"


def test_nq_open_from_parquet(tmp_path):
    path = tmp_path / "nq_open-validation.parquet"
    datasets.Dataset.from_list(NQ_OPEN).to_parquet(str(path))
    assert detect_format(path) == "nq-open"
    first, second = load_examples(path)
    assert (first.id, second.id) == ("nq-open-0", "nq-open-1")
    assert first.answers == ("Fernie Alpine Resort",) and first.documents == ()
    assert first.metadata == {"dataset": "nq"}
    assert load_examples(path, limit=1) == [first]


def test_squad_flat_rows_from_the_hub(monkeypatch):
    hub_returns(monkeypatch, [SQUAD_FLAT])
    spec = "hf:rajpurkar/squad:validation"
    assert detect_format(spec) == "squad-flat"
    (example,) = load_examples(spec)
    assert example.answers == ("Denver Broncos",)
    (paragraph,) = example.documents
    assert paragraph.id == "56be4db0acb8001400a502ec/0"
    assert paragraph.title == "Super Bowl 50" and paragraph.is_gold is True
    assert example.metadata == {"dataset": "squad"}


def test_arc_from_a_single_dataset_folder(tmp_path):
    folder = tmp_path / "arc_challenge_test"
    datasets.Dataset.from_list([ARC]).save_to_disk(str(folder))
    assert detect_format(folder) == "arc"
    (example,) = load_examples(folder)
    assert example.choices == dict(zip(ARC["choices"]["label"], ARC["choices"]["text"],
                                       strict=True))
    assert example.answer_key == "B"
    assert example.answers == ("Planetary days will become shorter.", "B")


@pytest.mark.parametrize("source", ["jsonl", "hub"])
def test_asqa_answers_are_all_short_answers(tmp_path, monkeypatch, source):
    if source == "hub":
        hub_returns(monkeypatch, [ASQA])
        dataset = "hf:din0s/asqa:dev"
    else:
        dataset = str(write_jsonl(tmp_path / "asqa_dev.jsonl", [ASQA]))
    assert detect_format(dataset) == "asqa"
    (example,) = load_examples(dataset)
    assert example.id == "-4377718773044986307"
    assert example.question == "Who played bonnie in gone with the wind?"
    assert example.answers == ("Cammie King", "Eleanore Cammack King")
    (context,) = example.documents  # "No context provided" is no document
    assert context.text.startswith("Eleanore") and context.title == "Cammie King"
    assert example.metadata["qa_pairs"] == [
        {"question": "Who played Bonnie Blue Butler in the 1939 film?",
         "short_answers": ["Cammie King"]},
        {"question": "Who played Bonnie Blue Butler as a child?",
         "short_answers": ["Eleanore Cammack King", "Cammie King"]},
    ]
    assert example.metadata["long_answers"] == ["Cammie King played Bonnie Blue Butler."]
    # Its records carry ASQA's own scores, and the summary averages them.
    from sieverag.inference.eval.result_records import answer_metrics
    from sieverag.inference.eval.summary import ANSWER_METRICS

    metrics = answer_metrics(example, "Cammie King, as a child.")
    assert (metrics.str_em, metrics.str_hit) == (1.0, 1.0)
    # ROUGE-L against the long answer: LCS "cammie king" of 5 and 6 tokens, F = 2·2/11
    assert metrics.rouge_l == pytest.approx(4 / 11)
    metrics = answer_metrics(example, "Eleanore Cammack King")  # only the second pair's
    assert (metrics.str_em, metrics.str_hit) == (0.5, 0.0)
    assert {"str_em", "str_hit", "rouge_l"} <= set(ANSWER_METRICS)


def test_flashrag_rows_are_questions_without_documents(tmp_path):
    path = write_jsonl(tmp_path / "test.jsonl", [FLASHRAG])
    assert detect_format(path) == "common"
    with pytest.raises(DatasetError, match=r"test\.jsonl, line 1: record has no documents"):
        load_examples(path)
    (example,) = load_examples(path, require_documents=False)
    assert example.id == "test_0" and example.answers == ("Wilhelm Conrad Röntgen",)


def test_a_real_hub_load_of_a_local_dataset_folder(tmp_path):
    """`datasets.load_dataset` itself (on a local folder, so without the network)."""
    repo = tmp_path / "nq-repo"
    repo.mkdir()
    write_jsonl(repo / "train.jsonl", NQ_OPEN[:1])
    write_jsonl(repo / "validation.jsonl", NQ_OPEN)
    spec = f"hf:{repo}:validation"
    assert [e.answers for e in load_examples(spec)] == [("Fernie Alpine Resort",),
                                                         ("The Impalas",)]
    with pytest.raises(DatasetError, match=r":nope: has no split 'nope' .*'train', "
                                           r"'validation'"):
        load_examples(f"hf:{repo}:nope")
    assert dataset_fingerprint(spec) == dataset_fingerprint(spec)


# ---- question-only datasets in a run -----------------------------------------------------------


@pytest.mark.parametrize(("pipelines", "routed", "retrieves", "needed"), [
    (("direct",), "vanilla", False, False),
    (("vanilla",), "vanilla", False, True),
    (("direct", "main-rag"), "vanilla", False, True),
    (("vanilla", "amber"), "vanilla", True, False),
    (("auto",), "vanilla", False, True),
    (("auto",), "direct", False, False),
])
def test_documents_are_needed_only_where_given_ones_are_read(pipelines, routed, retrieves,
                                                             needed):
    config = RunConfig(dataset="d.jsonl", pipelines=pipelines,
                       auto=AutoConfig(routed_pipeline=routed),
                       retrieval=RetrievalConfig(index="idx") if retrieves else None)
    assert plan_run(config).reads_given_documents is needed


def test_a_run_over_an_index_reads_a_question_only_dataset(tmp_path):
    path = write_jsonl(tmp_path / "flashrag_nq.jsonl", [FLASHRAG])
    config = RunConfig(dataset=str(path), pipelines=("vanilla",))
    with pytest.raises(DatasetError, match="record has no documents.*retrieval.index"):
        selected_examples(plan_run(config))
    retrieving = replace(config, retrieval=RetrievalConfig(index=str(tmp_path / "index")))
    assert [e.id for e in selected_examples(plan_run(retrieving))] == ["test_0"]
    direct = replace(config, pipelines=("direct",))
    assert [e.id for e in selected_examples(plan_run(direct))] == ["test_0"]


# ---- bad input -------------------------------------------------------------------------------


def test_a_hub_dataset_not_cached_while_offline(capsys, tmp_path):
    spec = "hf:sieverag-tests/not-cached-anywhere:train"
    with pytest.raises(DatasetError) as info:
        load_examples(spec)
    message = str(info.value)
    assert message.startswith(spec) and "sieverag-tests/not-cached-anywhere" in message
    assert "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set" in message
    # The command line: one line, exit 2, before any model loads.
    assert main(["eval", "--pipelines", "direct", "--quiet", "--dataset", spec,
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE" in err and "Traceback" not in err


@pytest.mark.parametrize("spec", ["hf:nq_open", "hf:a:b:c:d", "hf:nq_open:"])
def test_a_malformed_hub_name(spec):
    with pytest.raises(DatasetError, match=r"a hub dataset is named hf:NAME\[:CONFIG\]:SPLIT"):
        load_examples(spec)


def test_splits_of_a_folder_are_listed(tmp_path):
    folder = tmp_path / "nq"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(NQ_OPEN[:1]),
                          "validation": datasets.Dataset.from_list(NQ_OPEN)}
                         ).save_to_disk(str(folder))
    with pytest.raises(DatasetError, match=r"holds the splits train, validation; name one as "
                                           r".*nq:SPLIT"):
        load_examples(folder)
    with pytest.raises(DatasetError, match=r"nq:test: there is no split 'test'; the folder "
                                           "holds train, validation"):
        load_examples(f"{folder}:test")
    assert len(load_examples(f"{folder}:validation")) == 2
    single = tmp_path / "single"
    datasets.Dataset.from_list(NQ_OPEN).save_to_disk(str(single))
    with pytest.raises(DatasetError, match="holds one dataset, not splits; drop ':test'"):
        load_examples(f"{single}:test")


def test_a_schema_no_format_knows_lists_its_keys_and_the_known_ones(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"query": "q?", "response": "a"}])
    with pytest.raises(DatasetError) as info:
        load_examples(path)
    message = str(info.value)
    assert "first record's keys (query, response)" in message
    assert "hotpotqa-original {answer, context, question, supporting_facts}" in message
    assert "asqa {ambiguous_question, qa_pairs}" in message
    hub_returns(monkeypatch, [{"query": "q?", "response": "a"}])
    with pytest.raises(DatasetError, match=r"hf:x/y:train: cannot tell the dataset format"):
        load_examples("hf:x/y:train")


def test_a_whole_file_format_is_refused_for_a_table(monkeypatch):
    hub_returns(monkeypatch, [SQUAD_FLAT])
    with pytest.raises(DatasetError, match="the 'squad' format is read from its own file"):
        load_examples("hf:rajpurkar/squad:validation", fmt="squad")


def test_a_bad_row_names_the_table_row_and_field(tmp_path):
    path = tmp_path / "hotpot.parquet"
    bad = {**HOTPOT_HUB, "answer": ""}
    datasets.Dataset.from_list([HOTPOT_HUB, bad]).to_parquet(str(path))
    with pytest.raises(DatasetError, match=r"hotpot\.parquet, row 1: example has no answers "
                                           r"\('answer' is empty\)"):
        load_examples(path)


def test_a_corrupt_parquet_file(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 32)
    with pytest.raises(DatasetError, match=r"broken\.parquet: cannot be read as parquet"):
        load_examples(path)


def test_a_dataset_is_identified_by_its_hub_name_or_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Labelling's resume check names a dataset by `dataset_identity`: a hub split stays as
    written (not a path under the working folder), a file or folder is made absolute."""
    from sieverag.inference.data import dataset_identity

    monkeypatch.chdir(tmp_path)
    assert dataset_identity("hf:nq_open:validation") == "hf:nq_open:validation"
    assert dataset_identity("data.jsonl") == str(tmp_path / "data.jsonl")
    assert dataset_identity("saved:train") == str(tmp_path / "saved:train")
