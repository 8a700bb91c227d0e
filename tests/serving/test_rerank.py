"""POST /v1/rerank on the embedded server (tiny random model and a random LoRA adapter), over
plain HTTP: MCF's scores and verdicts, the response schema, the sentence stage, errors, auth."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path

import httpx
import pytest
from fake_backend import ScriptedBackend
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)
from tiny_server import keyed_filter_server, keyed_http

from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.filter_format import chunk_prompt
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter, document_sentences
from sieverag.inference.filters.ranking import as_documents, rank_by_filter
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.serving.engine.engine_backend import EngineBackend
from sieverag.serving.engine.tokens import max_token_chars
from sieverag.serving.local_server import LocalServer

KEY_ENV = "SIEVERAG_RERANK_TEST_KEY"
KEY = "sk-rerank-test"
QUERY = "Where was Liora Tamsin born?"
DOCUMENTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
    "Her maps are kept in Ostmere.",
    {"text": "Penguins huddle together in winter."},
    "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    {"text": "Quorrin is a port town. Liora Tamsin grew up there."},
    "Tea is grown on terraced hills.",
]
TEXTS = [d if isinstance(d, str) else d["text"] for d in DOCUMENTS]
MAX_DOCUMENTS = 6


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path) -> Iterator[LocalServer]:
    with keyed_filter_server(tiny_model_dir, adapter_dir, KEY_ENV, KEY,
                             max_rerank_documents=MAX_DOCUMENTS) as running:
        yield running


@pytest.fixture()
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with keyed_http(server, KEY) as client:
        yield client


@pytest.fixture(scope="module")
def in_process(tiny_model_dir: Path, adapter_dir: Path) -> dict[str, HFBackend]:
    """The same models run in-process, by the name the server serves them under."""
    return {"filter": HFBackend(HFBackendConfig(model=str(tiny_model_dir),
                                                adapter=str(adapter_dir))),
            "base": HFBackend(HFBackendConfig(model=str(tiny_model_dir)))}


def served_name(server: LocalServer, name: str) -> str:
    return server.engine.served.name if name == "base" else name


def rerank(http: httpx.Client, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    return http.post(path, json=body)


@pytest.mark.parametrize("name", ["filter", "base"])
def test_scores_and_verdicts_are_in_process_mcf(server: LocalServer, http: httpx.Client,
                                                in_process: dict[str, HFBackend],
                                                name: str) -> None:
    model = served_name(server, name)
    reply = rerank(http, {"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == model and body["id"].startswith("rerank-")
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    # Every document's score is MCF's P(relevant) on the same model (neither tiny model has
    # a card: BM25 + dense), its verdict MCF's default bar's.
    backend = in_process[name]
    mcf = MultiGranularFilter(backend, MCFConfig())
    before = backend.meter.snapshot()
    expected = mcf.chunk_scores(QUERY, as_documents(TEXTS))
    prompt_tokens = backend.meter.since(before)["filter_chunk"].prompt_tokens
    verdicts = mcf.chunk_stage(QUERY, as_documents(TEXTS)).scored
    by_index = {r["index"]: r for r in results}
    assert [by_index[i]["relevance_score"] for i in range(len(TEXTS))] == pytest.approx(
        [v.details["p_relevant"] for v in verdicts], abs=1e-4)
    assert len(expected) == len(TEXTS)
    assert [by_index[i]["kept"] for i in range(len(TEXTS))] == [v.kept for v in verdicts]
    assert sum(r["kept"] for r in results) == 2  # without a fitted combination: top_k = 2
    # Each result says which rule set the round's bar, and why.
    assert {r["bar_rule"] for r in results} == {
        "top_k: the 2 best kept: the card holds no fitted combination, so no calibrated bar"}
    # An unfitted combination's score is not called a calibrated probability.
    assert {r["calibrated"] for r in results} == {False}
    # Not asked for, the documents are left out (not sent as null: LiteLLM refuses a null).
    assert all("document" not in r and "key_sentences" not in r for r in results)
    assert body["usage"] == {"total_tokens": prompt_tokens}


def test_a_model_without_a_card_ranks_as_retrieval(server: LocalServer,
                                                    http: httpx.Client) -> None:
    """Neither tiny model has a filter card: both rank by BM25 + dense alone
    (`PRIORS_ONLY`, which the server warns of when it starts), never by a filter whose
    scores no card says how to read."""
    scores = {}
    for name in ("filter", "base"):
        body = rerank(http, {"model": served_name(server, name), "query": QUERY,
                             "documents": TEXTS}).json()
        scores[name] = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert scores["filter"] == pytest.approx(scores["base"], abs=1e-6)


def test_top_n_return_documents_and_the_rerank_alias(http: httpx.Client) -> None:
    body = {"model": "filter", "query": QUERY, "documents": DOCUMENTS}
    full = rerank(http, {**body, "return_documents": True}).json()["results"]
    assert [r["document"] for r in full] == [{"text": TEXTS[r["index"]]} for r in full]
    top = rerank(http, {**body, "top_n": 2, "return_documents": False}).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in full[:2]]
    assert all(set(r) == {"index", "relevance_score", "kept", "bar_rule", "calibrated"}
               for r in top)
    assert len(rerank(http, {**body, "top_n": 0}).json()["results"]) == len(DOCUMENTS)
    assert len(rerank(http, {**body, "top_n": 50}).json()["results"]) == len(DOCUMENTS)
    # Strings and {text} objects are the same documents; /rerank is /v1/rerank.
    alias = rerank(http, {**body, "documents": TEXTS}, path="/rerank").json()["results"]
    assert [(r["index"], r["kept"]) for r in alias] == [(r["index"], r["kept"]) for r in full]
    assert [r["relevance_score"] for r in alias] == pytest.approx(
        [r["relevance_score"] for r in full], abs=1e-6)


def test_sentence_granularity_gives_the_kept_documents_key_sentences(
        http: httpx.Client, in_process: dict[str, HFBackend]) -> None:
    reply = rerank(http, {"model": "filter", "query": QUERY, "documents": DOCUMENTS,
                          "granularity": "sentence"})
    assert reply.status_code == 200, reply.text
    results = {r["index"]: r for r in reply.json()["results"]}
    documents = as_documents(TEXTS)
    expected = MultiGranularFilter(in_process["filter"], MCFConfig(sentence_stage=True)
                                   ).select(QUERY, documents).scored
    for index, (document, scored) in enumerate(zip(documents, expected, strict=True)):
        result = results[index]
        assert result["kept"] == scored.kept
        if not scored.kept:
            assert result["key_sentences"] == []
            continue
        sentences = document_sentences(document)
        assert result["key_sentences"] == [sentences[i].strip()
                                           for i in scored.details["key_sentences"]]
        assert result["key_sentences"] and all(s in document.text
                                               for s in result["key_sentences"])


def test_key_sentences_follow_the_filters_sentence_reply() -> None:
    """The sentence stage's replies, scripted: "2" narrows a kept document to its second
    sentence; "none" under drop_chunk drops it; a document not kept has none."""
    texts = ["Alpha one. Alpha two. Alpha three.", "Beta one. Beta two.", "Gamma one. Gamma two."]
    backend = ScriptedBackend(
        reply=lambda text: "none" if "Beta" in text else "2",
        labels=lambda text: {"Yes": -3.0 if "Gamma" in text else -0.1, "No": -1.0})
    config = MCFConfig(bar="fixed", sentence_stage=True, empty_sentence_answer="drop_chunk")
    by_filter = Combination(weights={"filter_log_odds": 1.0}, fitted=True)
    ranked = rank_by_filter(backend, config, "which?", as_documents(texts), by_filter)
    assert [(r.index, r.kept, r.key_sentences) for r in ranked] == [
        (0, True, ("Alpha two.",)), (1, False, ()), (2, False, ())]
    assert ranked[0].relevance_score == pytest.approx(1 / (1 + math.exp(-0.9)))
    # The pruned text is what MCF passes on; the spans mark the key sentence in the text.
    assert [r.pruned_text for r in ranked] == ["Alpha two.", "", ""]
    assert [[(texts[r.index][s.start:s.end], s.kept) for s in r.spans] for r in ranked] == [
        [("Alpha one.", False), ("Alpha two.", True), ("Alpha three.", False)],
        [("Beta one.", False), ("Beta two.", False)],
        [("Gamma one.", False), ("Gamma two.", False)]]
    assert all(s.score is None for r in ranked for s in r.spans)  # a two-stage filter's


def test_a_document_kept_whole_passes_on_its_whole_text() -> None:
    """A sentence reply that names none (keep_chunk) or does not parse keeps the document
    whole: its pruned text is its text as sent, every sentence key; one sentence is asked
    nothing."""
    texts = ["Alpha one.  Alpha two.\n", "Beta one. Beta two.", "Gamma one."]
    backend = ScriptedBackend(reply=lambda text: "none" if "Alpha" in text else "banana",
                              labels=lambda text: {"Yes": -0.1, "No": -1.0})
    config = MCFConfig(bar="fixed", sentence_stage=True)
    by_filter = Combination(weights={"filter_log_odds": 1.0}, fitted=True)
    ranked = rank_by_filter(backend, config, "which?", as_documents(texts), by_filter)
    assert [r.pruned_text for r in ranked] == texts
    assert all(r.kept and all(s.kept for s in r.spans) for r in ranked)
    assert [len(r.spans) for r in ranked] == [2, 2, 1]
    no_spans = rank_by_filter(backend, config, "which?", as_documents(texts), by_filter,
                              spans=False)
    assert [(r.spans, r.pruned_text) for r in no_spans] == [(None, t) for t in texts]


def test_engine_backend_computes_what_hf_computes(server: LocalServer,
                                                   in_process: dict[str, HFBackend]) -> None:
    """The backend the endpoint runs MCF on, beside the in-process one on the same adapter:
    one-token labels, a label of several tokens (scored as a reply), replies, generation."""
    engine, hf = EngineBackend(server.engine, "filter"), in_process["filter"]
    prompts = [chunk_prompt(QUERY, text) for text in TEXTS[:3]]
    labels = ["Yes", "No", "Absolutely not"]
    served, local = engine.label_logprobs(prompts, labels), hf.label_logprobs(prompts, labels)
    for got, expected in zip(served, local, strict=True):
        assert [got[label] for label in labels] == pytest.approx(
            [expected[label] for label in labels], abs=1e-4)
    # One label of several tokens: every label is scored as a reply, as HFBackend does.
    assert engine.meter.by_agent["scorer"].calls == len(prompts) * len(labels)
    replies = [" Yes, it says so.", "No", ""]
    assert engine.continuation_logprob(prompts, replies) == pytest.approx(
        hf.continuation_logprob(prompts, replies), abs=1e-4)
    settings = GenerationSettings(max_new_tokens=5)
    assert engine.generate(prompts, settings) == hf.generate(prompts, settings)
    engine.cancel()  # the client went away: nothing more runs
    with pytest.raises(CancelledError):
        engine.label_logprobs(prompts, labels)


# ----- refusals -----

def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


def test_documents_none_or_too_many_are_refused_and_long_ones_are_read(
        server: LocalServer, http: httpx.Client) -> None:
    body = {"model": "filter", "query": QUERY}
    empty = error_of(rerank(http, {**body, "documents": []}), 400)
    assert empty["param"] == "documents" and "empty" in empty["message"]
    many = error_of(rerank(http, {**body, "documents": ["a"] * (MAX_DOCUMENTS + 1)}), 400)
    assert f"at most {MAX_DOCUMENTS}" in many["message"]
    # Longer than the context, by its tokens or by its characters alone: read by windows.
    served = server.engine.served
    long_text = " ".join(f"word{i}" for i in range(400))
    huge = "x" * (served.max_model_len * max_token_chars(served.tokenizer))
    for text in (long_text, huge):
        assert rerank(http, {**body, "documents": ["short", text]}).status_code == 200
    # Only a query that leaves a window's prompt no room in the context is refused.
    too_long = error_of(rerank(http, {**body, "query": "why " * served.max_model_len,
                                      "documents": ["short"]}), 400)
    assert too_long["code"] == "context_length_exceeded" and too_long["param"] == "query"
    assert "chunk prompt on document 0" in too_long["message"]
    # The server still serves.
    assert rerank(http, {**body, "documents": ["short"]}).status_code == 200


def test_bad_requests_get_the_servers_errors(http: httpx.Client) -> None:
    unknown = error_of(rerank(http, {"model": "nope", "query": QUERY, "documents": TEXTS}), 404)
    assert unknown["code"] == "model_not_found" and "filter" in unknown["message"]
    spans = error_of(http.post("/v2/rerank", json={
        "model": "filter", "query": QUERY, "documents": TEXTS,
        "relevant_spans": {"mode": "enabled"}}), 400)
    assert spans["param"] == "relevant_spans" and "cannot be honoured" in spans["message"]
    typed = error_of(rerank(http, {"model": "filter", "query": QUERY,
                                   "documents": ["fine", {"txt": "typo"}]}), 400)
    assert typed["param"] == "documents" and "{\"text\": ...}" in typed["message"]
    missing = error_of(rerank(http, {"model": "filter", "documents": TEXTS}), 400)
    assert missing["param"] == "query"
    granularity = error_of(rerank(http, {"model": "filter", "query": QUERY, "documents": TEXTS,
                                         "granularity": "word"}), 400)
    assert granularity["param"] == "granularity"


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank", "/v3/anything"])
def test_rerank_needs_the_api_key(server: LocalServer, path: str) -> None:
    url = server.base_url.removesuffix("/v1") + path
    body = {"model": "filter", "query": QUERY, "documents": TEXTS}
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        reply = httpx.post(url, json=body, headers=headers, timeout=60)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"


# ----- a served filter role reads the card its server shows -----

def test_a_served_filter_role_without_a_card_is_one_error(server: LocalServer) -> None:
    """The tiny adapter has no card: /v1/models shows none for it, no filter has its served
    name, so a run's filter role on it is refused, naming both remedies; the model list
    itself needs the server's key."""
    from sieverag.inference.core.errors import ConfigError
    from sieverag.inference.filters.role_card import filter_card
    from sieverag.inference.llm.backend_registry import BackendSpec

    role = BackendSpec(endpoint=server.base_url, model="filter", api_key_env=KEY_ENV)
    with pytest.raises(ConfigError, match="served at .* as 'filter' has no filter card") as no:
        filter_card(role)
    assert "--models.filter-card NAME_OR_FOLDER" in str(no.value)
    assert "--models.filter-card retrieval-only" in str(no.value)
    assert filter_card(role, "retrieval-only").card is None
    with pytest.raises(ConfigError, match="api-key-env"):
        filter_card(BackendSpec(endpoint=server.base_url, model="filter"))


def test_the_server_says_what_each_served_model_ranks_by(
        server: LocalServer, caplog: pytest.LogCaptureFixture) -> None:
    """When it starts, the server says what /v1/rerank, /v1/score and the proxy rank each
    served model's documents by (`served_rankings`): without a card (the base model and the
    tiny adapter here) BM25 + dense alone, a card without a fitted combination the filter
    alone, a card with one its combination; the unfitted ones as warnings."""
    from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, find_adapter
    from sieverag.inference.filters.card.card_file import read_card
    from sieverag.serving.local_server import served_rankings

    names = server.engine.served.names
    assert all(not fitted and "by BM25 + dense alone" in line and "has no filter card" in line
               for fitted, line in served_rankings(names, server.cards).values())
    shipped = read_card(find_adapter(DEFAULT_FILTER_NAME).path)
    unfitted = {k: v for k, v in shipped.items() if k != "combination"}
    rankings = served_rankings(["base", "filter", "trained"],
                               {"filter": shipped, "trained": unfitted})
    # The shipped card's fit left the filter's score out: BM25 + dense, calibrated.
    assert rankings["filter"][0] and "by BM25 + dense alone, the combination of" in rankings[
        "filter"][1]
    assert not rankings["trained"][0]
    assert "the filter's own score, its P(Yes)" in rankings["trained"][1]
    assert "fit-combination" in rankings["trained"][1]
    with caplog.at_level("INFO", logger="sieverag.serving.local_server"):
        server._announce()  # what it logs when it starts
    warned = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert any("by BM25 + dense alone" in m and "'filter' has no filter card" in m
               for m in warned)
