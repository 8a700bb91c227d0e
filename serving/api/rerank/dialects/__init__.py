"""One module per client's rerank dialect, each mapping its client's request to the filter's
one query (`query.RankingQuery`) and the ranking back to its client's answer: `cohere` (Cohere
v1 and v2, Jina, vLLM's rerank: one body and answer), `infinity`, `tei`, `voyage`. Which one a
/v1/rerank request speaks is told by `rerank.detection`'s table."""
