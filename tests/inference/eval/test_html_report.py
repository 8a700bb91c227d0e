"""The run's HTML report without a browser (inference/eval/html_report.py): one self-contained
file, every question in its data, hostile text kept as text, key sentences at the offsets
`sentence_spans` gives, the flags the page filters by, and the notes when texts are missing."""

from __future__ import annotations

import json
import re

import pytest
from synthetic_runs import HOSTILE, PIPELINES, drops_gold, write_synthetic_run, wrong

from sieverag.cli import main
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.html.page import DATA_ELEMENT
from sieverag.inference.eval.html_report import REPORT_FILE, write_html_report
from sieverag.inference.retrieval.sentences import sentence_spans

QUESTIONS = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("html"), questions=QUESTIONS)


@pytest.fixture(scope="module")
def page(run) -> str:
    return write_html_report(run).read_text(encoding="utf-8")


def embedded(page: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{DATA_ELEMENT}">(.*?)</script>',
                      page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_the_page_is_one_file_that_requests_nothing(page):
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<(link|iframe|object|embed)\b", page, re.I)
    assert "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page  # the page's policy refuses any fetch
    # Styles and scripts are inline: nothing names a file to load.
    assert not re.search(r"<script[^>]*\bsrc=", page, re.I)


def test_every_question_and_pipeline_is_in_the_page(run, page):
    data = embedded(page)
    assert [q["id"] for q in data["questions"]] == [f"q{n}" for n in range(1, QUESTIONS + 1)]
    assert data["pipelines"] == list(PIPELINES)
    assert all(len(data["answers"][name]) == QUESTIONS for name in PIPELINES)
    assert data["run_dir"] == str(run)
    for name in PIPELINES:  # the comparison table has a row per pipeline
        assert f"<td>{name}</td>" in page


def test_hostile_text_stays_text(page):
    # Only the page's own three script elements end; the data's `<` are escaped.
    assert page.count("</script>") == 3
    assert "<b>bold</b>" not in page and "alert(1)</script>" not in page
    data = embedded(page)
    question = data["questions"][0]
    assert HOSTILE in question["question"]
    assert any(HOSTILE in text for _, text in question["docs"].values())


def test_kept_sentences_are_located_by_sentence_spans(run, page):
    data = embedded(page)
    checked = 0
    for index, question in enumerate(data["questions"]):
        trace = data["answers"]["amber-mcf"][index]["trace"]
        for entry in (s for r in trace["rounds"] for s in r["scored"]):
            text = question["docs"][entry["id"]][1]
            spans = sentence_spans(text)
            if entry["kept"]:
                assert entry["hl"] == [list(spans[k]) for k in entry["key_sentences"]]
                checked += 1
            else:
                assert "hl" not in entry
    assert checked >= QUESTIONS


def test_flags_say_who_was_wrong_and_where_gold_was_dropped(page):
    data = embedded(page)
    for index, question in enumerate(data["questions"]):
        number = index + 1
        for name in PIPELINES:
            assert data["answers"][name][index]["flags"]["wrong"] == wrong(name, number)
        assert data["answers"]["main-rag"][index]["flags"]["gold_dropped"] == drops_gold(number)
        assert not data["answers"]["vanilla"][index]["flags"]["gold_dropped"]
        assert question["differ"] == (len({wrong(name, number) for name in PIPELINES}) > 1)


def test_a_trace_listing_the_passages_sends_them_once(page):
    data = embedded(page)
    amber = data["answers"]["amber-mcf"][0]
    assert "scores" not in amber["filter"] and amber["filter"]["rule"] == "calibrated"
    assert "scores" in data["answers"]["main-rag"][0]["filter"]
    assert "contexts" not in amber  # the texts are the question's, once


def test_the_top_shows_configuration_ranking_and_plots(page):
    assert "MCF ranks by the filter&#x27;s card" in page
    assert "synthetic-filter" in page and "synthetic-generator" in page
    assert page.count("<svg") >= 3
    assert 'class="sortable"' in page


def test_missing_dataset_and_unfinished_run_are_said(tmp_path, capsys):
    run = write_synthetic_run(tmp_path, questions=3, pipelines=("vanilla", "main-rag"))
    (tmp_path / "data.jsonl").unlink()
    (run / "summary.json").unlink()
    page = write_html_report(run).read_text(encoding="utf-8")
    err = capsys.readouterr().err
    assert "could not be read here" in err and "has not finished" in err
    assert "could not be read here" in page and "has not finished" in page
    data = embedded(page)
    # main-rag's read passages still have their text: the record's contexts.
    docs = data["questions"][0]["docs"]
    assert docs and all(text for _, text in docs.values())


def test_not_a_run_folder_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config.yaml not found"):
        write_html_report(tmp_path)


def test_report_html_command_writes_and_names_the_page(run, capsys):
    (run / REPORT_FILE).unlink(missing_ok=True)
    assert main(["report", "--runs", str(run), "--html"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"report: {run / REPORT_FILE}"
    assert (run / REPORT_FILE).stat().st_size > 0
