"""Training of the filter: LoRA multi-task SFT (TRL + PEFT) under accelerate / DeepSpeed,
and filter evaluation. Launched with `accelerate launch -m training.sft` (see README)."""
