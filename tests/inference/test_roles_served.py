"""The judge and filter roles served by the embedded server are the same models to a run:
`main-rag` and `amber-stack` keep the same documents, in the same order, with the same
judge and filter scores (and the judge's same predicted answers), whether the roles run
in-process or through one `LocalServer` serving the base model and the filter's LoRA adapter
by name. The generator stays in-process in both runs.

The model is the tiny random one with its "Yes" and "No" made the two likeliest first tokens
of a reply (`yes_no_model`), so the served backend reads both labels from the top-20 log-probs
it asks for, as with real judges and trained filters (a label outside them is scored exactly by
a second request, tested in test_openai_backend.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from served_runs import comparison_config, records
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.composition.config import ModelRoles, RunConfig
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval import runner
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

PIPELINES = ("main-rag", "amber-stack")
ADAPTER_NAME = "tiny-filter"
QUESTIONS = ["demo-0-0", "demo-0-1"]
TOLERANCE = 1e-3


def yes_no_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny random model whose reply's first token is "Yes" or "No" most likely, by a
    margin that depends on the prompt: the chat template's last token ("\\n" after the
    assistant header) gets a large hidden feature that only the two label rows read, and those
    rows are scaled up so their difference varies from prompt to prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    with torch.no_grad():
        model.get_input_embeddings().weight[newline, 0] += 1.0
        for label in ("Yes", "No"):
            row = model.get_output_embeddings().weight[tokenizer.convert_tokens_to_ids(label)]
            row *= 30
            row[0] = 4.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run_config(dataset: Path, models: ModelRoles) -> RunConfig:
    # The random test adapter has no fitted combination in a card: the fused top 2 reads it.
    return comparison_config(dataset, models, PIPELINES, limit=len(QUESTIONS), max_new_tokens=4)


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Path, Path]]:
    """(in-process run folder, served run folder) on the same 2 demo questions."""
    root = tmp_path_factory.mktemp("roles")
    model = str(yes_no_model(tiny_model_dir, root / "model"))
    adapter = str(make_lora_adapter(Path(model), root / "adapter"))
    dataset = write_demo_dataset(root / "demo.jsonl")
    tiny = BackendSpec(model=model)
    local = ModelRoles(generator=tiny, judge=tiny, filter=BackendSpec(model=model, adapter=adapter))
    runner.run_evaluation(run_config(dataset, local), root / "in-process", progress=False)
    server_config = LocalServerConfig(model=model, adapters=(f"{ADAPTER_NAME}={adapter}",),
                                      port=0, access_log=False, log_level="warning")
    with LocalServer(server_config) as server:
        judge = BackendSpec(endpoint=server.base_url, model=server.engine.served.name,
                            chat_template_model=model)
        filter_ = BackendSpec(endpoint=server.base_url, model=ADAPTER_NAME,
                              chat_template_model=model)
        # The tiny adapter has no card: in-process it ranks by retrieval alone (with a
        # warning), served it must be asked to by name.
        served = ModelRoles(generator=tiny, judge=judge, filter=filter_,
                            filter_card="retrieval-only")
        try:
            runner.run_evaluation(run_config(dataset, served), root / "served", progress=False)
        finally:
            for spec in (judge, filter_):
                build_backend(spec).close()
    yield root / "in-process", root / "served"


def by_question(runs: tuple[Path, Path], pipeline: str) -> list[tuple[dict, dict]]:
    local, served = (records(out, pipeline) for out in runs)
    assert [r["id"] for r in local] == [r["id"] for r in served] == QUESTIONS
    return list(zip(local, served, strict=True))


def column(record: dict, key: str) -> list:
    return [s[key] for s in record["filter"]["scores"]]


def assert_close(served: list[float], local: list[float]) -> None:
    assert served == pytest.approx(local, abs=TOLERANCE)


def test_main_rag_keeps_the_same_documents_with_the_same_judge_scores(runs) -> None:
    for local, served in by_question(runs, "main-rag"):
        assert column(served, "id") == column(local, "id")
        assert column(served, "predicted_answer") == column(local, "predicted_answer")
        scores = column(local, "score")
        # Scores that differ between documents by far more than the tolerance: equal scores
        # on both sides would prove nothing.
        assert max(scores) - min(scores) > 20 * TOLERANCE
        assert_close(column(served, "score"), scores)
        assert served["filter"]["threshold"] == pytest.approx(local["filter"]["threshold"],
                                                              abs=TOLERANCE)
        assert column(served, "kept") == column(local, "kept")
        assert 0 < sum(column(local, "kept")) < len(scores)
        # Kept documents, best first: the documents the answer read.
        assert served["documents_read"] == local["documents_read"]
        assert served["prediction"] == local["prediction"]  # the in-process generator's


def test_amber_stack_keeps_the_same_chunks_with_the_same_judge_and_filter_scores(runs) -> None:
    for local, served in by_question(runs, "amber-stack"):
        mine, theirs = local["trace"], served["trace"]
        assert [r["retrieved"] for r in theirs["rounds"]] == [
            r["retrieved"] for r in mine["rounds"]]
        assert len(mine["rounds"]) == 1
        # The trained filter's s (the adapter: equal to the in-process adapter's, so the served
        # name ran the adapter, not the base), the judge's r (the base model), MCF's fusion
        # with BM25 and the stack's mean z-score. z-normalising over a round whose judge
        # scores spread little magnifies float noise (served batches pad differently): the
        # z-mean differs by up to 4e-4 here, the raw scores by under 3e-5.
        for key in ("judge_score", "filter_score", "mcf_score", "score"):
            assert_close(column(served, key), column(local, key))
        filter_scores = column(local, "filter_score")
        assert max(filter_scores) - min(filter_scores) > 20 * TOLERANCE
        assert column(served, "predicted_answer") == column(local, "predicted_answer")
        for key in ("mcf_kept", "judge_kept", "kept"):
            assert column(served, key) == column(local, key)
        assert [r["kept"] for r in theirs["rounds"]] == [r["kept"] for r in mine["rounds"]]
        kept = column(local, "kept")
        assert 0 < sum(kept) < len(kept), "all or no chunk kept: the comparison proves little"
        assert [e["id"] for e in theirs["evidence"]] == [e["id"] for e in mine["evidence"]]
        assert theirs["fallback_evidence"] == mine["fallback_evidence"]
        assert served["documents_read"] == local["documents_read"]
        assert served["prediction"] == local["prediction"]
