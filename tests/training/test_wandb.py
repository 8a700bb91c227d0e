"""A recipe with `report_to: wandb` trains offline (`WANDB_MODE=offline`) and wandb records it.

wandb is in the `dev` extra (and the `wandb` extra for users), so `make test` runs this: a
missing wandb fails it (ImportError) rather than skipping it.
Two steps on the tiny random model, in-process through `parse_recipe` + `train`; every wandb
folder (run files, cache, config, data) is under tmp_path, so nothing touches the home folder,
and offline mode never opens a connection. The run's `.wandb` file is read back (it is a
LevelDB-style log of `wandb_internal_pb2.Record` protobufs) to find the logged train loss.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from sft_runs import write_filter_dataset
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

BLOCK = 32 * 1024
HEADER = 7  # crc32 (4 bytes), length (2), record type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_wandb_records(path: Path) -> list:
    """The `Record` protobufs of a `.wandb` file (wandb ships no reader of its own)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    records, pending, offset = [], b"", 7
    while offset + HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < HEADER:  # a block's tail too short for a header is zero padding
            offset += left_in_block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[offset:offset + HEADER])
        if kind == 0 and length == 0:  # zero padding at the end
            break
        payload = data[offset + HEADER:offset + HEADER + length]
        assert zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF == checksum, f"crc at {offset}"
        offset += HEADER + length
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_recipe_reports_to_wandb_offline(tiny_model_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    from sieverag.inference.filters.adapter_files import WEIGHTS_FILE
    from sieverag.inference.filters.card.card_file import CARD_FILE
    from sieverag.training.sft.recipe import parse_recipe
    from sieverag.training.sft.trainer import train

    wandb_dir = tmp_path / "wandb-home"
    for name, folder in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"),
                         ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data"),
                         ("WANDB_ARTIFACT_DIR", "artifacts")):
        (wandb_dir / folder).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(wandb_dir / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "sieverag-test")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")  # no system-metrics sampler
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_LOG_MODEL", "WANDB_WATCH",
                 "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)

    dataset = write_filter_dataset(tmp_path / "data")
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {tiny_model_dir}\ndataset_path: {dataset}\noutput_dir: {out}\n"
        "max_steps: 2\nper_device_train_batch_size: 2\nlearning_rate: 1.0e-2\nlora_r: 4\n"
        "lora_alpha: 8\nlora_dropout: 0\nbf16: false\nactivation_checkpointing: false\n"
        "eval_strategy: 'no'\nsave_strategy: 'no'\nlogging_steps: 1\n"
        "dataloader_pin_memory: false\ndisable_tqdm: true\nseed: 0\n"
        "report_to: wandb\nrun_name: sieverag-wandb-test\n",
        encoding="utf-8")
    parsed = parse_recipe(["--config", str(recipe)])
    assert parsed.training.report_to == ["wandb"]

    try:
        saved = train(parsed)
        run = wandb.run
        assert run is not None, "report_to: wandb started no wandb run"
        assert run.offline
    finally:
        wandb.finish()  # the trainer's WandbCallback leaves the run open until exit
        wandb.teardown()  # and stop wandb-core, so it does not outlive this test

    # The run finished and saved its adapter.
    assert saved == out
    assert (out / WEIGHTS_FILE).stat().st_size > 0
    card = json.loads((out / CARD_FILE).read_text(encoding="utf-8"))
    assert card["metrics"]["global_step"] == 2
    assert card["recipe"]["values"]["report_to"] == "wandb"

    # wandb wrote one offline run folder, holding the logged train loss.
    runs = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, sorted(p.name for p in wandb_dir.rglob("*"))
    logs = list(runs[0].glob("run-*.wandb"))
    assert len(logs) == 1 and logs[0].stat().st_size > 0, sorted(runs[0].iterdir())
    records = read_wandb_records(logs[0])
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    losses = [(row["train/global_step"], row["train/loss"]) for row in history
              if "train/loss" in row]
    assert [step for step, _ in losses] == [1, 2], history
    assert all(loss > 0 for _, loss in losses), losses
    # The trainer's end-of-run train_loss went into the summary, the same as on the card.
    summary = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for r in records if r.WhichOneof("record_type") == "summary"
               for item in r.summary.update}
    assert summary["train_loss"] == pytest.approx(card["metrics"]["train_loss"])
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [0], "the wandb run did not finish cleanly"
