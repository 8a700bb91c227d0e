"""`sieverag train`: a recipe by name or file, an accelerate config by name (ddp, zero2 and
zero3 follow the machine) or file, overrides from flags or YAML; the recipe, the dataset and
the config's fit to the machine checked before anything is launched, each misfit one line;
and a real launch. (Two-process launches: test_train_multiprocess.py.)"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from repo_paths import REPO, TEST_DATA
from sft_runs import filter_records, write_filter_dataset

from sieverag.accelerate_configs import ACCELERATE_CONFIGS, ACCELERATE_CONFIGS_DIR
from sieverag.cli import main
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import parse_settings, read_yaml_mapping
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.card.combination import PRIORS_ONLY, Combination, card_combination
from sieverag.training.cli.train import RECIPES_DIR, TrainCommand, launch_command, plan_launch
from sieverag.training.sft.launch import Machine

SAMPLE = TEST_DATA / "hotpotqa_sample.jsonl"


def parse(argv: list[str]) -> TrainCommand:
    return parse_settings(TrainCommand, argv, "sieverag train")


CPU_MACHINE = Machine(cuda_devices=0, cpu_cores=2, cpu_bf16=True)
GPU_MACHINE = Machine(cuda_devices=8, cpu_cores=16, cpu_bf16=True)


@pytest.mark.parametrize(("machine", "name", "file"), [
    (CPU_MACHINE, "cpu", "cpu.yaml"), (CPU_MACHINE, "ddp", "ddp_cpu.yaml"),
    (CPU_MACHINE, "zero2", "deepspeed_zero2_cpu.yaml"),
    (CPU_MACHINE, "zero3", "deepspeed_zero3_cpu.yaml"),
    (GPU_MACHINE, "ddp", "multi_gpu.yaml"), (GPU_MACHINE, "zero2", "deepspeed_zero2.yaml"),
    (GPU_MACHINE, "zero3", "deepspeed_zero3.yaml"), (GPU_MACHINE, "zero3_cpu",
                                                      "deepspeed_zero3_cpu.yaml"),
], ids=lambda v: v if isinstance(v, str) else "gpu" if v.cuda_devices else "cpu")
def test_names_pick_the_machines_file_and_overrides_become_recipe_flags(
        machine: Machine, name: str, file: str, filter_dataset: Path, tmp_path: Path) -> None:
    settings = tmp_path / "train.yaml"
    bf16 = machine.cuda_devices > 0 and file != "deepspeed_zero3_cpu.yaml"
    settings.write_text(f"recipe: smollm2_filter_cpu\noverrides: {{max_steps: 2, "
                        f"dataset_path: {filter_dataset}, bf16: {str(bf16).lower()}}}\n",
                        encoding="utf-8")
    processes = 1 if file == "cpu.yaml" else 2
    command = parse(["--config", str(settings), "--accelerate-config", name,
                     "--num-processes", str(processes)])
    plan = plan_launch(command, machine)
    argv = plan.argv
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--config_file") + 1] == str(ACCELERATE_CONFIGS_DIR / file)
    assert argv[argv.index("--num_processes") + 1] == str(processes)
    tail = argv[argv.index("-m", 3):]
    assert tail == ["-m", "sieverag.training.sft", "--config",
                    str(RECIPES_DIR / "smollm2_filter_cpu.yaml"), "--max_steps", "2",
                    "--dataset_path", str(filter_dataset), "--bf16", str(bf16)]
    assert plan.processes == processes  # the recipe's 4 per process x 2 accumulated:
    assert plan.effective_batch == 4 * 2 * processes
    on_cpu = file == "cpu.yaml" or file.endswith("_cpu.yaml")
    assert plan.config.use_cpu == on_cpu
    if on_cpu:  # a CPU config stays on the CPU, each process on its share of the cores
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and plan.env["DS_ACCELERATOR"] == "cpu"
        assert plan.env["OMP_NUM_THREADS"] == os.environ.get(
            "OMP_NUM_THREADS", str(machine.cpu_cores // processes))
    else:
        assert plan.env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize("name", [n for n, c in ACCELERATE_CONFIGS.items()
                                  if c.gpu and c.cpu and c.gpu != c.cpu])
def test_a_cpu_config_is_its_gpu_config_without_cuda(name: str) -> None:
    """The same launcher, DeepSpeed settings and script: only the device, the precision and
    the process count differ."""
    device_keys = {"use_cpu", "mixed_precision", "num_processes", "gpu_ids"}
    shipped = ACCELERATE_CONFIGS[name]
    gpu, cpu = (read_yaml_mapping(ACCELERATE_CONFIGS_DIR / f) for f in (shipped.gpu, shipped.cpu))
    assert {k: v for k, v in gpu.items() if k not in device_keys} == \
        {k: v for k, v in cpu.items() if k not in device_keys}
    assert (gpu["use_cpu"], cpu["use_cpu"]) == (False, True)
    assert (gpu["mixed_precision"], cpu["mixed_precision"]) == ("bf16", "no")


@pytest.mark.parametrize(("argv", "message"), [
    (["--recipe", "no_such_recipe"], "neither a shipped recipe"),
    (["--recipe", "smollm2_filter_cpu", "--accelerate-config", "zero9"],
     "neither a shipped config"),
    (["--recipe", "smollm2_filter_cpu", "--overrides", "max_stepz=2"], "--max_stepz"),
])
def test_a_bad_recipe_or_config_fails_before_the_launch(argv, message, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ConfigError, match=message):
        launch_command(parse(argv))


def write_config(folder: Path, shipped: str, **changes: str) -> Path:
    """A copy of a shipped accelerate config with some values changed."""
    import yaml

    path = folder / f"changed_{shipped}"
    values = {**read_yaml_mapping(ACCELERATE_CONFIGS_DIR / shipped), **changes}
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def failure(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error of `sieverag ARGV`, which must fail before launching anything."""
    capsys.readouterr()  # what the test's own setup wrote
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("sieverag: error: ") and error.count("\n") == 1, error
    assert "Traceback" not in error
    return error


MISFITS = {
    "a CUDA config without CUDA": (
        CPU_MACHINE, ["--accelerate-config", "single_gpu"], {},
        "single_gpu needs CUDA GPUs and this machine has none: use --accelerate-config cpu"),
    "a CUDA config file without CUDA": (
        CPU_MACHINE, ["--accelerate-config", str(ACCELERATE_CONFIGS_DIR / "multi_gpu.yaml")],
        {"bf16": "true"}, "runs on CUDA GPUs (use_cpu: false) and this machine has none"),
    "several processes of a one-process config": (
        CPU_MACHINE, ["--accelerate-config", "cpu", "--num-processes", "2"], {},
        "runs one process (distributed_type: NO), not 2: use --accelerate-config ddp"),
    "more processes than cores": (
        CPU_MACHINE, ["--accelerate-config", "ddp", "--num-processes", "3"], {},
        "launches 3 processes and this machine has 2 CPU core(s): use --num-processes 2"),
    "bf16 where the CPU has none": (
        replace(CPU_MACHINE, cpu_bf16=False), ["--accelerate-config", "cpu"], {"bf16": "true"},
        "this CPU has no bf16 instructions"),
    "bf16 with DeepSpeed on the CPU": (
        CPU_MACHINE, ["--accelerate-config", "zero3"], {"bf16": "true"},
        "runs DeepSpeed on the CPU, which trains in float32 only"),
    "more processes than GPUs": (
        replace(GPU_MACHINE, cuda_devices=1), ["--accelerate-config", "zero3"],
        {"bf16": "true"}, "launches 8 processes on this machine, one per GPU, and it has 1: "
                          "use --num-processes 1"),
    "a bf16 config and a float32 recipe": (
        GPU_MACHINE, ["--accelerate-config", "zero3"], {},
        "sets mixed_precision: bf16 and the recipe has bf16: false: add --overrides bf16=true"),
    "fp16 on the CPU": (
        CPU_MACHINE, ["--accelerate-config", "ddp"], {"fp16": "true"},
        "does not train in fp16"),
}


@pytest.mark.parametrize("case", list(MISFITS))
def test_a_config_that_does_not_fit_the_machine_is_one_line(
        case: str, filter_dataset: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    machine, flags, overrides, message = MISFITS[case]
    monkeypatch.setattr(Machine, "detect", classmethod(lambda cls: machine))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    values = ",".join(f"{k}={v}" for k, v in {"dataset_path": filter_dataset, **overrides}.items())
    error = failure(capsys, ["train", "--recipe", "smollm2_filter_cpu", *flags,
                             "--overrides", values])
    assert message in error


def test_bf16_fits_a_cpu_with_bf16(filter_dataset: Path, tmp_path: Path) -> None:
    """From a bf16 config or from the recipe alone (the recipe's precision wins over a
    float32 config)."""
    config = write_config(tmp_path, "cpu.yaml", mixed_precision="bf16")
    for name in (str(config), "cpu", "ddp"):
        plan = plan_launch(TrainCommand(recipe="smollm2_filter_cpu", accelerate_config=name,
                                        overrides={"dataset_path": filter_dataset, "bf16": True}),
                           CPU_MACHINE)
        assert plan.config.use_cpu


def write_splits(folder: Path, train: int, validation: int | None) -> Path:
    """A dataset folder of `train` and `validation` questions; `validation` None: an empty
    split saved without columns, as build-dataset once did (`load_from_disk` cannot read it)."""
    from datasets import Dataset, DatasetDict

    columns = Dataset.from_list(filter_records("c", 1)).select([])
    splits = {name: Dataset.from_list(filter_records(name[0], count)) if count else columns
              for name, count in (("train", train), ("validation", validation))}
    if validation is None:
        splits["validation"] = Dataset.from_dict({})
    empty = [name for name, split in splits.items() if len(split) == 0 and split.column_names]
    DatasetDict(splits).save_to_disk(folder / "dataset", num_shards=dict.fromkeys(empty, 1))
    return folder


@pytest.mark.parametrize(("train", "validation", "message"), [
    (0, 1, "holds no training records (split 'train' is empty)"),
    (1, 0, "has no records in split 'validation' to evaluate on: rebuild it with a "
           "--validation-fraction above 0"),
    (1, None, "has an empty split saved without its columns"),
], ids=["no training records", "empty validation split", "unreadable empty split"])
def test_a_dataset_training_cannot_use_is_one_line(train: int, validation: int | None,
                                                   message: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    folder = write_splits(tmp_path, train, validation)
    error = failure(capsys, ["train", "--recipe", "smollm2_filter_cpu", "--overrides",
                             f"dataset_path={folder}"])
    assert message in error and str(folder) in error


def test_an_empty_validation_split_trains_without_evaluation(tmp_path: Path) -> None:
    folder = write_splits(tmp_path, 1, 0)
    plan = plan_launch(TrainCommand(recipe="smollm2_filter_cpu", overrides={
        "dataset_path": folder, "eval_strategy": "no"}), CPU_MACHINE)
    assert plan.argv[-2:] == ["--eval_strategy", "no"]


def test_the_readme_sample_labels_builds_and_trains(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """README: label -> build-dataset -> train on the repository's two-question sample: both
    splits get records (one question held out), and the CPU recipe trains on the folder and
    saves an adapter (the tiny model in place of SmolLM2) whose card ranks by the filter: its
    one validation question is too few for the combination with BM25 and dense, so the
    filter's own score ranks (Platt-scaled on that question where it rises with relevance
    there), and MCF's ranking with the card follows the filter's score where retrieval's
    does not."""
    labels, data = tmp_path / "labels-hotpot", tmp_path / "dataset-hotpot"
    assert main(["label", "--dataset", str(SAMPLE), "--out", str(labels), "--scorer", "none",
                 "--quiet"]) == 0
    assert main(["build-dataset", "--labels", str(labels), "--out", str(data), "--mix",
                 "chunk=0.5,sentence=0.5", "--tokenizer", str(tiny_model_dir),
                 "--quiet"]) == 0
    assert "validation split is empty" not in capsys.readouterr().out
    stats = json.loads((data / "stats.json").read_text(encoding="utf-8"))
    assert stats["questions"] == {"train": 1, "validation": 1}
    assert all(sum(stats["counts"][split].values()) > 0 for split in ("train", "validation"))
    plan = plan_launch(TrainCommand(recipe="smollm2_filter_cpu",
                                    overrides={"dataset_path": data}), CPU_MACHINE)
    assert plan.config.path.name == "cpu.yaml"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]))
    run = tmp_path / "filter"
    capsys.readouterr()
    assert main(["train", "--recipe", "smollm2_filter_cpu", "--overrides",
                 f"dataset_path={data},output_dir={run},max_steps=1,"
                 f"model_name_or_path={tiny_model_dir},report_to=none"]) == 0
    assert (run / "adapter_model.safetensors").stat().st_size > 0
    said = capsys.readouterr().out
    assert said.splitlines()[-1].startswith("MCF ranks by the filter's own")
    combination = card_combination(read_card(run))
    assert {f for f, w in combination.weights.items() if w} == {"filter_log_odds"}
    assert combination.weights["filter_log_odds"] > 0
    assert_mcf_ranks_by_the_filter(combination, tiny_model_dir, run, data)


def assert_mcf_ranks_by_the_filter(combination: Combination, model_dir: Path, adapter: Path,
                                   data: Path) -> None:
    """On the validation question, MCF with the trained card orders its passages by the
    trained adapter's own score; and a filter score that orders them otherwise than BM25 +
    dense do changes MCF's ranking from retrieval's (`PRIORS_ONLY`) to the filter's."""
    from fake_backend import ScriptedBackend

    from sieverag.inference.data import load_examples
    from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    held_out = (data / "validation_ids.txt").read_text(encoding="utf-8").split()
    example = next(e for e in load_examples(SAMPLE) if e.id in held_out)

    def order(mcf: MultiGranularFilter) -> list[str]:
        scored = mcf.chunk_stage(example.question, example.documents).scored
        return [s.document.id for s in sorted(scored, key=lambda s: -s.score)]

    trained = MultiGranularFilter(HFBackend(HFBackendConfig(model=str(model_dir),
                                                            adapter=str(adapter))),
                                  MCFConfig(), combination)
    scored = trained.chunk_stage(example.question, example.documents).scored
    assert order(trained) == [s.document.id for s in sorted(
        scored, key=lambda s: -s.details["filter_score"])]
    retrieval = order(MultiGranularFilter(ScriptedBackend(), MCFConfig(), PRIORS_ONLY))
    # The filter puts retrieval's second passage first, its first second: neither retrieval's
    # order nor its reverse, so only a ranking by the filter's score gives it.
    wanted = [retrieval[1], retrieval[0], *retrieval[2:]]
    texts = {d.id: d.text for d in example.documents}

    def verdict(prompt: str) -> dict[str, float]:
        rank = next(i for i, doc in enumerate(wanted) if texts[doc] in prompt)
        return {"Yes": -0.1 - rank, "No": -1.0}

    assert order(MultiGranularFilter(ScriptedBackend(labels=verdict), MCFConfig(),
                                     combination)) == wanted != retrieval


def test_train_launches_accelerate_and_saves_an_adapter(tmp_path, tiny_model_dir, capsys,
                                                        monkeypatch):
    data = write_filter_dataset(tmp_path / "data")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"dataset_path: {data}\nmodel_name_or_path: {tiny_model_dir}\n"
        f"output_dir: {tmp_path / 'run'}\nbf16: false\nactivation_checkpointing: false\n"
        "per_device_train_batch_size: 2\nlora_r: 4\nlora_alpha: 8\nreport_to: none\n"
        "eval_strategy: 'no'\nsave_strategy: 'no'\ndisable_tqdm: true\n"
        "dataloader_pin_memory: false\n", encoding="utf-8")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]))
    assert main(["train", "--recipe", str(recipe), "--overrides", "max_steps=1"]) == 0
    assert capsys.readouterr().out.startswith("launching: ")
    assert (tmp_path / "run" / "adapter_model.safetensors").stat().st_size > 0
