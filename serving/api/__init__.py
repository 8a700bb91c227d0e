"""The embedded server's OpenAI-compatible endpoints, one module or folder each, as vLLM's
`entrypoints` lays them out: `health`, `models_route`, `completions/`, `chat/`, `rerank/`, `score/`
(each folder: `router` the thin routes, `protocol` that endpoint's request and response
bodies, `serving` the one class that owns its work).

What they share: `endpoint_base` (`Endpoint` on a `ServingContext`: the engine, the limits,
the model check, typed responses), `generation_protocol` (the sampling fields of completions
and chat), `request_fields` (`Text`, the lenient config), `field_policy` (what happens to each
request field: honoured, ignored, refused, or named in the `x-sieverag-ignored` header), `limits`
(prompt sizes and counts, checked before the work they bound), `openai_format` and
`streaming` (engine results as OpenAI bodies and server-sent events), `bodies` (how a body
is sent), `errors` and `error_handlers` (every refusal as OpenAI's error body), `middleware/`
(key, body size, disconnects, the concurrency limit and drain, request metrics), `metrics_route`
(GET /metrics).
"""
