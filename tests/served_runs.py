"""What the tests that run the same pipelines in-process and against a server share: the run's
config (one small round of each pipeline, MCF's fused top 2, trust off) and the records a run
wrote, so both sides are compared record by record."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sieverag.inference.composition.config import ModelRoles, RunConfig, TrustConfig
from sieverag.inference.filters.judge import JudgeConfig
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.pipelines.amber.config import AmberConfig


def comparison_config(dataset: Path, models: ModelRoles, pipelines: Sequence[str], *,
                      limit: int, max_new_tokens: int) -> RunConfig:
    """A run of `pipelines` on the first `limit` questions of `dataset` with `models`: one
    amber round, the judge's predictor and every reply cut at `max_new_tokens`, trust off.
    MCF keeps its top 2 by the filter's score fused with BM25 (`bar=top_k`,
    `lexical_weight=1`): such tests compare the engines, not the default bar, which reads
    only what a filter's card fits."""
    return RunConfig(dataset=str(dataset), pipelines=tuple(pipelines), limit=limit,
                     models=models, generation=GenerationSettings(max_new_tokens=max_new_tokens),
                     judge=JudgeConfig(predictor_max_new_tokens=max_new_tokens),
                     amber=AmberConfig(max_iterations=1), trust=TrustConfig(enabled=False),
                     mcf=MCFConfig(bar="top_k", lexical_weight=1.0))


def records(out: Path, pipeline: str) -> list[dict]:
    """The records a run into `out` wrote for `pipeline` (results/<pipeline>.jsonl), in order."""
    lines = (out / "results" / f"{pipeline}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]
