"""The amber loop's control flow with scripted agents: where it stops, queries never repeat,
seen chunks are not filtered again, usage by agent, the trace and what the generator reads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_backend import ScriptedBackend
from scripted_amber import EXAMPLE, POOL, Agents

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.eval.trace_rendering import render_trace
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.pipelines import PipelineContext, PipelineSettings, build_pipeline
from sieverag.inference.pipelines.amber.collector import CollectorConfig, normalise_query
from sieverag.inference.pipelines.amber.config import AmberConfig


def run_amber(agents: Agents, *, pipeline: str = "amber-mcf", search=None, **amber):
    backend = ScriptedBackend(reply=agents.reply, labels=agents.labels)
    # A fixed bar, so the scripted Yes/No verdicts alone decide what the filter keeps; both
    # MCF stages and the memory in the answer, so every agent of the loop runs; the paper's
    # loop unless a test asks for the adaptive one.
    context = PipelineContext(generator=backend, judge_backend=backend, mcf_backend=backend,
                              settings=PipelineSettings([
                                  MCFConfig(bar="fixed", sentence_stage=True),
                                  replace(AmberConfig(k=3, answer_from="memory_and_evidence",
                                                      adaptive=False), **amber)]),
                              search=search)
    return build_pipeline(pipeline, context).run(EXAMPLE), backend


def usage(backend: ScriptedBackend) -> dict[str, int]:
    return {agent: u.calls for agent, u in backend.meter.by_agent.items()}


def test_stops_when_the_memory_suffices_and_answers_from_memory_and_evidence():
    output, backend = run_amber(Agents(sufficient_when="Notes after update 1."))
    trace = output.trace
    assert trace["stop_reason"] == "sufficient" and len(trace["rounds"]) == 1
    assert trace["queries"] == [EXAMPLE.question]
    # Round 1 takes the BM25 top 3 of the given pool for the question: Fact2 first.
    (first,) = trace["rounds"]
    assert first["retrieved"][0] == "d2" and len(first["retrieved"]) == 3
    assert first["sufficiency"]["sufficient"] and first["next_query"] is None
    assert first["memory"] == "Notes after update 1."
    assert first["memory_update"]["reviewer"] == "The evidence is relevant."
    # One batch per stage; one sentence call per multi-sentence kept chunk.
    multi = sum(1 for i in first["kept"] if int(i[1:]) % 2)
    assert usage(backend) == {"filter_chunk": 3, **({"filter_sentence": multi} if multi else {}),
                              "reviewer": 1, "challenger": 1, "refiner": 1, "sufficiency": 1,
                              "generator": 1}
    # The generator reads the memory and the kept evidence (key sentences only).
    answer_prompt = backend.calls[-1][1]
    assert backend.calls[-1][0] == "generator"
    assert "Notes:\nNotes after update 1." in answer_prompt and "Evidence:\n[1]" in answer_prompt
    assert [d.id for d in output.documents_read] == first["kept"]
    assert all("second sentence" not in d.text for d in output.documents_read)
    assert [e["id"] for e in trace["evidence"]] == first["kept"]
    assert output.answer == "the river"
    assert {s.document.id for s in output.filter_result.scored} == set(first["retrieved"])


def test_stops_at_max_iterations_with_new_documents_and_new_queries_each_round():
    output, backend = run_amber(Agents(), max_iterations=3)
    trace = output.trace
    assert trace["stop_reason"] == "max_iterations" and len(trace["rounds"]) == 3
    assert trace["queries"] == [EXAMPLE.question, "search number 1", "search number 2"]
    retrieved = [set(r["retrieved"]) for r in trace["rounds"]]
    assert all(len(r) == 3 for r in retrieved) and len(set().union(*retrieved)) == 9
    # The last round neither asks for sufficiency nor writes a query.
    assert trace["rounds"][-1]["sufficiency"] is None
    counts = usage(backend)
    assert counts["filter_chunk"] == 9 and counts["sufficiency"] == 2
    assert counts["query_writer"] == 2 and counts["refiner"] == 3 and counts["generator"] == 1
    assert trace["memory"] == "Notes after update 3."
    assert [e["round"] for e in trace["evidence"]] == sorted(e["round"] for e in trace["evidence"])


def test_stops_when_a_round_adds_nothing_and_then_answers_without_documents():
    output, backend = run_amber(Agents(keep="no chunk says this"), min_evidence=0)
    trace = output.trace
    assert trace["stop_reason"] == "no_progress" and len(trace["rounds"]) == 1
    assert trace["rounds"][0]["kept"] == [] and trace["rounds"][0]["memory_update"] is None
    assert set(usage(backend)) == {"filter_chunk", "generator"}
    assert output.documents_read == () and "Notes:" not in backend.calls[-1][1]
    assert trace["fallback_evidence"] == []


def test_with_nothing_kept_the_answer_reads_the_best_dropped_chunks():
    output, backend = run_amber(Agents(keep="no chunk says this"), min_evidence=2)
    trace = output.trace
    assert trace["stop_reason"] == "no_progress" and trace["rounds"][0]["kept"] == []
    scored = sorted(trace["rounds"][0]["scored"], key=lambda s: -s["score"])
    assert trace["fallback_evidence"] == [s["id"] for s in scored[:2]]
    assert [d.id for d in output.documents_read] == trace["fallback_evidence"]
    assert [e["id"] for e in trace["evidence"]] == trace["fallback_evidence"]
    # The answer reads them; no memory agent ran, since no round kept anything.
    assert set(usage(backend)) == {"filter_chunk", "generator"}
    texts = {d.id: d.text for d in EXAMPLE.documents}
    assert backend.calls[-1][0] == "generator"
    assert all(texts[i] in backend.calls[-1][1] for i in trace["fallback_evidence"])
    with pytest.raises(ConfigError, match="min_evidence"):
        AmberConfig(min_evidence=-1)


def test_an_exhausted_given_pool_stops_the_loop_without_asking_further():
    output, backend = run_amber(Agents(), k=5, max_iterations=4)
    rounds = output.trace["rounds"]
    assert [len(r["retrieved"]) for r in rounds] == [5, 5]
    assert output.trace["stop_reason"] == "pool_exhausted"
    # Round 1 asked for sufficiency and a query; round 2 saw the last documents, so it did not.
    assert rounds[1]["sufficiency"] is None and rounds[1]["next_query"] is None
    assert usage(backend)["sufficiency"] == 1 and usage(backend)["query_writer"] == 1
    whole, _ = run_amber(Agents(), k=10, max_iterations=3)
    assert whole.trace["stop_reason"] == "pool_exhausted" and len(whole.trace["rounds"]) == 1
    # An answer from the evidence alone after the last round: no memory agent runs at all.
    evidence_only, backend = run_amber(Agents(), k=10, max_iterations=3, answer_from="evidence")
    assert evidence_only.trace["stop_reason"] == "pool_exhausted"
    assert evidence_only.trace["rounds"][0]["memory_update"] is None
    assert set(usage(backend)) <= {"filter_chunk", "filter_sentence", "generator"}
    assert evidence_only.documents_read


def test_queries_never_repeat_and_the_loop_stops_without_a_new_one():
    output, backend = run_amber(Agents(query=EXAMPLE.question.upper()), max_iterations=5)
    trace = output.trace
    assert trace["stop_reason"] == "no_new_query"
    normalised = [normalise_query(q) for q in trace["queries"]]
    assert len(normalised) == len(set(normalised))
    sources = [r["next_query"]["source"] for r in trace["rounds"] if r["next_query"]]
    assert sources[0] == "variation" and sources[-1] == "none"
    assert trace["queries"][1].startswith(EXAMPLE.question) and "Notes" in trace["queries"][1]


def test_seen_chunks_from_a_search_are_skipped_and_never_filtered_again():
    calls = []

    def search(query: str, k: int):
        calls.append((query, k))
        return POOL[:k]  # the same ranking whatever the query

    output, backend = run_amber(Agents(), search=search, max_iterations=2)
    rounds = output.trace["rounds"]
    assert rounds[0]["retrieved"] == ["d0", "d1", "d2"]
    assert rounds[1]["retrieved"] == ["d3", "d4", "d5"] and rounds[1]["skipped_seen"] == 3
    assert calls == [(EXAMPLE.question, 3), ("search number 1", 6)]
    assert usage(backend)["filter_chunk"] == 6
    filtered = [text for agent, text in backend.calls if agent == "filter_chunk"]
    assert len(filtered) == len(set(filtered))


@pytest.mark.parametrize(("pipeline", "agents"), [
    ("amber-judge", {"predictor", "judge"}),
    ("amber-stack", {"filter_chunk", "predictor", "judge"}),
    ("amber-none", set()),
])
def test_each_filter_stage_counts_its_own_agents(pipeline, agents):
    output, backend = run_amber(Agents(sufficient_when="Notes after update 1."),
                                pipeline=pipeline)
    assert output.trace["filter"] == pipeline.removeprefix("amber-")
    assert agents <= set(usage(backend))
    assert {"reviewer", "challenger", "refiner", "sufficiency", "generator"} <= set(usage(backend))
    assert usage(backend)["generator"] == 1


def test_memory_only_answers_do_not_show_evidence_and_the_config_is_validated():
    output, backend = run_amber(Agents(sufficient_when="update 1"), answer_from="memory")
    prompt = backend.calls[-1][1]
    assert "Notes:\nNotes after update 1." in prompt and "Evidence:" not in prompt
    assert output.documents_read  # what the memory was built from
    with pytest.raises(ConfigError, match="AmberConfig: filter: Input should be"):
        AmberConfig(filter="magic")
    with pytest.raises(ConfigError, match="max_iterations"):
        AmberConfig(max_iterations=0)
    assert CollectorConfig().sufficiency_threshold == 0.5


def test_evidence_only_answers_read_like_vanilla():
    output, backend = run_amber(Agents(sufficient_when="update 1"), answer_from="evidence")
    prompt = backend.calls[-1][1]
    assert "Documents:\n[1]" in prompt and "Notes" not in prompt
    assert output.trace["answer_from"] == "evidence"


def test_ablations_switch_off_the_memory_agents_or_the_collector():
    # -AMU: no memory agent runs; the memory is the kept evidence, which the collector reads.
    output, backend = run_amber(Agents(sufficient_when="Fact2"), pipeline="amber-no-amu")
    trace = output.trace
    assert trace["pipeline"] == "amber-no-amu" and trace["filter"] == "mcf"
    assert not {"reviewer", "challenger", "refiner"} & set(usage(backend))
    (first,) = trace["rounds"]
    assert first["memory_update"] is None and "Topic 2\nFact2" in first["memory"]
    assert trace["stop_reason"] == "sufficient"
    # -AIC: no sufficiency check and no written query; each round pages deeper for the question.
    output, backend = run_amber(Agents(sufficient_when="Notes after update 1."),
                                pipeline="amber-no-aic", max_iterations=3)
    trace = output.trace
    assert not {"sufficiency", "query_writer"} & set(usage(backend))
    assert trace["queries"] == [EXAMPLE.question] * 3
    assert [r["sufficiency"] for r in trace["rounds"]] == [None] * 3
    assert len({d for r in trace["rounds"] for d in r["retrieved"]}) == 9  # never re-fetched
    assert trace["stop_reason"] == "max_iterations"
    # The switches are plain settings too: `amber` with amu off is the -AMU row.
    output, backend = run_amber(Agents(sufficient_when="Fact2"), pipeline="amber", amu=False)
    assert output.trace["pipeline"] == "amber" and "refiner" not in usage(backend)


def test_bridge_queries_lead_with_a_name_from_the_kept_evidence_and_are_traced():
    output, backend = run_amber(Agents(), max_iterations=2,
                                collector=CollectorConfig(query_source="bridge"))
    first = output.trace["rounds"][0]
    following = first["next_query"]
    assert following["source"] == "bridge" and following["written"] == ""
    kept_titles = [f"Topic {i[1:]}" for i in first["kept"]]
    assert [c["name"] for c in following["candidates"]][:len(kept_titles)] == kept_titles
    assert following["query"] == f"{kept_titles[0]} {EXAMPLE.question}"  # a tie: the first
    assert output.trace["queries"][1] == following["query"]
    assert "bridge_scorer" in usage(backend) and "query_writer" not in usage(backend)


def kept_p(round_: dict) -> list[float]:
    return [s["p_relevant"] for s in round_["scored"] if s["id"] in round_["kept"]]


def test_the_adaptive_loop_answers_at_once_from_strong_evidence():
    output, backend = run_amber(Agents(), adaptive=True, answer_at=0.0, answer_from="evidence",
                                evidence_signal="sum_p")
    trace = output.trace
    (first,) = trace["rounds"]
    assert trace["stop_reason"] == "strong_evidence"
    branch = first["branch"]
    assert branch["branch"] == "answer" and branch["bar"] == 0.0
    assert branch["strength"] == pytest.approx(sum(kept_p(first)), abs=1e-5)
    assert "sum_p of the kept evidence" in branch["reason"] and "reaches" in branch["reason"]
    # No memory agent, no sufficiency check, no query: the filter, then the answer.
    assert first["memory_update"] is None and first["sufficiency"] is None
    assert set(usage(backend)) <= {"filter_chunk", "filter_sentence", "generator"}
    assert [d.id for d in output.documents_read] == first["kept"]
    shown = render_trace(trace)
    assert "stopped (strong_evidence) after 1 round(s)" in shown
    assert "Branch:     answer — sum_p of the kept evidence" in shown
    assert "memory agents: not run (the kept evidence is strong enough to answer)" in shown


def test_the_adaptive_loop_runs_the_memory_agents_and_a_new_query_when_evidence_is_weak():
    output, backend = run_amber(Agents(), adaptive=True, answer_at=100.0, max_iterations=2,
                                evidence_signal="max_p")
    first, second = output.trace["rounds"]
    assert first["branch"]["branch"] == "loop" and "is below" in first["branch"]["reason"]
    assert first["branch"]["strength"] == pytest.approx(max(kept_p(first)), abs=1e-5)
    # The evidence signal replaces the sufficiency prompt; the memory agents and the query
    # writer still run, and round 2 searches the new query.
    assert first["sufficiency"] is None and first["memory_update"] is not None
    assert first["next_query"]["query"] == second["query"] == "search number 1"
    assert "sufficiency" not in usage(backend) and usage(backend)["query_writer"] == 1
    assert output.trace["stop_reason"] == "max_iterations"


def test_a_filter_without_calibrated_probabilities_runs_the_papers_loop_and_says_so():
    with pytest.warns(UserWarning, match="amber-none: amber.adaptive reads MCF's calibrated"):
        output, backend = run_amber(Agents(sufficient_when="Notes after update 1."),
                                    pipeline="amber-none", adaptive=True, answer_at=0.0)
    (first,) = output.trace["rounds"]
    assert first["branch"] == {"branch": "loop", "strength": None, "bar": 0.0,
                               "reason": "the none filter gives no calibrated P(relevant)"}
    assert output.trace["stop_reason"] == "sufficient" and usage(backend)["sufficiency"] == 1
    with pytest.raises(ConfigError, match="answer_at"):
        AmberConfig(answer_at=-0.5)
