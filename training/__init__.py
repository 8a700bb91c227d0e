"""Training of the filter: LoRA multi-task SFT (TRL + PEFT) under accelerate / DeepSpeed, and
filter evaluation.

* `sft` — the training script: `accelerate launch --config_file accelerate_configs/X.yaml
  -m sieverag.training.sft --config training/recipes/Y.yaml [--field value ...]`;
* `sft_config` — its script arguments (`FilterScriptArguments`) and model/LoRA config
  (`FilterModelConfig`, TRL's `ModelConfig` with the filter's defaults);
* `recipe` — `parse_recipe`: TrlParser over the two and TRL's `SFTConfig`, with recipe keys
  and values checked against the fields (errors name the field);
* `launch` — what `sieverag train` launches and whether it fits the machine: a shipped
  accelerate config name → its GPU or CPU file, the config, process count and precision
  checked against the machine, the launch environment, and the defaults a rank without CUDA
  needs (gloo under DeepSpeed, `use_cpu` otherwise);
* `data` — the `sieverag build-dataset` output as training reads it (splits, sampling,
  dropping over-long records, content fingerprint, the questions of a split);
* `adapter` — the saved adapter: `verify_adapter` (non-empty, reloads with PEFT; the
  ZeRO-3 empty-adapter trap), its unique name, `sieverag_adapter.json`;
* `filter_methods` — the trained filter's chunk and sentence stages and the baselines
  (MAIN-RAG judge, BM25 / dense top-k, keep-all) on the same passages;
* `filter_eval` — `run_filter_eval`: every row on each dataset, chunk / sentence metrics,
  the cross-dataset summary;
* `filter_eval_config` — `FilterEvalConfig`, eval-filter's settings (its flags);
* `held_out_questions` — which questions eval-filter evaluates (training questions left out);
* `method_cache` — `MethodCache`: eval-filter's model work on disk under a fingerprint;
* `caching_backend` — `CachingBackend`: each distinct filter request answered once for all
  the MCF rows (its tables are eval-filter's cache);
* `filter_report` — report.json, report.md, the precision–recall plot;
* `questions_in_flight` — `--concurrency` for eval-filter and fit-combination: each
  per-question model loop run N questions at once (`by_question`, results in dataset order),
  in-process models on one `CallBatcher`;
* `combination_fit` — `sieverag filter fit-combination`: MCF's combination of the filter's
  score with BM25 and dense, fitted and measured on held-out questions, into the card;
* `cli` — `sieverag train` (`plan_launch`: the checked launch) and `sieverag eval-filter`;
* `recipes/` — `smollm2_filter_cpu.yaml` (2-core CPU, <= 60 min) and
  `llama3_8b_filter_zero2.yaml` (8 x A100 80 GB, DeepSpeed ZeRO-2).
"""
