"""Evaluation: computes and reports the metrics `inference.metrics` defines (answers, filters,
the trust metrics and the LLM grader): the resumable runner (`runner.run_evaluation`),
per-example records (`result_records`), summaries, the Markdown report, `trace_rendering` (one
saved example rendered readably, `sieverag trace`), `judge_sweep` (MAIN-RAG's bar re-applied at
other n to a run's stored judge scores, `sieverag judge-sweep`) and `export` (a run's records
as RAGAS-style jsonl, `sieverag export`). Datasets are read by the data layer below it
(`inference.data`)."""
