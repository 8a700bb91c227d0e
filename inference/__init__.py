"""sieverag's runtime, by layer (tests/test_layers.py keeps imports pointing down):

* shared by all: `types`, `errors`, `io_utils`, `prompt_templates` (+ `prompts/`), `settings`
  (the one configuration system) and `answers` (cutting the scored answer from a reply);
* `data` — dataset loaders and the demo set;
* `llm` — backends (in-process transformers, OpenAI-compatible servers); `retrieval` — BM25,
  dense, hybrid (no LLM);
* `filters` — MCF (the trained filter), the MAIN-RAG judge, their stack, the shipped filter;
* `pipelines` — direct, vanilla, main-rag (and main-rag-naive), amber (with its memory and
  collector agents), auto (with its router);
* `config` (a run's settings, `presets/`) and `compose` (the model roles → pipelines);
* `integrations` — the filter inside LangChain and LlamaIndex pipelines, through the rerank
  endpoint (each framework imported by its own module only, behind its extra);
* `eval` — the runner, metrics, reports, trace rendering, the judge-bar sweep; `cli` — eval,
  ask, demo, trace, judge-sweep.

`inference` is the base of the project: `data_gen`, `training` and `serving` import it,
it imports none of them.
"""
