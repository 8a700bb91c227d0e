"""POST /v1/completions: OpenAI's text completions, log-probs and echo included. `router`
holds the route, `protocol` the request and response bodies, `serving` the work
(`Completions`)."""
