"""POST /v1/rerank, /rerank and /v2/rerank: the trained filter as a reranker. `router` holds
the routes; `dialects/` one module per client's dialect (its request as the filter's one
query, `query.RankingQuery`, and the ranking as its answer), `detection` the table that tells
which one a request speaks, `protocol` what the dialects share; `serving` the work
(`RerankServing`)."""
