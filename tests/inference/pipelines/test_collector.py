"""AIC: sufficiency from Yes/No log-probs with a threshold; new queries never repeat; bridge
candidates read off the kept evidence and scored by the model."""

from __future__ import annotations

import math

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.pipelines.amber.collector import (
    CollectorConfig,
    InformationCollector,
    bridge_candidates,
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


KEPT = (Document(id="a", title="Liora Tamsin", text="Liora Tamsin was born in Quorrin. She "
                 "studied at the University of Vell. The town is old."),
        Document(id="b", title="Calder Bridge", text="It crosses the Calder near Quorrin."))
QUESTION = "Which river flows through the birthplace of Liora Tamsin?"


def test_bridge_candidates_are_names_the_question_does_not_name():
    # Titles first, then name spans; "Liora Tamsin" is asked, "She", "The", "It" are stop
    # words, and a name is listed once.
    assert bridge_candidates(QUESTION, KEPT, 8) == [
        "Calder Bridge", "Quorrin", "University of Vell", "Calder"]
    assert bridge_candidates(QUESTION, KEPT, 2) == ["Calder Bridge", "Quorrin"]


def test_bridge_queries_lead_with_the_best_scored_candidate_and_fall_back_to_the_writer():
    def labels(text: str) -> dict[str, float]:
        return {"Yes": 0.0 if '"Quorrin"' in text else -3.0, "No": -1.0}

    backend = ScriptedBackend(reply=lambda text: "Query: Tamsin river", labels=labels)
    collector = InformationCollector(backend, CollectorConfig(query_source="bridge",
                                                              max_candidates=3))
    following = collector.next_query(QUESTION, "Liora was born in Quorrin.", [QUESTION], KEPT)
    assert (following.query, following.source) == (f"Quorrin {QUESTION}", "bridge")
    assert [name for name, _ in following.candidates] == [
        "Calder Bridge", "Quorrin", "University of Vell"]
    assert following.to_dict()["candidates"][1] == {"name": "Quorrin", "p_yes": 0.7311}
    assert [agent for agent, _ in backend.calls] == ["bridge_scorer"] * 3
    # The winner searched already: the next best; no candidate at all: the model writes.
    again = collector.next_query(QUESTION, "m", [QUESTION, following.query], KEPT)
    assert again.query == f"Calder Bridge {QUESTION}"
    written = collector.next_query(QUESTION, "m", [QUESTION], ())
    assert (written.query, written.source, written.candidates) == ("Tamsin river", "writer", ())
    with pytest.raises(ConfigError, match="max_candidates"):
        CollectorConfig(max_candidates=0)
