"""The bodies of the index server's routes.

* Search-R1's `POST /retrieve`: `{"queries": [...], "topk": k, "return_scores": true}` →
  `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (without
  `return_scores`: `{"result": [[{"id", "contents"}, ...], ...]}`), `contents` being
  `"Title"\\ntext` as in the wiki-18 corpus Search-R1 reads, so its trainers parse it as theirs.
* sieverag's `POST /v1/search`: `{"queries": [...], "k": 10, "mode": "hybrid"}` → the rankings
  as `inference.retrieval.remote` reads them (`hit_payload`).

Fields a model does not declare are accepted and named in the `x-sieverag-ignored` header, as
on `sieverag serve`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sieverag.inference.retrieval.index_folder import SearchMode
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.serving.api.request_fields import LENIENT, Text


class RetrieveRequest(BaseModel):
    """Search-R1's request."""

    model_config = LENIENT

    queries: list[Text] = Field(description="the queries, answered in one batch")
    topk: int | None = Field(default=None, ge=1, description="passages per query (unset: the "
                                                             "server's --topk)")
    return_scores: bool = Field(default=False, description="pair each passage with its score")


class SearchRequest(BaseModel):
    """sieverag's request: any mode the index supports."""

    model_config = LENIENT

    queries: list[Text] = Field(description="the queries, answered in one batch")
    k: int = Field(default=10, ge=1, description="hits per query")
    mode: SearchMode = Field(default="hybrid", description="bm25, dense, hybrid or rrf")


def search_r1_document(hit: RetrievedDocument) -> dict[str, Any]:
    """A hit as a Search-R1 corpus row: its id and `contents` ("Title" line, then the text)."""
    document = hit.document
    return {"id": document.id, "contents": f'"{document.title}"\n{document.text}'}


def search_r1_result(rankings: list[list[RetrievedDocument]], return_scores: bool
                     ) -> dict[str, Any]:
    """Search-R1's response body for `rankings`."""
    if return_scores:
        return {"result": [[{"document": search_r1_document(hit), "score": hit.score}
                            for hit in ranking] for ranking in rankings]}
    return {"result": [[search_r1_document(hit) for hit in ranking] for ranking in rankings]}
