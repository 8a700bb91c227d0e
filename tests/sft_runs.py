"""Training runs for the tests: a tiny filter dataset in the real record format, two steps
under `accelerate launch`, and the checks on the adapter it writes.

The launched script is `training.sft.trainer.main` with one extra callback that snapshots every
parameter before training and records, after training, which ones changed: LoRA weights must
have changed, base weights must not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from sieverag.inference.filters.filter_format import chunk_record, sentence_record

ROOT = Path(__file__).resolve().parents[1]  # the repository

LAUNCHED = '''
import json, sys
import torch
from transformers import TrainerCallback
from sieverag.training.sft.trainer import main


class ChangedWeights(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        changed = {n: not torch.equal(self.before[n], p.detach())
                   for n, p in model.named_parameters()}
        with open(sys.argv[1], "w") as out:
            json.dump({"changed": changed,
                       "trainable": [n for n, p in model.named_parameters() if p.requires_grad]},
                      out)


sys.exit(main(sys.argv[2:], callbacks=[ChangedWeights()]))
'''


def filter_records(prefix: str, questions: int) -> list[dict]:
    records = []
    for n in range(questions):
        question = f"Who founded the company {prefix}{n}?"
        common = {"question": question, "source": "synthetic", "question_id": f"{prefix}{n}"}
        records += [
            chunk_record(chunk_text=f"Company {prefix}{n} was founded by Ada Byron {n}.",
                         relevant=True, title=f"Company {prefix}{n}", **common),
            chunk_record(chunk_text="Bananas are a yellow fruit grown in warm places.",
                         relevant=False, **common),
            sentence_record(sentences=[f"Company {prefix}{n} is old.",
                                       f"It was founded by Ada Byron {n}."],
                            key_sentences=[1], **common),
        ]
    return records


def write_filter_dataset(folder: Path) -> Path:
    """A `sieverag build-dataset`-shaped folder: dataset/ (save_to_disk) with two splits."""
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(filter_records("t", 4)),
                 "validation": Dataset.from_list(filter_records("v", 1))}
                ).save_to_disk(folder / "dataset")
    return folder


def launch_training(accelerate_config: str, dataset: Path, model_dir: Path, out: Path,
                    ) -> dict:
    """Two training steps under `accelerate launch`; returns the changed-weights report."""
    report = out.parent / f"{out.name}-weights.json"
    script = out.parent / "launched_sft.py"
    script.write_text(LAUNCHED, encoding="utf-8")
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / accelerate_config),
        str(script), str(report),
        "--dataset_path", str(dataset), "--model_name_or_path", str(model_dir),
        "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "2",
        "--per_device_eval_batch_size", "3", "--learning_rate", "1e-2", "--lora_r", "4",
        "--lora_alpha", "8", "--lora_dropout", "0", "--bf16", "false",
        "--activation_checkpointing", "false", "--eval_strategy", "steps", "--eval_steps", "2",
        "--save_steps", "1", "--logging_steps", "1", "--report_to", "none",
        "--dataloader_pin_memory", "false", "--disable_tqdm", "true", "--seed", "0",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text(encoding="utf-8"))


def assert_trained_adapter(out: Path, model_dir: Path, weights: dict, *,
                           records: dict | None = None, tasks: dict | None = None) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sieverag.inference.filters.adapter_files import WEIGHTS_FILE
    from sieverag.inference.filters.card.card_file import CARD_FILE
    from sieverag.training.sft.adapter import verify_adapter

    changed = weights["changed"]
    lora = [n for n in changed if "lora_" in n]
    base = [n for n in changed if "lora_" not in n]
    assert lora and base
    assert sorted(weights["trainable"]) == sorted(lora)
    assert all(changed[n] for n in lora), [n for n in lora if not changed[n]]
    assert not any(changed[n] for n in base), [n for n in base if changed[n]]
    for projection in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj"):
        assert any(projection in n for n in lora), projection

    assert (out / WEIGHTS_FILE).stat().st_size > 0
    verify_adapter(out, model_dir)
    base_model = AutoModelForCausalLM.from_pretrained(model_dir)
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert not torch.allclose(base_model(ids).logits, reloaded(ids).logits)

    metadata = json.loads((out / CARD_FILE).read_text(encoding="utf-8"))
    assert metadata["name"].startswith("filter-")
    assert metadata["base_model"] == str(model_dir)
    assert len(metadata["dataset"]["fingerprint"]) == 16
    assert metadata["dataset"]["records"] == (records or {"train": 12, "eval": 3})
    assert metadata["dataset"]["tasks"]["train"] == (tasks or {"chunk": 8, "sentence": 4})
    lengths = metadata["dataset"]["record_tokens"]  # the window a served filter reads
    assert 0 < lengths["median"] <= lengths["p95"] <= lengths["max"]
    assert metadata["metrics"]["global_step"] == 2
    assert "eval_loss" in metadata["metrics"]
    assert metadata["recipe"]["effective_batch"] == 2
    assert (out / "checkpoint-2").is_dir()
