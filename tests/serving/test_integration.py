"""The embedded SmolLM2 served by the embedded server is the same model to the inference side:
MAIN-RAG's judge scores through the `openai` backend equal the in-process `hf` backend's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sieverag.inference.core.types import Document
from sieverag.inference.filters.judge import NO, YES, MainRagJudge
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"
DOCUMENTS = [
    Document("d1", "Paris is the capital and most populous city of France.", title="Paris"),
    Document("d2", "The Eiffel Tower was completed in 1889 for the World's Fair."),
    Document("d3", "Bananas are rich in potassium and grow in tropical climates."),
    Document("d4", "France's capital, Paris, hosts the national government.", title="France"),
]


@pytest.fixture(scope="module")
def backends(embedded_model_dir: Path) -> Iterator[tuple[OpenAIBackend, HFBackend]]:
    config = LocalServerConfig(model=DEFAULT_MODEL, port=0, access_log=False)
    with LocalServer(config) as server:
        remote = OpenAIBackend(OpenAIBackendConfig(
            base_url=server.base_url, model=DEFAULT_MODEL,
            chat_template_model=str(embedded_model_dir)))
        with remote:
            yield remote, HFBackend(HFBackendConfig(model=DEFAULT_MODEL))


def test_judge_through_the_server_equals_in_process(
    backends: tuple[OpenAIBackend, HFBackend]
) -> None:
    remote, local = backends
    served = MainRagJudge(remote).select(QUESTION, DOCUMENTS)
    in_process = MainRagJudge(local).select(QUESTION, DOCUMENTS)
    assert [s.details["predicted_answer"] for s in served.scored] == [
        s.details["predicted_answer"] for s in in_process.scored]
    assert [s.score for s in served.scored] == pytest.approx(
        [s.score for s in in_process.scored], abs=1e-4)
    assert [s.document.id for s in served.kept] == [s.document.id for s in in_process.kept]


def test_label_and_continuation_logprobs_equal_in_process(
    backends: tuple[OpenAIBackend, HFBackend]
) -> None:
    remote, local = backends
    prompts = [[{"role": "user", "content": f"Is this about France? {d.text} Answer Yes or No."}]
               for d in DOCUMENTS]
    served = remote.label_logprobs(prompts, [YES, NO])
    expected = local.label_logprobs(prompts, [YES, NO])
    for got, want in zip(served, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    replies = [" Yes, it is.", "No.", "Paris", " The answer is Paris."]
    assert remote.continuation_logprob(prompts, replies) == pytest.approx(
        local.continuation_logprob(prompts, replies), abs=1e-4)
