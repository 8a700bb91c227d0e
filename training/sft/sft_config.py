"""The two configs `training.sft` parses beside TRL's `SFTConfig`: script and model/LoRA.

`FilterScriptArguments` says which data to train on and how to treat the run's folder;
`FilterModelConfig` is TRL's `ModelConfig` with the filter's defaults (the embedded
SmolLM2, LoRA on, every attention and MLP projection adapted) and values checked on
construction, so a bad recipe value fails at start-up with a message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL

# attn_implementation: flash_attention_2 where flash-attn and a CUDA device are, else sdpa.
FLASH_OR_SDPA = "flash_attention_2_or_sdpa"
# Llama-family names of every attention (q, k, v, o) and MLP (gate, up, down) projection.
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class FilterScriptArguments:
    """Which data `training.sft` trains on, and how it treats an existing run folder."""

    dataset_path: str = field(
        default="",
        metadata={"help": "the `sieverag build-dataset` output folder (holding `dataset/`), "
                          "or a `DatasetDict.save_to_disk` folder with train/validation splits"})
    train_split: str = field(default="train", metadata={"help": "split trained on"})
    eval_split: str = field(default="validation",
                            metadata={"help": "split evaluated on during training"})
    max_train_examples: int | None = field(
        default=None, metadata={"help": "train on a seeded random subset of N records "
                                        "(the task mix is kept in expectation); None: all"})
    max_eval_examples: int | None = field(
        default=None, metadata={"help": "evaluate on a seeded random subset of N records; "
                                        "None: the whole eval split"})
    drop_long_examples: bool = field(
        default=True, metadata={"help": "drop records longer than `max_length` tokens instead "
                                        "of letting truncation cut their completion"})
    auto_resume: bool = field(
        default=True, metadata={"help": "resume from the last checkpoint in `output_dir` when "
                                        "`resume_from_checkpoint` is not given"})
    adapter_name: str | None = field(
        default=None, metadata={"help": "the adapter's served name; default "
                                        "`filter-<base>-<8 hex digits of its content hash>`"})
    score_label_positions_only: bool = field(
        default=True, metadata={"help": "the LM head scores only the positions the loss trains "
                                        "(a filter record's few completion tokens), the same "
                                        "loss; false: every position, as TRL does off Triton"})

    def __post_init__(self) -> None:
        if not self.dataset_path:
            raise ConfigError("dataset_path is required: give the `sieverag build-dataset` "
                              "output folder (--dataset_path DIR or `dataset_path:` in the recipe)")
        at_least(1, max_train_examples=self.max_train_examples,
                 max_eval_examples=self.max_eval_examples)
        if self.train_split == self.eval_split:
            raise ConfigError(f"train_split and eval_split are both {self.train_split!r}: "
                              "evaluate on held-out questions")


@dataclass
class FilterModelConfig(ModelConfig):
    """TRL's `ModelConfig` with the filter's defaults; LoRA is the only way it trains."""

    model_name_or_path: str | None = field(
        default=DEFAULT_MODEL,
        metadata={"help": "base model: an embedded name (resolved by "
                          "inference.llm.model_resolution.resolve_model) or a local Hugging "
                          "Face folder"})
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "the base model's attention kernel (flash_attention_2, sdpa, eager, "
                          f"...), or {FLASH_OR_SDPA}: flash_attention_2 where the flash-attn "
                          "package and a CUDA device are, else sdpa (the run prints which); "
                          "None: transformers' default"})
    use_peft: bool = field(default=True, metadata={"help": "train a LoRA adapter (must be true)"})
    lora_target_modules: list[str] | None = field(
        default_factory=lambda: list(ALL_PROJECTIONS),
        metadata={"help": "module names LoRA adapts; default every attention and MLP projection"})
    lora_layers_from: int = field(
        default=0, metadata={"help": "LoRA only on the decoder layers from this index up (0: "
                                     "every layer); the backward pass stops at the lowest one"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model_name_or_path:
            raise ConfigError("model_name_or_path is required: an embedded model name "
                              f"({DEFAULT_MODEL}) or a local Hugging Face folder")
        if not self.use_peft:
            raise ConfigError("use_peft must be true: the filter is trained as a LoRA adapter")
        at_least(1, lora_r=self.lora_r)
        if self.lora_alpha <= 0:
            raise ConfigError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        at_least(0, lora_layers_from=self.lora_layers_from)
        if not self.lora_target_modules:
            raise ConfigError("lora_target_modules must name at least one module "
                              f"(e.g. {', '.join(ALL_PROJECTIONS)})")
