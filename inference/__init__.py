"""sieverag's runtime, by layer (tests/test_layers.py keeps imports pointing down).

The shared core — what `data_gen`, `training` and `serving` build on (they import nothing else
of `inference`):
* shared by all: `types`, `errors`, `io_utils`, `prompt_templates` (+ `prompts/`), `settings`
  (the one configuration system);
* `data` — dataset loaders and the demo set;
* `llm` — backends (in-process transformers, OpenAI-compatible servers); `retrieval` — BM25,
  dense, hybrid (no LLM);
* `filters` — MCF (the trained filter), the MAIN-RAG judge, their stack, the shipped filter;
  `roles` — who runs each model role; `answers` — cutting the scored answer from a reply;
* `metrics` — `metrics.answers` (EM, F1, accuracy), `metrics.filter` (a filter against gold
  passages and sentences), `metrics.retrieval` (recall@k, MRR): every metric is defined
  there, whichever command reports it.

Inference proper — answering and scoring questions:
* `pipelines` — one module each: direct, vanilla, main-rag (and main-rag-naive), iter-retgen,
  amber (with its memory and collector agents), auto (with its router);
* `config` (a run's settings, `presets/`) and `compose` (plan a run, build its roles and
  context);
* `integrations` — the filter inside LangChain and LlamaIndex pipelines, through the rerank
  endpoint (each framework imported by its own module only, behind its extra);
* `eval` — the runner, reports, trust metrics, trace rendering, the judge-bar sweep; `cli` —
  eval, ask, demo, trace, judge-sweep.

`inference` imports none of the parts built on it.
"""
