"""LoRA multi-task SFT of the filter with TRL's `SFTTrainer`, under accelerate / DeepSpeed.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m sieverag.training.sft \\
        --config training/sft/recipes/smollm2_filter_cpu.yaml [--field value ...]

The recipe (see `training.sft.recipe`) sets the script arguments, TRL's `SFTConfig` and the
model/LoRA config; flags override it. The data is `sieverag build-dataset`'s output:
conversational prompt/completion records, so the loss falls on the completion only
(`completion_only_loss`), in whatever task mix the dataset holds. The run evaluates on the
validation split (held-out questions), saves checkpoints in `output_dir`, resumes from the
last one when rerun, and ends by saving the adapter in `output_dir`, checking that it is
non-empty and reloads with PEFT (`training.sft.adapter.verify_adapter`, under every accelerate
config), and writing `sieverag_adapter.json` (name, base model, dataset fingerprint, recipe,
metrics).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sieverag.inference.core.errors import ConfigError, DatasetError, SieveragError
from sieverag.inference.llm.chat_template import FALLBACK_TEMPLATE, load_tokenizer
from sieverag.training.sft.recipe import Recipe, parse_recipe
from sieverag.training.sft.sft_config import FLASH_OR_SDPA

if TYPE_CHECKING:
    from transformers import TrainerCallback

# TrainingArguments fields worth keeping in the adapter's metadata (the whole SFTConfig is
# ~200 fields, mostly defaults that do not shape the adapter).
RECORDED_TRAINING_FIELDS = (
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "num_train_epochs",
    "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
    "seed", "bf16", "fp16", "activation_checkpointing", "optim", "eval_strategy", "eval_steps",
    "train_sampling_strategy", "completion_only_loss", "packing", "packing_strategy",
    "padding_free",
)
PADDING_FREE_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa", "eager",
                          "flex_attention")
# The packages whose versions an adapter's metadata records.
TRAINING_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed")


def resume_checkpoint(recipe: Recipe) -> str | None:
    """The checkpoint to resume from: the one asked for, else (with `auto_resume`) the last one.

    `resume_from_checkpoint: last` (or `true`) means the last checkpoint in `output_dir`.
    """
    from transformers.trainer_utils import get_last_checkpoint

    asked = recipe.training.resume_from_checkpoint
    output_dir = Path(recipe.training.output_dir)
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if asked is None:
        return last if recipe.script.auto_resume else None
    if str(asked).lower() in ("last", "true"):
        if last is None:
            raise ConfigError(f"resume_from_checkpoint={asked}: {output_dir} holds no "
                              "checkpoint-N folder to resume from")
        return last
    if not Path(asked).is_dir():
        raise ConfigError(f"resume_from_checkpoint: checkpoint folder {asked} not found")
    return str(asked)


def lora_config(model_args: Any, base_dir: Path) -> Any:
    """TRL's LoRA config for the recipe's model config, on the layers from `lora_layers_from`
    up (checked against the base model's layer count)."""
    from transformers import AutoConfig
    from trl import get_peft_config

    config = get_peft_config(model_args)
    start = model_args.lora_layers_from
    if start:
        layers = AutoConfig.from_pretrained(base_dir, local_files_only=True).num_hidden_layers
        if start >= layers:
            raise ConfigError(f"lora_layers_from={start}: {model_args.model_name_or_path} has "
                              f"{layers} decoder layers (0 to {layers - 1})")
        config.layers_to_transform = list(range(start, layers))
    return config


def attention_implementation(requested: str | None) -> tuple[str | None, str]:
    """The attention kernel the base model is loaded with, and a line saying which and why.

    `FLASH_OR_SDPA` is `flash_attention_2` where the flash-attn package and a CUDA device
    are there, else `sdpa`; any other value is transformers' own (None: its default)."""
    if requested != FLASH_OR_SDPA:
        return requested, f"attention: {requested or 'the model default (transformers)'}"
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        return "flash_attention_2", ("attention: flash_attention_2 (attn_implementation "
                                     f"{FLASH_OR_SDPA}: flash-attn is installed)")
    return "sdpa", (f"attention: sdpa (attn_implementation {FLASH_OR_SDPA}: flash-attn is not "
                    "installed or there is no CUDA device)")


def model_init_kwargs(model_args: Any, args: Any, attention: str | None) -> dict[str, Any]:
    """What the base model is loaded with (TRL's `model_init_kwargs`): the recipe's dtype and
    attention kernel, and the recipe's own `model_init_kwargs`, which may not set either of
    them a second time."""
    given = dict(args.model_init_kwargs or {})
    fields = {"dtype": model_args.dtype, "attn_implementation": attention}
    twice = sorted(key for key in (*fields, "torch_dtype")
                   if key in given and given[key] != fields.get(key))
    if twice:
        raise ConfigError(f"model_init_kwargs sets {', '.join(twice)}: set dtype and "
                          "attn_implementation as recipe fields of their own, once")
    return {**given, **{key: value for key, value in fields.items() if value is not None}}


def check_padding_free(args: Any, attention: str | None) -> None:
    """Padding-free batches (`padding_free`, or `packing` with a `bfd` strategy) need an
    attention kernel that keeps the flattened records apart: flash attention (by
    `position_ids`) or sdpa, eager and flex (transformers builds their block-diagonal mask
    from the `position_ids` TRL gives)."""
    padding_free = args.padding_free or (args.packing and args.packing_strategy
                                         in ("bfd", "bfd_split"))
    if padding_free and attention not in PADDING_FREE_ATTENTION:
        raise ConfigError(
            f"padding_free/packing needs attn_implementation {', '.join(PADDING_FREE_ATTENTION)}"
            f" or {FLASH_OR_SDPA} (each keeps packed records apart), got {attention!r}")


def score_positions(*, label_only: bool) -> None:
    """Whether TRL's fused LM head scores only the positions with a label.

    TRL scores only those on devices with Triton and every position elsewhere, so that tile
    shapes stay fixed for compiling backends. On a CPU that is the vocabulary (49,152 rows for
    SmolLM2) at all ~200 positions of a filter record, for the 1–3 completion tokens it
    trains. The loss, entropy and accuracy are the same either way (unlabelled positions are
    zeroed), which tests/training/test_sft.py checks. TRL takes that choice in one helper of
    `trl.trainer.utils`; this sets it."""
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    if not hasattr(trl_utils, "_use_triton"):
        raise SieveragError("this TRL version no longer decides which positions its fused LM "
                            "head scores in trl.trainer.utils._use_triton: update "
                            "training.sft.trainer.score_positions")
    trl_utils._use_triton = (lambda device: True) if label_only else _use_triton


@dataclasses.dataclass
class PreparedRun:
    """What `build_trainer` prepared besides the trainer, for the run and its card."""

    base_dir: Path
    tokenizer: Any
    used: dict[str, Any]
    dropped: dict[str, int]
    evaluate: bool
    resume: str | None
    floor: float | None
    filter_format: str
    chat_template: dict[str, str]


def build_trainer(recipe: Recipe, callbacks: Sequence[TrainerCallback] = ()
                  ) -> tuple[Any, PreparedRun]:
    """The recipe's `SFTTrainer`, its base model loaded with every model field of the recipe
    (dtype, attention kernel, LoRA), and what the run needs besides; trains nothing."""
    from trl import SFTTrainer

    from sieverag.inference.llm.chat_template import template_identity
    from sieverag.inference.llm.model_resolution import resolve_model
    from sieverag.training.sft import data

    script, args, model_args = recipe.script, recipe.training, recipe.model
    base_dir = resolve_model(model_args.model_name_or_path)
    tokenizer = load_tokenizer(base_dir, trust_remote_code=args.trust_remote_code)
    chat_template = template_identity(tokenizer)
    attention, said = attention_implementation(model_args.attn_implementation)
    check_padding_free(args, attention)
    if int(os.environ.get("RANK", "0")) == 0:  # once per run, not once per process
        print(f"chat template: {chat_template['name']}"
              + (" (the base model's tokenizer has none)"
                 if chat_template["name"] == FALLBACK_TEMPLATE else "") + f"\n{said}")
    evaluate = args.eval_strategy != "no"
    dataset = data.load_training_splits(script.dataset_path, script.train_split,
                                        script.eval_split if evaluate else None)
    used = {"train": data.sample(dataset[script.train_split], script.max_train_examples,
                                 args.seed)}
    if evaluate:
        used["eval"] = data.sample(dataset[script.eval_split], script.max_eval_examples,
                                   args.seed)
    dropped = {}
    if script.drop_long_examples and args.max_length is not None:
        for name in used:
            used[name], dropped[name] = data.drop_long(used[name], tokenizer, args.max_length)
    for name, split in (("train", script.train_split), ("eval", script.eval_split)):
        if name in used and len(used[name]) == 0:
            raise DatasetError(f"no records left in {script.dataset_path} split {split!r} "
                               f"after dropping the {dropped[name]} longer than max_length="
                               f"{args.max_length}: raise max_length")

    args.model_init_kwargs = model_init_kwargs(model_args, args, attention)
    resume = resume_checkpoint(recipe)
    score_positions(label_only=script.score_label_positions_only)
    filter_format = data.filter_format_of(used["train"])
    floor = data.base_rate_loss(used["eval"] if evaluate else used["train"])
    if floor is not None:
        print(f"base-rate loss {floor:.4f} nats per verdict: an eval loss near it means the "
              "filter learned only how often each kind of verdict is Yes")
    trainer = SFTTrainer(
        model=str(base_dir),
        args=args,
        train_dataset=data.trained_columns(used["train"], tokenizer),
        eval_dataset=data.trained_columns(used["eval"], tokenizer) if evaluate else None,
        processing_class=tokenizer,
        peft_config=lora_config(model_args, base_dir),
        callbacks=list(callbacks),
    )
    return trainer, PreparedRun(base_dir, tokenizer, used, dropped, evaluate, resume, floor,
                                filter_format, chat_template)


def train(recipe: Recipe, callbacks: Sequence[TrainerCallback] = ()) -> Path:
    """Run the recipe; returns the folder holding the verified adapter and its metadata.

    `callbacks` are passed to the trainer (the tests use one to snapshot the weights).
    """
    from transformers.integrations import unset_hf_deepspeed_config

    from sieverag.training.sft import data

    trainer, run = build_trainer(recipe, callbacks)
    script, args, model_args = recipe.script, recipe.training, recipe.model
    base_dir, used, dropped, floor = run.base_dir, run.used, run.dropped, run.floor
    evaluate, resume, tokenizer = run.evaluate, run.resume, run.tokenizer
    filter_format = run.filter_format
    started = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    metrics: dict[str, Any] = dict(result.metrics)
    if evaluate:
        metrics.update(trainer.evaluate())
    trainer.save_model(args.output_dir)
    trainer.accelerator.wait_for_everyone()
    output_dir = Path(args.output_dir)
    if not trainer.accelerator.is_main_process:
        return output_dir
    # Training is over: the adapter check's models are built whole, not partitioned by
    # ZeRO-3's zero.Init (which would wait for ranks that have finished).
    unset_hf_deepspeed_config()

    from sieverag.inference.filters.adapter_files import weights_sha256
    from sieverag.inference.filters.card.card_file import filter_template_hashes
    from sieverag.inference.filters.filter_format import FORMAT_KEY
    from sieverag.inference.filters.windows import RECORD_TOKENS_KEY
    from sieverag.inference.llm.chat_template import CARD_KEY as CHAT_TEMPLATE_KEY
    from sieverag.inference.llm.model_resolution import EMBEDDED_MODELS
    from sieverag.training.sft.adapter import adapter_name, verify_adapter, write_adapter_metadata

    # A linear warmup starts at learning rate 0: a run whose only step is its first one (the
    # README's two-question sample) rightly leaves every lora_B at zero.
    steps = trainer.state.global_step
    updates = steps - (1 if args.get_warmup_steps(trainer.state.max_steps) > 0 else 0)
    check = verify_adapter(output_dir, base_dir, require_trained=updates > 0)
    name = script.adapter_name or adapter_name(model_args.model_name_or_path, output_dir)
    world = trainer.accelerator.num_processes
    metadata = {
        "name": name,
        "base_model": model_args.model_name_or_path,
        "base_model_path": str(base_dir),
        "base_model_hub_name": getattr(EMBEDDED_MODELS.get(model_args.model_name_or_path),
                                       "hub_name", None),
        # What `check_card` compares before the adapter is loaded onto a model.
        "base_model_sha256": weights_sha256(base_dir),
        "prompt_templates": filter_template_hashes(filter_format),
        FORMAT_KEY: filter_format,
        CHAT_TEMPLATE_KEY: run.chat_template,
        "dataset": {
            "path": str(Path(script.dataset_path).resolve()),
            "fingerprint": data.content_fingerprint(used),
            "train_split": script.train_split,
            "eval_split": script.eval_split if evaluate else None,
            "records": {split: len(records) for split, records in used.items()},
            "tasks": {split: data.column_counts(records, "task")
                      for split, records in used.items()},
            "sources": {split: data.column_counts(records, "source")
                        for split, records in used.items()},
            # Every question of the training split, so an evaluation can leave them out
            # wherever the card goes (the dataset folder stays on the training machine).
            "train_questions": sorted(map(list, data.question_ids(script.dataset_path,
                                                                  script.train_split))),
            "dropped_longer_than_max_length": dropped,
            # What the filter read: a served filter reads long documents in windows this long.
            RECORD_TOKENS_KEY: data.record_token_lengths(used["train"], tokenizer),
        },
        "recipe": {
            "path": recipe.path,
            "values": recipe.values,
            "overrides": recipe.overrides,
            "script": dataclasses.asdict(script),
            "model": dataclasses.asdict(model_args),
            "training": {k: getattr(args, k) for k in RECORDED_TRAINING_FIELDS
                         if hasattr(args, k)},
            # What the base model was loaded with (the attention kernel as resolved).
            "model_init_kwargs": {k: str(v) for k, v in args.model_init_kwargs.items()},
            "processes": world,
            "effective_batch": (args.per_device_train_batch_size
                                * args.gradient_accumulation_steps * world),
            "resumed_from": resume,
        },
        "metrics": {**metrics, "base_rate_loss": floor, "global_step": trainer.state.global_step,
                    "wall_seconds": round(time.time() - started, 1)},
        "adapter": dataclasses.asdict(check),
        "versions": package_versions(),
    }
    write_adapter_metadata(output_dir, metadata)
    if steps > 0 and updates <= 0:
        print(f"note: the run's one optimizer step had learning rate 0 (the start of its "
              f"warmup, warmup_steps={args.warmup_steps}), so the adapter is untrained: give it "
              "more training records or lower warmup_steps")
    print(f"adapter {name}: {output_dir} ({check.tensors} LoRA tensors, "
          f"{check.parameters:,} parameters, {check.file_bytes / 1e6:.1f} MB); "
          f"train_loss {metrics.get('train_loss', float('nan')):.4f}"
          + (f", eval_loss {metrics['eval_loss']:.4f}" if "eval_loss" in metrics else "")
          + (f" (base-rate loss {floor:.4f})" if floor is not None else ""))
    return output_dir


def package_versions(packages: Sequence[str] = TRAINING_PACKAGES) -> dict[str, str]:
    """The installed version of each of `packages` (those not installed left out)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def main(argv: Sequence[str] | None = None, callbacks: Sequence[TrainerCallback] = ()) -> int:
    """Entry point of `accelerate launch -m sieverag.training.sft` (or `python -m ...`)."""
    from sieverag.training.sft.launch import skip_unused_deepspeed_ops

    skip_unused_deepspeed_ops()
    try:
        train(parse_recipe(sys.argv[1:] if argv is None else argv), callbacks)
    except SieveragError as err:
        print(f"sieverag.training.sft: error: {err}", file=sys.stderr)
        return 2
    return 0

