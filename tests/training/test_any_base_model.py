"""Any base model, with or without a chat template, through the whole filter path: label rows
→ `build-dataset` (its token lengths measured with the model's tokenizer) → training with the
8B recipes' code path (llama3_8b_filter_zero3 / qwen2_5_7b_filter_zero3: packed padding-free
batches, sdpa as `flash_attention_2_or_sdpa` resolves on a CPU, activation checkpointing;
float32 here) → the card (which chat template it learned) → MCF's scores in-process → the
embedded server's scores through the openai backend (`chat_template_model`).

The models are tiny random ones of the Llama-3 (LlamaConfig) and Qwen2 (Qwen2Config)
architectures (tests/tiny_model.py `save_tiny_architecture`), each once with a chat template
(Llama-3's; Qwen2's ChatML) and once without (as a base model's tokenizer is): without one,
every consumer renders with sieverag's fallback `sieverag-plain`.

Cost: the four are trained in one process each; DeepSpeed ZeRO-3 in two CPU processes runs
for one of them, the Llama-3 base without a template (the path a new user's first 8B run
takes), and must give the one-process adapter (as tests/training/test_train_multiprocess.py
checks DDP, ZeRO-2 and ZeRO-3 on the tiny Llama without packing). Two optimizer steps each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from observed_sft import p_yes
from repo_paths import REPO
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.types import Document
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.adapter_store import resolve_filter
from sieverag.inference.llm.chat_template import (
    CARD_KEY,
    FALLBACK_TEMPLATE,
    TOKENIZER_TEMPLATE,
    fallback_template,
)

RECIPES = {"llama3": REPO / "training" / "sft" / "recipes" / "llama3_8b_filter_zero3.yaml",
           "qwen2": REPO / "training" / "sft" / "recipes" / "qwen2_5_7b_filter_zero3.yaml"}
BASES = [("llama3", False), ("llama3", True), ("qwen2", False), ("qwen2", True)]
STEPS = 2
GLOBAL_BATCH = 2  # packed rows per optimizer step
P_YES_TOLERANCE = 1e-4
LAUNCH_TIMEOUT_S = 600
QUESTION = "Who built bridge 3?"
DOCUMENTS = [Document("g", "Bridge 3 is old. Ada built it.", title="Bridge 3"),
             Document("x", "Bananas are yellow. Apples are red.")]


def base_id(base: tuple[str, bool]) -> str:
    return f"{base[0]}-{'template' if base[1] else 'no-template'}"


@dataclass
class Trained:
    model: Path
    data: Path
    adapter: Path
    summary: object


@pytest.fixture(scope="module")
def labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A label folder (as `sieverag label` writes it) of 8 questions, 2 chunks each."""
    from sieverag.data_gen.labelling import LABELS_FILE

    def chunk(key: str, sentences: list[str], gold: bool, strinc: list[bool]) -> dict:
        return {"id": key, "title": key, "text": " ".join(sentences), "sentences": sentences,
                "sentences_given": True, "gold": gold,
                "gold_sentences": [i for i, s in enumerate(strinc) if s] if gold else [],
                "strinc": any(strinc), "sentence_strinc": strinc, "cxmi": None,
                "sentence_cxmi": None, "teacher": None}

    rows = [{"source": "synthetic", "question_id": f"q{n}", "question": f"Who built bridge {n}?",
             "answers": ["Ada"], "no_context_logprobs": None,
             "chunks": [chunk(f"g{n}", [f"Bridge {n} is old.", "Ada built it."], True,
                              [False, True]),
                        chunk(f"x{n}", ["Bananas are yellow.", "Apples are red."], False,
                              [False, False])]}
            for n in range(8)]
    folder = tmp_path_factory.mktemp("labels")
    (folder / LABELS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows),
                                      encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[tuple[str, bool], Path]:
    from tiny_model import save_tiny_architecture

    return {base: save_tiny_architecture(tmp_path_factory.mktemp(base_id(base)), *base,
                                         tokenizer_from=tiny_model_dir) for base in BASES}


def recipe_values(data: Path, model: Path, out: Path, per_device_batch: int) -> dict:
    """The 8B recipe's settings as a CPU runs them (float32), a few steps at a high rate."""
    return {"dataset_path": data, "model_name_or_path": model, "output_dir": out,
            "bf16": "false", "dtype": "float32", "max_steps": STEPS,
            "per_device_train_batch_size": per_device_batch, "gradient_accumulation_steps": 1,
            "max_length": 256, "learning_rate": 2e-2, "warmup_steps": 0, "lora_r": 8,
            "lora_alpha": 16, "lora_dropout": 0, "eval_strategy": "no", "save_strategy": "no",
            "logging_steps": 1, "dataloader_num_workers": 0, "disable_tqdm": "true",
            "report_to": "none", "seed": 0}


@pytest.fixture(scope="module")
def trained(models: dict, labels: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[tuple[str, bool], Trained]:
    """Each base: build-dataset with its tokenizer, then one training process."""
    from sieverag.data_gen.dataset import DatasetConfig, build_dataset
    from sieverag.training.sft.recipe import parse_recipe
    from sieverag.training.sft.trainer import train

    runs = {}
    for base, model in models.items():
        folder = tmp_path_factory.mktemp(f"run-{base_id(base)}")
        summary = build_dataset(DatasetConfig(labels=(str(labels),), out=str(folder / "data"),
                                              validation_fraction=0.25, tokenizer=str(model)),
                                progress=False)
        values = {**recipe_values(folder / "data", model, folder / "adapter", GLOBAL_BATCH),
                  "use_cpu": "true"}
        adapter = train(parse_recipe(["--config", str(RECIPES[base[0]])]
                                     + [a for k, v in values.items() for a in (f"--{k}", str(v))]))
        runs[base] = Trained(model, folder / "data", adapter, summary)
    return runs


def card(run: Trained) -> dict:
    from sieverag.inference.filters.card.card_file import CARD_FILE

    return json.loads((run.adapter / CARD_FILE).read_text(encoding="utf-8"))


@pytest.mark.parametrize("base", BASES, ids=base_id)
def test_the_card_records_the_template_and_the_recipe_path(trained: dict, base: tuple) -> None:
    run = trained[base]
    recorded = card(run)
    assert recorded[CARD_KEY]["name"] == (TOKENIZER_TEMPLATE if base[1] else FALLBACK_TEMPLATE)
    training = recorded["recipe"]["training"]
    assert (training["packing"], training["packing_strategy"]) == (True, "bfd")
    assert training["activation_checkpointing"] is True
    assert recorded["recipe"]["model_init_kwargs"] == {"dtype": "float32",
                                                       "attn_implementation": "sdpa"}
    assert recorded["metrics"]["global_step"] == STEPS
    # build-dataset measured every record with the same tokenizer and template.
    assert run.summary.token_lengths["chunk"]["count"] > 0


@pytest.mark.parametrize("base", BASES, ids=base_id)
def test_mcf_and_the_embedded_server_score_with_the_cards_template(trained: dict,
                                                                    base: tuple) -> None:
    from sieverag.inference.filters.filter_format import CHUNK_LABELS, chunk_prompt
    from sieverag.inference.filters.mcf import MultiGranularFilter
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
    from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig
    from sieverag.serving.config import LocalServerConfig
    from sieverag.serving.local_server import LocalServer

    run = trained[base]
    folder = resolve_filter(str(run.adapter), str(run.model))  # the card fits this model
    prompts = [chunk_prompt(QUESTION, d.text, d.title) for d in DOCUMENTS]
    # The served filter: the embedded server loads the same template; the client renders
    # prompts with `chat_template_model`'s tokenizer (labels outside the top-k scored whole).
    # Served first: the server copies the process's cached base, which the in-process filter
    # below wraps in place.
    config = LocalServerConfig(model=str(run.model), adapters=(f"filter={folder}",), port=0,
                               access_log=False)
    with LocalServer(config) as server, OpenAIBackend(OpenAIBackendConfig(
            base_url=server.base_url, model="filter", max_retries=0,
            missing_label_logprob="exact", chat_template_model=str(run.model))) as client:
        served = client.label_logprobs(prompts, list(CHUNK_LABELS))
        client_template = client._load_tokenizer().chat_template
    backend = HFBackend(HFBackendConfig(model=str(run.model), adapter=str(folder),
                                        dtype="float32", device="cpu"))
    assert (backend.tokenizer.chat_template == fallback_template()) is (not base[1])
    assert client_template == backend.tokenizer.chat_template
    in_process = [s["score"] for s in
                  MultiGranularFilter(backend).chunk_scores(QUESTION, DOCUMENTS)]
    assert all(math.isfinite(s) for s in in_process)
    assert [s["Yes"] - s["No"] for s in served] == pytest.approx(in_process, abs=1e-3)


def test_a_filter_is_refused_on_a_model_with_another_template(trained: dict) -> None:
    """The tiny bases of one architecture share their weights (same seed): only the
    template tells them apart, and the card's check does."""
    base_without = trained[("llama3", False)]
    other = trained[("llama3", True)]
    with pytest.raises(AdapterError, match=f"chat template {FALLBACK_TEMPLATE}"):
        resolve_filter(str(base_without.adapter), str(other.model))


def test_vllm_gets_the_fallback_template_for_a_base_without_one(models: dict) -> None:
    from sieverag.inference.llm.chat_template import fallback_template_file
    from sieverag.serving.config import VLLMLaunchConfig
    from sieverag.serving.vllm.launcher import build_vllm_command

    for base, model in models.items():
        command = build_vllm_command(VLLMLaunchConfig(model=str(model)), [], python="python",
                                     model=str(model))
        expected = [] if base[1] else ["--chat-template", str(fallback_template_file())]
        at = command.index("--chat-template") if "--chat-template" in command else None
        assert (command[at:at + 2] if at is not None else []) == expected


def test_zero3_in_two_processes_equals_one(trained: dict, tmp_path: Path) -> None:
    """ZeRO-3 in two CPU processes (`sieverag train --accelerate-config zero3`, as this
    CPU-only machine resolves it) on the Llama-3 base without a template: the adapter the
    one-process run trained, and the same card template."""
    import subprocess

    from sieverag.training.cli.train import TrainCommand, plan_launch
    from sieverag.training.sft.launch import Machine

    run = trained[("llama3", False)]
    out = tmp_path / "zero3"
    values = recipe_values(run.data, run.model, out, GLOBAL_BATCH // 2)
    cpu_only = replace(Machine.detect(), cuda_devices=0)
    plan = plan_launch(TrainCommand(recipe=str(RECIPES["llama3"]), accelerate_config="zero3",
                                    num_processes=2, overrides=values), cpu_only)
    assert plan.config.path.name == "deepspeed_zero3_cpu.yaml"
    assert plan.effective_batch == GLOBAL_BATCH
    done = subprocess.run(plan.argv, env=plan.env, cwd=REPO, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    zero3 = card(Trained(run.model, run.data, out, None))
    assert zero3["recipe"]["processes"] == 2
    assert zero3[CARD_KEY] == card(run)[CARD_KEY]
    from sieverag.inference.filters.filter_format import chunk_prompt

    prompts = [chunk_prompt(QUESTION, d.text, d.title) for d in DOCUMENTS]
    ours, reference, untrained = (p_yes(run.model, adapter, prompts)
                                  for adapter in (out, run.adapter, None))
    moved = max(abs(a - b) for a, b in zip(reference, untrained, strict=True))
    assert moved > 100 * P_YES_TOLERANCE, moved
    assert max(abs(a - b) for a, b in zip(ours, reference, strict=True)) <= P_YES_TOLERANCE
