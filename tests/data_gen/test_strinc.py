"""STRINC on hand-checked cases: aliases, Unicode, articles, punctuation, whole words."""

from __future__ import annotations

import pytest

from sieverag.data_gen.strinc import matching_alias, strinc


@pytest.mark.parametrize(("text", "answers", "expected"), [
    ("The capital of France is Paris.", ["Paris"], True),
    ("The capital of France is PARIS!", ["paris"], True),
    # every alias is tried, not only the first
    ("He was born in the USA in 1950.", ["United States", "USA"], True),
    # articles and punctuation are ignored on both sides
    ("Directed by the Coen brothers.", ["The Coen Brothers"], True),
    ("It was built by a company called Acme, Inc. in Ohio", ["Acme Inc"], True),
    # Unicode: composed vs decomposed accents, full-width digits, curly apostrophes
    ("GmbH: Gesellschaft mit beschra\u0308nkter Haftung", ["Gesellschaft mit beschränkter Haftung"],
     True),
    ("It opened in \uff11\uff19\uff19\uff10.", ["1990"], True),
    ("Fat Larry\u2019s Band played.", ["Fat Larry's Band"], True),
    # accents are not folded: a different letter is a different answer
    ("Rontgen discovered it.", ["Röntgen"], False),
    # whole words only
    ("It opened in 1990.", ["199"], False),
    ("Parisian cafes", ["Paris"], False),
    ("no answer here", ["Paris", "London"], False),
    # an alias that normalises to nothing never matches
    ("The end.", ["the", "..."], False),
])
def test_strinc(text: str, answers: list[str], expected: bool) -> None:
    assert strinc(text, answers) is expected


def test_matching_alias_names_the_alias_found() -> None:
    assert matching_alias("Born in the USA.", ["United States", "USA"]) == "USA"
    assert matching_alias("Nothing.", ["USA"]) is None
