"""POST /v1/rerank's body (`RerankRequest`: every dialect's fields, on one model the field
policy documents and checks) and the one table that tells which dialect a request speaks
(`DIALECTS`, read by `dialect_of`).

The table lists each dialect's own fields, those its request model adds to the fields every
dialect reads (`RerankV1Body`): Infinity's `raw_scores`; TEI's `texts`, `return_text`,
`truncate`, `truncation_direction` and `raw_scores`; Voyage's `top_k` and `truncation`;
vLLM's `truncate_prompt_tokens` and `truncation_side`. A request speaks the first dialect of
the table that owns every such field it sends; one that sends none speaks Cohere's (`COHERE`,
which Jina speaks too). A request is refused (400, naming a field) when it sends its
documents twice, spells one setting two clients' ways, sends the own fields of two dialects
that no row holds together, or sends a dialect's fields without its documents field (TEI's
`texts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sieverag.serving.api.rerank.dialects import cohere, infinity, tei, voyage
from sieverag.serving.api.rerank.protocol import RerankV1Body
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.refusals import APIError

# Two clients' spellings of one setting, and the fields that each set a truncation rule: a
# request sends one of each pair (checked before the dialects, so the refusal names both).
ONE_SETTING = (("top_n", "top_k"), ("return_documents", "return_text"),
               ("truncation_direction", "truncation_side"), ("truncate", "truncation"),
               ("truncate", "truncate_prompt_tokens"), ("truncation", "truncate_prompt_tokens"))


@dataclass(frozen=True)
class Dialect:
    """One row of the table: the client, as refusals name it; the fields only its clients
    send (`request` adds them to `RerankV1Body`); the field it sends its documents in; how its
    request becomes the filter's query, and how the ranking becomes its answer."""

    client: str
    fields: tuple[str, ...]
    request: type[RerankV1Body]
    query: Callable[[Any], RankingQuery]
    answer: Callable[[Ranking, RankingQuery], BaseModel]
    documents_field: str = "documents"


# Infinity before TEI: `raw_scores` alone is Infinity's, with `texts` TEI's.
DIALECTS = (
    Dialect("Infinity", ("raw_scores",), infinity.InfinityRequest, infinity.ranking_query,
            infinity.answer),
    Dialect("TEI", ("texts", "return_text", "truncate", "truncation_direction", "raw_scores"),
            tei.TEIRequest, tei.ranking_query, tei.answer, documents_field="texts"),
    Dialect("Voyage", ("top_k", "truncation"), voyage.VoyageRequest, voyage.ranking_query,
            voyage.answer),
    Dialect("vLLM", ("truncate_prompt_tokens", "truncation_side"), cohere.VLLMRequest,
            cohere.ranking_query, cohere.answer),
)
# A request that sends no dialect's own field: Cohere's, which Jina speaks too.
COHERE = Dialect("Cohere", (), RerankV1Body, cohere.ranking_query, cohere.answer)


class RerankRequest(infinity.InfinityRequest, tei.TEIRequest, voyage.VoyageRequest,
                    cohere.VLLMRequest):
    """POST /v1/rerank (and /rerank): the Cohere v1, Jina, Infinity, vLLM, TEI and Voyage
    bodies in one, plus `granularity`; `dialect_of` tells which one a request speaks."""


def dialect_of(body: RerankRequest) -> Dialect:
    """The dialect `body` speaks (see the module's docstring); refused (400) where it mixes
    dialects."""
    sent = body.model_fields_set
    if "texts" in sent and "documents" in sent:
        raise APIError(400, "the request sends both texts (TEI) and documents: send the "
                       "documents once, in one of them", param="texts")
    for pair in ONE_SETTING:
        if all(name in sent for name in pair):
            raise APIError(400, f"the request sends both {pair[0]} and {pair[1]}, two "
                           "dialects' spellings of one setting: send one", param=pair[1])
    owned = {name for dialect in DIALECTS for name in dialect.fields if name in sent}
    if not owned:
        return COHERE
    chosen = next((d for d in DIALECTS if owned <= set(d.fields)), None)
    if chosen is None:
        raise _mixed(owned)
    told = [name for name in chosen.fields if name in sent]
    if chosen.documents_field not in sent and chosen.documents_field != "documents":
        raise APIError(400, f"{told[0]} is {_article(chosen.client)} {chosen.client} field, "
                       f"and {chosen.client} sends its documents as {chosen.documents_field}: "
                       f"send {chosen.documents_field}, or this dialect's field instead",
                       param=told[0])
    return chosen


def _mixed(owned: set[str]) -> APIError:
    """The refusal of a request sending the fields `owned` of two dialects: the dialect that
    owns the most of them, against the first field it does not own."""
    first = max(DIALECTS, key=lambda d: len(owned & set(d.fields)))
    mine = next(name for name in first.fields if name in owned)
    other = next(name for d in DIALECTS for name in d.fields
                 if name in owned and name not in first.fields)
    owner = next(d for d in DIALECTS if other in d.fields)
    return APIError(400, f"the request mixes {first.client}'s {mine} and {owner.client}'s "
                    f"{other}: {other} is not {_article(first.client)} {first.client} field; "
                    "send one dialect's fields", param=other)


def _article(client: str) -> str:
    return "an" if client[0] in "AEIOU" else "a"
