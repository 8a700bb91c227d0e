"""The trained filter measured on held-out questions: `sieverag eval-filter` against gold
passages and the baselines, and the fits of the filter's card (its combination with BM25 and
dense, its home rule), chosen by the same measurements.

* `filter_eval` — `run_filter_eval`: every row on each dataset, chunk / sentence metrics,
  the cross-dataset summary;
* `filter_eval_config` — `FilterEvalConfig`, eval-filter's settings (its flags);
* `filter_methods` — the trained filter's chunk and sentence stages and the baselines
  (MAIN-RAG judge, BM25 / dense top-k, keep-all) on the same passages;
* `held_out_questions` — which questions eval-filter evaluates (training questions left out);
* `method_cache` — `MethodCache`: eval-filter's model work on disk under a fingerprint;
* `caching_backend` — `CachingBackend`: each distinct filter request answered once for all
  the MCF rows (its tables are eval-filter's cache);
* `filter_report` — report.json, report.md, the precision–recall plot;
* `filter_eval_html`, `filter_eval.js` — report.html, one self-contained page;
* `questions_in_flight` — `--concurrency` for eval-filter and fit-combination: each
  per-question model loop run N questions at once (`by_question`, results in dataset order),
  in-process models on one `CallBatcher`;
* `combination_fit` — `sieverag filter fit-combination`: MCF's combination of the filter's
  score with BM25 and dense, fitted and measured on held-out questions;
* `home_fit` — the card's home rule: the home combination, the home test and its bar;
* `card_fit` — both fits written into the adapter's card, by `filter fit-combination` and at
  the end of `sieverag train`.
"""
