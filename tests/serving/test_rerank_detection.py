"""The rerank dialects without a server: the detection table (serving/api/rerank/detection.py)
tells each client's documented body apart and refuses every mix with one 400 naming a field,
each dialect module maps its body to the filter's one query, and each answer puts the
dialect's own fields before the filter's. The same bodies against a running server:
test_dialects.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sieverag.inference.core.types import RerankResult
from sieverag.serving.api.bodies import to_json
from sieverag.serving.api.rerank.detection import COHERE, DIALECTS, RerankRequest, dialect_of
from sieverag.serving.api.rerank.protocol import FilterFields, RerankV1Body
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.refusals import APIError
from sieverag.serving.request_limits import Truncation

QUERY = "Where was Liora Tamsin born?"
TEXTS = ["Liora Tamsin was born in Quorrin.", "Penguins huddle together in winter."]


def request(**fields: Any) -> RerankRequest:
    return RerankRequest.model_validate({"model": "filter", "query": QUERY, **fields})


def test_each_rows_fields_are_what_its_request_model_adds() -> None:
    for dialect in (*DIALECTS, COHERE):
        added = set(dialect.request.model_fields) - set(RerankV1Body.model_fields)
        assert added == set(dialect.fields), dialect.client
        assert issubclass(RerankRequest, dialect.request)


@pytest.mark.parametrize(("fields", "client"), [
    ({"documents": TEXTS, "top_n": 1, "return_documents": True, "max_chunks_per_doc": 2},
     "Cohere"),
    ({"documents": [{"text": t} for t in TEXTS], "top_n": 1}, "Cohere"),  # Jina
    ({"documents": TEXTS, "raw_scores": False, "return_documents": True}, "Infinity"),
    ({"texts": TEXTS, "raw_scores": True, "truncate": True, "top_n": 1}, "TEI"),
    ({"texts": TEXTS, "return_documents": True}, "TEI"),
    ({"documents": TEXTS, "top_k": 1, "truncation": False}, "Voyage"),
    ({"documents": TEXTS, "truncate_prompt_tokens": -1, "truncation_side": "left",
      "max_tokens_per_query": 3}, "vLLM"),
])
def test_each_clients_documented_body_is_told_apart(fields: dict[str, Any],
                                                    client: str) -> None:
    assert dialect_of(request(**fields)).client == client


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"texts": TEXTS, "documents": TEXTS}, "texts", "both texts (TEI) and documents"),
    ({"documents": TEXTS, "top_n": 1, "top_k": 1}, "top_k", "both top_n and top_k"),
    ({"texts": TEXTS, "top_k": 1}, "top_k",
     "mixes TEI's texts and Voyage's top_k: top_k is not a TEI field"),
    ({"documents": TEXTS, "top_k": 1, "truncation_side": "left"}, "truncation_side",
     "mixes Voyage's top_k and vLLM's truncation_side"),
    ({"documents": TEXTS, "top_k": 1, "raw_scores": True}, "top_k",
     "mixes Infinity's raw_scores and Voyage's top_k: top_k is not an Infinity field"),
    ({"documents": TEXTS, "raw_scores": True, "truncate_prompt_tokens": 9},
     "truncate_prompt_tokens", "mixes Infinity's raw_scores and vLLM's truncate_prompt_tokens"),
    ({"texts": TEXTS, "raw_scores": True, "truncation_side": "left"}, "truncation_side",
     "mixes TEI's texts and vLLM's truncation_side"),
    ({"documents": TEXTS, "truncate": True}, "truncate",
     "truncate is a TEI field, and TEI sends its documents as texts"),
])
def test_a_mix_of_dialects_is_one_400_naming_a_field(fields: dict[str, Any], param: str,
                                                    says: str) -> None:
    with pytest.raises(APIError) as refused:
        dialect_of(request(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    assert says in refused.value.message


def query_of(**fields: Any) -> RankingQuery:
    """The filter's query of a /v1/rerank body, by the dialect it speaks."""
    body = request(**fields)
    return dialect_of(body).query(body)


def test_each_dialect_maps_its_fields_to_the_one_query() -> None:
    tei = query_of(texts=TEXTS, truncate=True, truncation_direction="Left", return_text=True,
                   raw_scores=True)
    assert tei.texts == tuple(TEXTS) and tei.refusal.param == "texts"
    assert tei.truncation == Truncation(None, "end") and tei.return_documents and tei.raw_scores
    voyage = query_of(documents=TEXTS, top_k=1)
    assert voyage.top_n == 1 and voyage.truncation == Truncation()  # Voyage cuts by default
    assert query_of(documents=TEXTS, top_k=1, truncation=False).truncation is None
    vllm = query_of(documents=TEXTS, truncate_prompt_tokens=200, truncation_side="left",
                    max_tokens_per_query=3)
    assert vllm.truncation == Truncation(200, "end") and vllm.max_tokens_per_query == 3
    cohere = query_of(documents=[{"text": t} for t in TEXTS], max_chunks_per_doc=2, top_n=1)
    assert cohere.texts == tuple(TEXTS) and cohere.windows_per_doc(4) == 2
    assert cohere.truncation is None and not cohere.raw_scores
    assert query_of(documents=TEXTS, truncate_prompt_tokens=-1).truncation == Truncation()


@pytest.mark.parametrize(("fields", "param"), [
    ({"documents": TEXTS, "query": " "}, "query"), ({}, "documents"),
    ({"texts": None}, "documents")])
def test_a_blank_query_or_no_documents_is_refused_in_the_query(fields: dict[str, Any],
                                                               param: str) -> None:
    with pytest.raises(APIError) as refused:
        query_of(**fields)
    assert refused.value.param == param


def test_each_answer_sends_its_own_fields_before_the_filters() -> None:
    ranking = Ranking("filter", [RerankResult(0, 0.2, False, bar_rule="calibrated"),
                                 RerankResult(1, 0.9, True, bar_rule="calibrated")],
                      TEXTS, prompt_tokens=5, completion_tokens=2)
    answers = {}
    for fields in ({"texts": TEXTS, "return_text": True}, {"documents": TEXTS, "top_k": 1,
                                                             "return_documents": True},
                   {"documents": TEXTS, "raw_scores": False, "return_documents": True}):
        body = request(**fields)
        dialect = dialect_of(body)
        answers[dialect.client] = json.loads(to_json(dialect.answer(ranking,
                                                                    dialect.query(body))))
    assert answers["TEI"] == [
        {"index": 1, "score": 0.9, "text": TEXTS[1], "kept": True, "bar_rule": "calibrated"},
        {"index": 0, "score": 0.2, "text": TEXTS[0], "kept": False, "bar_rule": "calibrated"}]
    assert list(answers["TEI"][0]) == ["index", "score", "text", "kept", "bar_rule"]
    assert [list(d) for d in answers["Voyage"]["data"]] == [
        ["index", "relevance_score", "document", "kept", "bar_rule"]]
    assert answers["Voyage"]["usage"] == {"total_tokens": 7}
    assert [r["document"] for r in answers["Infinity"]["results"]] == [TEXTS[1], TEXTS[0]]
    assert set(FilterFields.model_fields) == {"kept", "key_sentences", "pruned_text", "spans",
                                              "bar_rule", "calibrated"}
