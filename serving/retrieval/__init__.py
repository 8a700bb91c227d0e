"""`sieverag index serve`: one index held by an HTTP server, for other processes and machines.

* `config` — the server's settings (`RetrievalServerConfig`, the command's flags)
* `search_protocol` — the request and response bodies: Search-R1's `POST /retrieve` and sieverag's
  own `POST /v1/search` (the wire format the client, `inference.retrieval.remote`, reads)
* `retrieval_app` — the FastAPI app: the routes, `/health`, the API key, the body limit, the errors
* `server` — `RetrievalServer`: load the index, serve it (foreground or a background thread)
"""
