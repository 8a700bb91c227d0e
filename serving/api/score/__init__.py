"""POST /v1/score (and /score), vLLM's score API: each (query, document) pair's filter score.
`router` holds the routes, `protocol` the request and response bodies, `serving` the work
(`Scorer`)."""
