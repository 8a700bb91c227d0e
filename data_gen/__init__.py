"""Labelling for the filter: STRINC, CXMI and a teacher turn QA data into multi-task training data.

* `strinc` — does a chunk/sentence contain a gold answer alias;
* `cxmi` — CXMI under a scorer LM (shared-prefix fast path, batched, naive reference);
* `teacher` — a strong model's verdicts over an OpenAI-compatible API, with a disk cache;
* `labels` — the label policy combining the signals (and gold), and agreement with gold;
* `labelling` — the resumable `label` run (one jsonl line of signals per question);
* `label_records` — the typed label record (`LabelRecord`, one labels.jsonl line) and its reader;
* `dataset` — the `build-dataset` step (records in the `inference.filters.filter_format`
  contract, balance, mix, split by question, save_to_disk + jsonl + stats.json);
* `cli` — the `label` and `build-dataset` subcommands.
"""
