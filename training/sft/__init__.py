"""LoRA multi-task SFT of the filter (TRL + PEFT) under accelerate / DeepSpeed.

    accelerate launch --config_file accelerate_configs/X.yaml -m sieverag.training.sft \
        --config training/sft/recipes/Y.yaml [--field value ...]

* `trainer` — the training script (`main`, run by `-m sieverag.training.sft`): the
  `SFTTrainer` built from a recipe, the run, the saved adapter checked and its card written;
* `sft_config` — its script arguments (`FilterScriptArguments`) and model/LoRA config
  (`FilterModelConfig`, TRL's `ModelConfig` with the filter's defaults);
* `recipe` — `parse_recipe`: TrlParser over the two and TRL's `SFTConfig`, with recipe keys
  and values checked against the fields (errors name the field);
* `launch` — what `sieverag train` launches and whether it fits the machine: a shipped
  accelerate config name → its GPU or CPU file, the config, process count and precision
  checked against the machine, the launch environment, and the defaults a rank without CUDA
  needs (gloo under DeepSpeed, `use_cpu` otherwise);
* `data` — the `sieverag build-dataset` output as training reads it (splits, sampling,
  dropping over-long records, content fingerprint, the questions of a split; the evaluation
  reads the last to leave the training questions out);
* `adapter` — the saved adapter: `verify_adapter` (non-empty, reloads with PEFT; the
  ZeRO-3 empty-adapter trap), its unique name, `sieverag_adapter.json`;
* `recipes/` — the shipped recipes: `smollm2_filter_cpu.yaml` (2-core CPU, <= 60 min),
  `llama3_8b_filter_zero2.yaml` (8 x A100 80 GB, DeepSpeed ZeRO-2), ...
"""
