"""The run's report.html in a real browser: headless Chromium (Debian's chromium and
chromium-driver, tests/headless_chromium.py) opens a demo-sized report (the demo's 12
questions, five pipelines; a synthetic run, tests/synthetic_runs.py) from disk and checks that
the console shows no error, the page requests nothing but itself, every question is shown,
the filters and the search change what is shown, and a kept sentence is highlighted at the
offsets its spans name.

The same test takes the screenshot docs/pipelines/evaluating.md shows
(docs/assets/report.png), written only with SIEVERAG_WRITE_SCREENSHOT=1 so a test run leaves
the tree as it was.
"""

from __future__ import annotations

import os

import pytest
from headless_chromium import chromium, console_errors, requested_urls
from repo_paths import REPO
from synthetic_runs import PIPELINES, drops_gold, write_synthetic_run, wrong

from sieverag.inference.eval.html_report import write_html_report
from sieverag.inference.retrieval.sentences import sentence_spans

QUESTIONS = 12
SCREENSHOT = REPO / "docs" / "assets" / "report.png"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("browser"), questions=QUESTIONS)
    return write_html_report(run)


@pytest.fixture(scope="module")
def browser(report):
    with chromium(width=1200, height=860) as driver:
        driver.get(report.as_uri())
        yield driver


def shown_ids(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('section.question'), s => s.dataset.id)")


def choose(driver, show: str, by: str = "", search: str = "") -> list[str]:
    """Set the filters and the search box as a user would, and return the ids shown."""
    driver.execute_script(
        "const [show, by, search] = arguments;"
        "document.getElementById('show').value = show;"
        "document.getElementById('by').value = by;"
        "const box = document.getElementById('search'); box.value = search;"
        "document.getElementById('show').dispatchEvent(new Event('change'));"
        "box.dispatchEvent(new Event('input'));", show, by, search)
    return shown_ids(driver)


def test_no_console_error_and_no_request_but_the_file(browser, report):
    assert console_errors(browser) == []
    assert set(requested_urls(browser)) <= {report.as_uri()}


def test_every_question_is_shown(browser):
    assert choose(browser, "all") == [f"q{n}" for n in range(1, QUESTIONS + 1)]
    answers = browser.find_elements("css selector", "section.question .answer")
    assert len(answers) == QUESTIONS * len(PIPELINES)


def test_filters_and_search_change_what_is_shown(browser):
    numbers = range(1, QUESTIONS + 1)
    assert choose(browser, "wrong", "vanilla") == [f"q{n}" for n in numbers
                                                   if wrong("vanilla", n)]
    assert choose(browser, "gold_dropped") == [f"q{n}" for n in numbers if drops_gold(n)]
    assert choose(browser, "differ") == [
        f"q{n}" for n in numbers if len({wrong(p, n) for p in PIPELINES}) > 1]
    assert choose(browser, "all", search="Q7") == ["q7"]
    assert choose(browser, "all") == [f"q{n}" for n in numbers]
    assert console_errors(browser) == []


def test_a_kept_sentence_is_highlighted_at_its_spans(browser):
    choose(browser, "all", search="q2")
    card = browser.find_element("css selector", '.answer[data-pipeline="amber-mcf"]')
    browser.execute_script("arguments[0].querySelector('details.read').open = true", card)
    passages = card.find_elements("css selector", ".passage.kept .ptext")
    assert passages
    for passage in passages:
        text = browser.execute_script(
            "return Array.from(arguments[0].childNodes, n => n.textContent).join('')", passage)
        spans = sentence_spans(text)
        marks = passage.find_elements("css selector", "mark.kept-sentence")
        # Each kept passage names its first and last sentences as key (synthetic_runs).
        expected = sorted({spans[0], spans[-1]})
        assert [(int(m.get_attribute("data-start")), int(m.get_attribute("data-end")))
                for m in marks] == expected
        assert [m.text for m in marks] == [text[s:e] for s, e in expected]
    dropped = card.find_elements("css selector", ".passage.dropped mark")
    assert dropped == []
    assert console_errors(browser) == []
    if os.environ.get("SIEVERAG_WRITE_SCREENSHOT") == "1":
        # The view the docs show: amber's first round, its kept sentences highlighted.
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                               card.find_element("css selector", "div.round"))
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT))
