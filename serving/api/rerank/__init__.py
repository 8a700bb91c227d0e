"""POST /v1/rerank, /rerank and /v2/rerank: the trained filter as a reranker. `router` holds
the routes, `protocol` the request and response bodies, `serving` the work (`Reranker`)."""
