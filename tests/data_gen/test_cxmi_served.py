"""CXMI through served prompt log-probs (`label --scorer-endpoint URL[,URL...]`) against the
embedded server on the tiny model: the labels' CXMI equals the in-process scorer's within
1e-3, with two replicas sharing the work. (Through the real vLLM CPU build:
tests/inference/llm/test_vllm_real.py.) In-process batches are sized by
`--scorer-batch-tokens`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.data_gen.cxmi import BatchedCXMI, CXMIQuestion, SharedPrefixCXMI
from sieverag.data_gen.labelling import LABELS_FILE, LabelRunConfig, run_labelling
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

TOLERANCE = 1e-3
CONTEXTS = ["Paris is the capital of France.", "The Seine flows through Paris.",
            "Bananas are yellow.", "France borders Spain."]


def cxmi_values(out: Path) -> list[float]:
    """Every CXMI score and log-prob of a label folder, chunk then sentences, in order."""
    values = []
    for line in (out / LABELS_FILE).read_text().splitlines():
        for chunk in json.loads(line)["chunks"]:
            for entry in [chunk["cxmi"], *chunk["sentence_cxmi"]]:
                values += [entry["score"], entry["logprob_with"], entry["logprob_without"]]
    return values


def write_dataset(path: Path) -> Path:
    with path.open("w") as handle:
        for q, (question, answer) in enumerate([("What is the capital of France?", "Paris"),
                                                ("What colour are bananas?", "yellow")]):
            ctxs = [{"title": f"T{c}", "text": f"{text} It is well known."}
                    for c, text in enumerate(CONTEXTS)]
            handle.write(json.dumps({"id": f"q{q}", "question": question, "answers": [answer],
                                     "ctxs": ctxs}) + "\n")
    return path


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path) -> Iterator[list[LocalServer]]:
    """Two embedded servers serving the tiny model in float32, as two replicas."""
    config = LocalServerConfig(model=str(tiny_model_dir), port=0, access_log=False,
                               dtype="float32")
    with LocalServer(config) as first, LocalServer(config) as second:
        yield [first, second]


def test_served_cxmi_labels_equal_in_process_ones(replicas: list[LocalServer],
                                                  tiny_model_dir: Path, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    common = {"dataset": str(dataset), "scorer": str(tiny_model_dir), "device": "cpu"}
    run_labelling(LabelRunConfig(out=str(tmp_path / "local"), **common), progress=False)
    summary = run_labelling(LabelRunConfig(
        out=str(tmp_path / "served"), scorer_endpoint=tuple(r.base_url for r in replicas),
        **common), progress=False)
    local, served = cxmi_values(tmp_path / "local"), cxmi_values(tmp_path / "served")
    assert len(local) == len(served) > 30
    assert max(abs(a - b) for a, b in zip(local, served, strict=True)) < TOLERANCE
    assert summary.scorer_usage is not None and summary.scorer_usage["sequences"] > 0


class Recording:
    """A backend that scores as `inner` does and records how many sequences each call had."""

    def __init__(self, inner: HFBackend) -> None:
        self.inner = inner
        self.meter = inner.meter
        self.calls: list[int] = []

    def continuation_logprob(self, prompts: Sequence[Conversation], replies: Sequence[str], *,
                             agent: str = "scorer") -> list[float]:
        self.calls.append(len(prompts))
        return self.inner.continuation_logprob(prompts, replies, agent=agent)


def test_replicas_share_each_call_and_take_turns(tiny_model_dir: Path) -> None:
    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu",
                                        dtype="float32"))
    replicas = [Recording(backend) for _ in range(3)]
    spread = BatchedCXMI(*replicas)  # type: ignore[arg-type]
    small = CXMIQuestion("What is the capital of France?", ["Paris"], CONTEXTS[:1])
    question = CXMIQuestion("What is the capital of France?", ["Paris", "paris"], CONTEXTS)
    # Two sequences each: one to each of the next two replicas in turn; then (1 + 4
    # contexts) x 2 aliases in parts of 4, 4 and 2, from the replica whose turn it is. The
    # scores are one backend's to float rounding (rows batched with others or not).
    for asked in (small, small, question):
        [spread_scores] = spread.score_many([asked])
        [alone] = BatchedCXMI(backend).score_many([asked])
        assert [s.alias for s in spread_scores] == [s.alias for s in alone]
        assert [s.score for s in spread_scores] == pytest.approx([s.score for s in alone],
                                                                 abs=1e-4)
    assert [r.calls for r in replicas] == [[1, 1, 2], [1, 4], [1, 4]]


def test_in_process_batches_are_sized_by_the_token_setting(tiny_model_dir: Path) -> None:
    backend = HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu",
                                        batch_size=64))
    suffixes = [[1] * 40 for _ in range(20)]
    assert [len(b) for b in SharedPrefixCXMI(backend, batch_tokens=200)._batches(suffixes)] \
        == [5, 5, 5, 5]
    assert [len(b) for b in SharedPrefixCXMI(backend, batch_tokens=4000)._batches(suffixes)] \
        == [20]
    command = parse_settings(LabelRunConfig, ["--dataset", "d", "--out", "o",
                                              "--scorer-batch-tokens", "4096",
                                              "--scorer-endpoint", "http://a/v1,http://b/v1"],
                             "sieverag label")
    assert command.scorer_batch_tokens == 4096
    assert command.scorer_endpoint == ("http://a/v1", "http://b/v1")
    with pytest.raises(ConfigError, match="scorer_batch_tokens"):
        LabelRunConfig(dataset="d", out="o", scorer_batch_tokens=0)
    with pytest.raises(ConfigError, match="scorer_endpoint is set but scorer is none"):
        LabelRunConfig(dataset="d", out="o", scorer=None, scorer_endpoint=("http://a/v1",))
