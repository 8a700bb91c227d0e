"""One demo question end to end through `amber` on the embedded SmolLM2, with the judge and
with the shipped trained filter as the filter stage, the memory agents included."""

from __future__ import annotations

import json

import pytest
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.composition.config import RunConfig, TrustConfig
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.pipelines.amber.collector import CollectorConfig
from sieverag.inference.pipelines.amber.config import AmberConfig
from sieverag.inference.pipelines.amber.loop_trace import STOP_REASONS
from sieverag.inference.pipelines.amber.memory import MemoryConfig

pytestmark = pytest.mark.integration

PIPELINES = ("amber-judge", "amber-mcf")


def test_one_demo_question_end_to_end(tmp_path, embedded_model_dir):
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    config = RunConfig(
        dataset=str(dataset), pipelines=PIPELINES, limit=1, trust=TrustConfig(enabled=False),
        amber=AmberConfig(max_iterations=2, answer_from="memory_and_evidence",
                          memory=MemoryConfig(review_max_new_tokens=32,
                                              refine_max_new_tokens=64),
                          collector=CollectorConfig(query_max_new_tokens=16)))
    summaries = run_evaluation(config, tmp_path / "run", progress=False)
    for name in PIPELINES:
        record = json.loads((tmp_path / "run" / "results" / f"{name}.jsonl").read_text())
        trace = record["trace"]
        first = trace["rounds"][0]
        # The demo question's five documents all arrive in round 1; the gold one is among them.
        assert len(first["retrieved"]) == 5 and "demo-0-0/2" in first["retrieved"]
        assert trace["stop_reason"] in STOP_REASONS
        if first["kept"]:
            assert first["memory_update"] is not None and first["memory"]
        assert record["prediction"] and record["usage"]["generator"]["calls"] == 1
        assert summaries[name]["examples"] == 1
