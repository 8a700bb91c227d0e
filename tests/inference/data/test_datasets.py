"""Dataset loaders: each format on small fixture rows, auto-detection, errors, real files."""

from __future__ import annotations

import gzip
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from repo_paths import SHARED_DATA, TEST_DATA

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.data import (
    DATASET_FORMATS,
    detect_format,
    load_examples,
    load_squad_corpus,
    load_squad_paragraphs,
)

DATA = TEST_DATA


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def nq_gz(tmp_path: Path) -> Path:
    path = tmp_path / "nq-open-oracle.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write((DATA / "nq_sample.jsonl").read_bytes())
    return path


@pytest.fixture
def squad_zip(tmp_path: Path) -> Path:
    path = tmp_path / "squad_dev_v1.1.json.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(DATA / "squad_sample.json", "dev-v1.1.json")
    return path


# ---- formats ---------------------------------------------------------------------------


def test_hotpotqa_with_supporting_facts() -> None:
    example = load_examples(DATA / "hotpotqa_sample.jsonl")[0]
    assert example.id == "5a881d2355429938390d3eeb"
    assert example.answers == ("Love and Theft",)
    assert example.metadata == {"dataset": "hotpotqa", "type": "bridge", "level": "hard"}
    assert [d.id for d in example.documents] == [f"{example.id}/{i}" for i in range(3)]
    assert [d.is_gold for d in example.documents] == [False, True, True]
    distractor, duo, song = example.documents
    assert duo.title == "Love and Theft (duo)"
    assert duo.sentences is not None and len(duo.sentences) == 3
    assert "".join(duo.sentences) == duo.text
    assert duo.supporting_sentences == (0, 1)
    assert song.supporting_sentences == (2,)
    assert distractor.supporting_sentences == ()
    assert example.has_gold_documents


def test_hotpotqa_without_supporting_facts() -> None:
    example = load_examples(DATA / "hotpotqa_sample.jsonl")[1]
    assert [d.is_gold for d in example.documents] == [False, True, True]
    assert all(d.sentences is None for d in example.documents)
    assert all(d.supporting_sentences is None for d in example.documents)


def test_hotpotqa_drops_supporting_indices_past_the_sentences(tmp_path: Path) -> None:
    record = {
        "id": "h1",
        "question": "q?",
        "answers": ["a"],
        "passages": [{"title": "T", "sentences": ["One.", " Two."], "is_gold": True}],
        "supporting_facts": [["T", 1], ["T", 5]],
    }
    path = write_lines(tmp_path / "hotpotqa.jsonl", [json.dumps(record)])
    (document,) = load_examples(path)[0].documents
    assert document.text == "One. Two."
    assert document.supporting_sentences == (1,)


def test_nq_from_gzip(nq_gz: Path) -> None:
    first, second = load_examples(nq_gz)
    assert (first.id, second.id) == ("nq-1", "nq-2")
    assert first.answers == ("Wilhelm Conrad Röntgen",)
    assert first.documents[0].is_gold is True
    assert first.documents[0].id == "nq-1/0"
    assert first.documents[0].title == "List of Nobel laureates in Physics"
    # The second row's first ctx lacks `isgold`: `hasanswer` stands in.
    assert [d.is_gold for d in second.documents] == [True, False]


def test_nq_ids_follow_file_lines_past_blank_lines(tmp_path: Path) -> None:
    lines = (DATA / "nq_sample.jsonl").read_text(encoding="utf-8").splitlines()
    path = write_lines(tmp_path / "nq.jsonl", ["", lines[0], "  ", lines[1]])
    assert [e.id for e in load_examples(path)] == ["nq-2", "nq-4"]


def test_popqa_list_and_python_literal_answers() -> None:
    first, second = load_examples(DATA / "popqa_sample.jsonl")
    assert first.id == "3994636"
    assert first.answers == (
        "politician",
        "political leader",
        "political figure",
        "polit.",
        "pol",
    )
    assert [d.id for d in first.documents] == ["3994636/0", "3994636/1"]
    assert all(d.title == "Edward Corser" and d.is_gold is None for d in first.documents)
    assert first.metadata["prop"] == "occupation"
    # The second row's answers are the string "['...', ...]" and its web knowledge is empty.
    assert second.answers == first.answers
    assert [d.id for d in second.documents] == ["6539068/0"]


def test_popqa_bad_literal_is_an_error(tmp_path: Path) -> None:
    record = {
        "question": "q?",
        "answers": "['unclosed",
        "s_wiki_title": "T",
        "crag_refined_retrieved_knowledge": "text",
    }
    path = write_lines(tmp_path / "popqa.jsonl", [json.dumps(record)])
    with pytest.raises(DatasetError, match=r"line 1: 'answers' is not a valid list literal"):
        load_examples(path)


def test_squad_from_zip(squad_zip: Path) -> None:
    examples = load_examples(squad_zip)
    assert len(examples) == 6
    first = examples[0]
    assert first.id == "56be4db0acb8001400a502ec"
    assert first.answers == ("Denver Broncos",)
    (paragraph,) = first.documents
    assert paragraph.is_gold is True
    assert paragraph.id == "squad-p0" and paragraph.title == "Super Bowl 50"
    assert examples[3].answers == ("8", "eight")
    assert examples[-1].metadata["gold_doc_id"] == "squad-p2"
    assert load_examples(squad_zip, limit=2) == examples[:2]


def test_squad_corpus_and_paragraphs(squad_zip: Path) -> None:
    paragraphs, examples = load_squad_corpus(squad_zip)
    assert [p.id for p in paragraphs] == ["squad-p0", "squad-p1", "squad-p2"]
    assert all(p.is_gold is None for p in paragraphs)
    assert load_squad_paragraphs(squad_zip) == paragraphs
    by_id = {p.id: p for p in paragraphs}
    for example in examples:
        gold = by_id[example.metadata["gold_doc_id"]]
        assert example.documents[0].text == gold.text
    assert [e.metadata["gold_doc_id"] for e in examples] == ["squad-p0"] * 2 + ["squad-p1"] * 2 + [
        "squad-p2"
    ] * 2


def test_squad_plain_json(tmp_path: Path) -> None:
    path = shutil.copy(DATA / "squad_sample.json", tmp_path / "squad-dev.json")
    assert len(load_examples(path)) == 6


def test_common_format() -> None:
    first, second = load_examples(DATA / "common_sample.jsonl")
    assert first.id == "common-q1"
    assert first.answers == ("Herman Melville",)
    assert [d.is_gold for d in first.documents] == [True, False]
    assert second.id == "common-3"
    assert [d.is_gold for d in second.documents] == [True, False, None]
    assert second.documents[0].as_context() == (
        "Paris\nParis is the capital and most populous city of France."
    )


def test_triviaqa() -> None:
    first, second = load_examples(DATA / "triviaqa_sample.jsonl")
    assert first.id == "qw_2021" and first.documents == ()
    assert "Yuri Gagarin" in first.answers
    assert second.answers == ("Fat Larry's Band", "fat larry s band", "Fat Larry’s Band")


def test_arc() -> None:
    example = load_examples(DATA / "arc_sample.jsonl")[0]
    assert example.choices == {
        "A": "Planetary density will decrease.",
        "B": "Planetary years will become longer.",
        "C": "Planetary days will become shorter.",
        "D": "Planetary gravity will become stronger.",
    }
    assert example.answer_key == "C"
    assert example.answers == ("Planetary days will become shorter.", "C")


def test_arc_answer_key_must_be_a_label(tmp_path: Path) -> None:
    record = {"question": "q?", "choices": {"text": ["x", "y"], "label": ["A", "B"]}}
    path = write_lines(tmp_path / "arc.jsonl", [json.dumps({**record, "answerKey": "E"})])
    with pytest.raises(DatasetError, match=r"line 1: answerKey 'E' is not one of the labels"):
        load_examples(path)


def test_limit_stops_reading_early(tmp_path: Path) -> None:
    good = (DATA / "triviaqa_sample.jsonl").read_text(encoding="utf-8").splitlines()
    path = write_lines(tmp_path / "triviaqa.jsonl", [*good, "{not json"])
    assert [e.id for e in load_examples(path, limit=2)] == ["qw_2021", "bt_1256"]
    assert load_examples(path, limit=0) == []
    with pytest.raises(DatasetError, match="line 3"):
        load_examples(path)


def test_explicit_format_overrides_the_name(tmp_path: Path) -> None:
    path = shutil.copy(DATA / "common_sample.jsonl", tmp_path / "anything.txt")
    assert [e.id for e in load_examples(path, fmt="common")] == ["common-q1", "common-3"]


# ---- detection -------------------------------------------------------------------------

# Each sample file and the format it is detected as.
SAMPLE_FORMATS = [
    ("hotpotqa_sample.jsonl", "hotpotqa"),
    ("nq_sample.jsonl", "nq"),
    ("popqa_sample.jsonl", "popqa"),
    ("triviaqa_sample.jsonl", "triviaqa"),
    ("arc_sample.jsonl", "arc"),
    ("common_sample.jsonl", "common"),
    ("squad_sample.json", "squad"),
]


@pytest.mark.parametrize(("name", "expected"), SAMPLE_FORMATS)
def test_detect_by_file_name(name: str, expected: str) -> None:
    assert detect_format(DATA / name) == expected


@pytest.mark.parametrize(("name", "expected"), SAMPLE_FORMATS)
def test_detect_by_first_record_keys(tmp_path: Path, name: str, expected: str) -> None:
    anonymous = shutil.copy(DATA / name, tmp_path / "dev.jsonl")
    assert detect_format(anonymous) == expected


def test_keys_win_over_a_name_they_contradict(tmp_path: Path) -> None:
    path = shutil.copy(DATA / "common_sample.jsonl", tmp_path / "hotpotqa_ctxs.jsonl")
    assert detect_format(path) == "common"


def test_gzip_and_zip_detected_by_name_and_content(nq_gz: Path, squad_zip: Path) -> None:
    assert detect_format(nq_gz) == "nq"
    assert detect_format(squad_zip) == "squad"
    assert detect_format(shutil.copy(nq_gz, nq_gz.with_name("x.gz"))) == "nq"
    assert detect_format(shutil.copy(squad_zip, squad_zip.with_name("x.zip"))) == "squad"


def test_undetectable_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "pages.jsonl", ['{"page_number": 1, "text": "t"}'])
    with pytest.raises(DatasetError, match=r"cannot tell the dataset format.*page_number, text"):
        load_examples(path)


def test_ambiguous_keys(tmp_path: Path) -> None:
    record = {"question": "q", "answers": ["a"], "ctxs": [], "passages": []}
    path = write_lines(tmp_path / "mixed.jsonl", [json.dumps(record)])
    with pytest.raises(DatasetError, match=r"fits several formats \(common, hotpotqa\)"):
        detect_format(path)


# ---- errors ----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(DatasetError, match=r"nowhere\.jsonl: no such dataset file"):
        load_examples(path)
    with pytest.raises(DatasetError, match="no such dataset file"):
        load_examples(path, fmt="triviaqa")


def test_directory_is_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="is not a file"):
        load_examples(tmp_path)


def test_line_that_is_not_json(tmp_path: Path) -> None:
    good = json.dumps({"question": "q?", "answers": ["a"]})
    path = write_lines(tmp_path / "triviaqa.jsonl", [good, "", '{"question": "q?", '])
    with pytest.raises(DatasetError, match=r"triviaqa\.jsonl, line 3: not valid JSON") as info:
        load_examples(path)
    assert str(tmp_path) in str(info.value)


def test_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "triviaqa.jsonl", ['["q", "a"]'])
    with pytest.raises(DatasetError, match="line 1: is an array, expected a JSON object"):
        load_examples(path)


def test_record_missing_question(tmp_path: Path) -> None:
    good = json.dumps({"question": "q?", "answers": ["a"]})
    path = write_lines(tmp_path / "triviaqa.jsonl", [good, json.dumps({"answers": ["a"]})])
    with pytest.raises(DatasetError, match="line 2: record has no 'question' field"):
        load_examples(path, fmt="triviaqa")


@pytest.mark.parametrize("answers", [[], [""], ["  ", ""]])
def test_example_with_no_answers(tmp_path: Path, answers: list[str]) -> None:
    path = write_lines(
        tmp_path / "triviaqa.jsonl", [json.dumps({"question": "q?", "answers": answers})]
    )
    with pytest.raises(DatasetError, match=r"line 1: example has no answers"):
        load_examples(path)


def test_record_without_answers_field(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "triviaqa.jsonl", [json.dumps({"question": "q?"})])
    with pytest.raises(DatasetError, match="line 1: record has no 'answers' field"):
        load_examples(path)


def test_squad_question_with_no_answers(tmp_path: Path) -> None:
    data = {"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": []}]}]}
    data["data"][0]["paragraphs"][0]["qas"] = [{"id": "q1", "question": "q?", "answers": []}]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: example has"):
        load_examples(path)


def test_squad_not_official_layout(tmp_path: Path) -> None:
    path = tmp_path / "squad.json"
    path.write_text('{"version": "1.1"}', encoding="utf-8")
    with pytest.raises(DatasetError, match="not the official SQuAD layout"):
        load_examples(path)


def test_corrupt_zip_and_gzip(tmp_path: Path) -> None:
    broken_gz = tmp_path / "nq.jsonl.gz"
    broken_gz.write_bytes(gzip.compress(b'{"question": "q", "answers": ["a"]}\n')[:-12])
    with pytest.raises(DatasetError, match="cannot be read"):
        load_examples(broken_gz)
    not_json = tmp_path / "squad.zip"
    with zipfile.ZipFile(not_json, "w") as archive:
        archive.writestr("dev.json", "{not json")
    with pytest.raises(DatasetError, match=r"squad\.zip \(dev\.json\): not valid JSON"):
        load_examples(not_json)


def test_unknown_format_lists_the_known_ones() -> None:
    with pytest.raises(DatasetError, match="unknown dataset format 'msmarco'") as info:
        load_examples(DATA / "common_sample.jsonl", fmt="msmarco")
    known = {"arc", "common", "hotpotqa", "nq", "popqa", "squad", "triviaqa",
             "hotpotqa-original", "2wikimultihopqa", "triviaqa-original", "nq-open",
             "squad-flat", "asqa"}
    for name in known:
        assert name in str(info.value)
    assert set(DATASET_FORMATS) == known


@pytest.mark.parametrize(
    ("fmt", "record", "field"),
    [
        ("hotpotqa", {"question": "q", "answers": ["a"], "passages": []}, "'passages'"),
        ("nq", {"question": "q", "answers": ["a"]}, "'ctxs'"),
        ("common", {"question": "q", "answers": ["a"], "ctxs": []}, "'ctxs'"),
        (
            "popqa",
            {"question": "q", "answers": ["a"], "crag_web_search_knowledge": " "},
            "'crag_refined_retrieved_knowledge' or 'crag_web_search_knowledge'",
        ),
    ],
)
def test_documents_required_unless_told(tmp_path: Path, fmt: str, record: dict, field: str) -> None:
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps(record)])
    with pytest.raises(DatasetError, match="line 1: record has no documents") as info:
        load_examples(path, fmt=fmt)
    assert field in str(info.value) and "require_documents=False" in str(info.value)
    (example,) = load_examples(path, fmt=fmt, require_documents=False)
    assert example.documents == () and example.answers == ("a",)


def test_negative_limit(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="limit must be 0 or more"):
        load_examples(DATA / "triviaqa_sample.jsonl", limit=-1)


def test_empty_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "triviaqa.jsonl", ["", ""])
    with pytest.raises(DatasetError, match="holds no records"):
        load_examples(path)
    with pytest.raises(DatasetError, match="holds no examples"):
        load_examples(path, fmt="triviaqa")


def test_bad_gold_flag(tmp_path: Path) -> None:
    record = {"question": "q", "answers": ["a"], "ctxs": [{"text": "t", "isgold": "yes"}]}
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps(record)])
    with pytest.raises(DatasetError, match=r"line 1: ctxs\[0\]\.isgold is 'yes'"):
        load_examples(path, fmt="common")


# ---- the real shared files ---------------------------------------------------------------

REAL_FILES = {
    "hotpotqa_distractor.jsonl": "hotpotqa",
    "nq-open-oracle.jsonl.gz": "nq",
    "popqa_longtail_with_passages.jsonl": "popqa",
    "squad_dev_v1.1.json.zip": "squad",
    "triviaqa_test_ctrla.jsonl": "triviaqa",
    "arc_challenge_test.jsonl": "arc",
}


@pytest.mark.parametrize(("name", "fmt"), sorted(REAL_FILES.items()))
def test_real_shared_files_first_rows(name: str, fmt: str) -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip("shared data folder absent")
    path = SHARED_DATA / name
    assert detect_format(path) == fmt
    examples = load_examples(path, limit=5)
    assert len(examples) == 5
    assert len({e.id for e in examples}) == 5
    for example in examples:
        assert example.question and example.answers
        assert example.metadata["dataset"] == fmt
        if fmt in ("hotpotqa", "nq", "squad"):
            assert any(d.is_gold for d in example.documents)
        if fmt == "popqa":
            assert example.documents
        if fmt == "arc":
            assert example.choices and example.answer_key in example.choices


def test_evaluation_annotations_are_kept_in_any_format(tmp_path: Path) -> None:
    """`reference`, `keywords` and `kind` (the trust metrics' reference answer, key terms and
    the report's question kinds) reach the example's metadata; a wrong type names the line."""
    path = tmp_path / "nutrition.jsonl"
    row = {"id": "n1", "question": "Which vitamin prevents scurvy?", "answers": ["vitamin C"],
           "reference": "Vitamin C prevents scurvy.", "keywords": ["vitamin c", "scurvy"],
           "kind": "factual"}
    path.write_text(json.dumps(row) + "\n")
    (example,) = load_examples(path)
    assert example.metadata["reference"] == "Vitamin C prevents scurvy."
    assert example.metadata["keywords"] == ("vitamin c", "scurvy")
    assert example.metadata["kind"] == "factual"
    path.write_text(json.dumps({**row, "keywords": "vitamin c"}) + "\n")
    with pytest.raises(DatasetError, match=r"line 1.*keywords"):
        load_examples(path)
