"""Training of the filter, in two jobs:

* `sft/` — LoRA multi-task SFT of the filter (TRL + PEFT) under accelerate / DeepSpeed: the
  trainer (`accelerate launch -m sieverag.training.sft --config RECIPE`), its config,
  recipes (`sft/recipes/`), data and launch;
* `evaluation/` — the trained filter measured on held-out questions: `sieverag eval-filter`
  and its reports, and the fits of the filter's card (combination, home rule);
* `cli` — `sieverag train` (`plan_launch`: the checked launch), `sieverag eval-filter` and
  `sieverag filter fit-combination`.
"""
