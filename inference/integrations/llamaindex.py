"""LlamaIndex: the trained filter as a node post-processor (`pip install
"sieverag[llamaindex]"`).

`SieveragPostprocessor` sends the retrieved nodes' text (`MetadataMode.NONE`: the text
alone, no metadata) to the rerank endpoint (`rerank_client`), or with `filter` set runs the
filter in this process (`in_process`), and returns the nodes it keeps, best first. Each is a
copy whose score is the filter's `relevance_score` and whose metadata gains
`relevance_score`, `kept` and (at sentence granularity) `key_sentences`, hidden from the LLM
and the embedding model (`excluded_*_metadata_keys`). At sentence granularity a kept node's
text becomes the text the filter keeps of it (`pruned_text`: its key sentences, exactly what
the filtering proxy forwards); the index's own nodes are never changed.

Add it where LlamaIndex takes post-processors:
`index.as_query_engine(node_postprocessors=[SieveragPostprocessor(...)])`.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import ConfigDict, PrivateAttr

from sieverag.inference.core.types import RerankResult
from sieverag.inference.integrations.rerank_client import Ranker, RerankSettings


class SieveragPostprocessor(RerankSettings, BaseNodePostprocessor):
    """The nodes the filter keeps, best first (see `RerankSettings` for the settings;
    `api_key` is the server's key, held out of the fields so it is never shown or saved)."""

    model_config = ConfigDict(extra="forbid")

    _ranker: Ranker = PrivateAttr()

    def __init__(self, *, api_key: str | None = None, **settings: Any) -> None:
        super().__init__(**settings)
        self._ranker = self.ranker(api_key)

    @classmethod
    def class_name(cls) -> str:
        return "SieveragPostprocessor"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        query = _query(query_bundle)
        with self.callback_manager.event(CBEventType.RERANKING,
                                         payload=self._event(nodes, query)) as event:
            selected = self._ranker.select(query, [_text(node) for node in nodes])
            kept = [_annotated(nodes[result.index], result) for result in selected]
            event.on_end(payload={EventPayload.NODES: kept})
        return kept

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None
                                  ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        with self.callback_manager.event(CBEventType.RERANKING,
                                         payload=self._event(nodes, query)) as event:
            selected = await self._ranker.aselect(query, [_text(node) for node in nodes])
            kept = [_annotated(nodes[result.index], result) for result in selected]
            event.on_end(payload={EventPayload.NODES: kept})
        return kept

    def _event(self, nodes: list[NodeWithScore], query: str) -> dict[EventPayload, Any]:
        return {EventPayload.NODES: nodes, EventPayload.MODEL_NAME: self.model,
                EventPayload.QUERY_STR: query, EventPayload.TOP_K: self.top_n}


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("SieveragPostprocessor judges nodes against a query: pass "
                         "query_bundle or query_str to postprocess_nodes")
    return query_bundle.query_str


def _text(node: NodeWithScore) -> str:
    return node.node.get_content(metadata_mode=MetadataMode.NONE)


def _annotated(node: NodeWithScore, result: RerankResult) -> NodeWithScore:
    added = result.metadata()
    hidden = [key for key in added if key not in node.node.excluded_llm_metadata_keys]
    hidden_embed = [key for key in added if key not in node.node.excluded_embed_metadata_keys]
    copy = node.node.model_copy(update={
        "metadata": {**node.node.metadata, **added},
        "excluded_llm_metadata_keys": [*node.node.excluded_llm_metadata_keys, *hidden],
        "excluded_embed_metadata_keys": [*node.node.excluded_embed_metadata_keys,
                                         *hidden_embed]})
    original = _text(node)
    if (text := result.text(original)) != original:
        copy.set_content(text)
    return NodeWithScore(node=copy, score=result.relevance_score)
