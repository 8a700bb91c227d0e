"""eval-filter's report.html (training/evaluation/filter_eval_html.py): the per-source and chunk
tables, the calibration plot, each question's passages ranked by every row with gold marked, and in
headless Chromium the one click that shows where the default lost to dense top-2."""

from __future__ import annotations

import json
import re

import pytest
from headless_chromium import chromium, console_errors

from sieverag.inference.core.html.page import DATA_ELEMENT
from sieverag.inference.core.types import Document, Example
from sieverag.training.evaluation.filter_eval_html import question_f1, write_filter_eval_html
from sieverag.training.evaluation.filter_methods import ChunkDecisions
from sieverag.training.evaluation.filter_report import DatasetDecisions

DEFAULT, DENSE, BM25 = "MCF default", "dense top-2", "BM25 top-2"


def examples() -> list[Example]:
    return [Example(id=f"q{n}", question=f"Question {n} <b>?</b>", answers=(f"a{n}",),
                    documents=tuple(Document(id=f"q{n}/{i}", text=f"Passage {i} of {n}.",
                                             is_gold=i == 0) for i in range(4)))
            for n in range(1, 7)]


def decisions(items: list[Example]) -> list[ChunkDecisions]:
    """The default keeps the gold passage on odd questions only; dense top-2 always keeps it
    (with one other): the default loses on the even ones."""
    default = {e.id: (f"{e.id}/0",) if int(e.id[1:]) % 2 else (f"{e.id}/3",) for e in items}
    probabilities = {d.id: (0.9 if d.is_gold else 0.2) for e in items for d in e.documents}
    dense = {e.id: (f"{e.id}/0", f"{e.id}/1") for e in items}
    scores = {d.id: 1.0 - int(d.id[-1]) / 4 for e in items for d in e.documents}
    return [ChunkDecisions(DEFAULT, default, probabilities, probabilities),
            ChunkDecisions(DENSE, dense, scores), ChunkDecisions(BM25, dense, scores)]


@pytest.fixture(scope="module")
def page_path(tmp_path_factory):
    items = examples()
    report = {"config": {"top_k": 2},
              "filter": {"name": "tiny-filter", "amber_default_row": DEFAULT,
                         "ranking": "MCF ranks by z(BM25) + z(dense)"},
              "by_dataset": {"tiny.jsonl": {"questions": 6, "default_top_k_f1": 0.5,
                                            "default_minus_retrieval_interval": [-0.2, 0.1]}},
              "datasets": {"tiny.jsonl": {"chunk": {DEFAULT: {"f1": 0.5}, DENSE: {"f1": 0.67}}}}}
    return write_filter_eval_html(report, [DatasetDecisions("tiny.jsonl", decisions(items),
                                                            items)], tmp_path_factory.mktemp("fe"))


def test_the_page_holds_the_tables_the_plot_and_every_question(page_path):
    page = page_path.read_text(encoding="utf-8")
    assert "tiny.jsonl" in page and "[-0.200, +0.100]" in page  # the per-source table
    assert "<svg" in page and "P(relevant) against the share of gold" in page
    assert "<b>?</b>" not in page  # a question's text stays text
    data = json.loads(re.search(rf'id="{DATA_ELEMENT}">(.*?)</script>', page, re.S).group(1))
    assert [q["id"] for q in data["questions"]] == [f"q{n}" for n in range(1, 7)]
    assert data["default"] == DEFAULT and data["dense"] == DENSE
    assert data["questions"][1]["rows"][DEFAULT]["f1"] == 0.0
    assert data["questions"][1]["rows"][DENSE]["f1"] == pytest.approx(2 / 3, abs=1e-4)


def test_question_f1():
    assert question_f1(["a", "b"], {"a"}) == pytest.approx(2 / 3, abs=1e-4)
    assert question_f1([], {"a"}) == 0.0 and question_f1(["a"], set()) is None


def test_one_click_shows_where_the_default_lost_to_dense(page_path):
    with chromium() as driver:
        driver.get(page_path.as_uri())
        ids = "return Array.from(document.querySelectorAll('section.question'), s => s.dataset.id)"
        assert driver.execute_script(ids) == [f"q{n}" for n in range(1, 7)]
        driver.find_element("id", "default-lost-to-dense").click()
        assert driver.execute_script(ids) == ["q2", "q4", "q6"]
        # Each row ranks the passages, gold marked.
        row = driver.find_element("css selector", f'section.question tr[data-method="{DENSE}"]')
        assert "#1 ✓ ★ q2/0" in row.text
        assert console_errors(driver) == []
