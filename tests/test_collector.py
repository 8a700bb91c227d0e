"""AIC: sufficiency from Yes/No log-probs with a threshold; new queries never repeat."""

from __future__ import annotations

import math

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.errors import ConfigError
from sieverag.inference.pipelines.collector import (
    CollectorConfig,
    InformationCollector,
    clean_query,
    expanded_query,
    normalise_query,
)


def test_sufficiency_is_p_yes_normalised_over_yes_and_no_against_the_threshold():
    backend = ScriptedBackend(labels=lambda text: {"Yes": math.log(0.3), "No": math.log(0.1)})
    verdict = InformationCollector(backend).sufficiency("q?", "notes")
    assert verdict.p_yes == pytest.approx(0.75) and verdict.sufficient
    strict = InformationCollector(backend, CollectorConfig(sufficiency_threshold=0.8))
    assert not strict.sufficiency("q?", "notes").sufficient
    assert backend.meter.by_agent["sufficiency"].calls == 2
    assert "Memory:\n(empty)" in InformationCollector(backend).sufficiency_prompt.messages(
        question="q?", memory="(empty)")[1]["content"]
    with pytest.raises(ConfigError, match="sufficiency_threshold"):
        CollectorConfig(sufficiency_threshold=1.5)


def test_query_cleaning_and_normalisation():
    assert clean_query('\n  Query: "Calder Bridge engineer"\nmore') == "Calder Bridge engineer"
    assert clean_query("Search query - who built it") == "who built it"
    assert normalise_query("Who BUILT  the bridge?") == "who built the bridge"
    assert expanded_query("Who built it?", "Wren Ivers built the Calder bridge in 1901.", 3) \
        == "Who built it? Wren Ivers Calder"


def test_a_new_query_is_the_writers_when_it_is_new():
    backend = ScriptedBackend(reply=lambda text: "Query: Wren Ivers birthplace")
    following = InformationCollector(backend).next_query("q?", "m", ["q?"])
    assert (following.query, following.source) == ("Wren Ivers birthplace", "writer")
    assert backend.calls[0][0] == "query_writer" and "Searches already made:\n- q?" in \
        backend.calls[0][1]


def test_a_repeated_query_falls_back_to_a_variation_then_to_none():
    repeats = ScriptedBackend(reply=lambda text: "where was  WREN born")
    collector = InformationCollector(repeats, CollectorConfig(expansion_terms=2))
    memory = "Wren Ivers built the Calder Bridge."
    first = collector.next_query("Where was Wren born?", memory, ["Where was Wren born?"])
    assert (first.query, first.source) == ("Where was Wren born? Ivers built", "variation")
    assert first.written == "where was  WREN born"
    second = collector.next_query("Where was Wren born?", memory,
                                  ["Where was Wren born?", first.query])
    assert (second.query, second.source) == (None, "none")
    empty = InformationCollector(ScriptedBackend(reply=lambda text: '""'))
    assert empty.next_query("q?", "", ["q?"]).query is None
