"""Answer extraction before scoring."""

import pytest

from sieverag.inference.agents.answer_extraction import extract_answer


@pytest.mark.parametrize(("reply", "expected"), [
    ("Paris", "Paris"),
    ("Answer: Paris\nBecause it is the capital.", "Paris"),
    ("Paris. It is the capital of France.", "Paris"),
    ('"Gesellschaft mit beschränkter Haftung".', "Gesellschaft mit beschränkter Haftung"),
    ("He was born in the U.S. in 1990.", "He was born in the U.S. in 1990"),
    ("Who wrote Hamlet? William Shakespeare", "William Shakespeare"),
    ("\n\n  Final answer: 1926  ", "1926"),
])
def test_first_sentence(reply, expected):
    assert extract_answer(reply, "Who wrote Hamlet?") == expected


def test_modes_differ_as_documented():
    reply = "Paris. It is big.\nSecond line"
    assert extract_answer(reply, mode="none") == reply
    assert extract_answer(reply, mode="first_line") == "Paris. It is big"
    assert extract_answer(reply, mode="first_sentence") == "Paris"


def test_empty_reply_gives_empty_answer():
    assert extract_answer("   ") == ""
