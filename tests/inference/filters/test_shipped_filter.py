"""The filter shipped with sieverag, on the embedded SmolLM2 it was trained on: it is found by
name, loads, ranks a gold passage above distractors, and a tampered card is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from repo_paths import TEST_DATA

from sieverag.inference.core.types import Document
from sieverag.inference.filters import adapter_store
from sieverag.inference.filters.adapter_files import CONFIG_FILE, WEIGHTS_FILE, AdapterError
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME, resolve_filter
from sieverag.inference.filters.card.card_file import CARD_FILE, read_card
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, EMBEDDED_MODELS

pytestmark = pytest.mark.integration

SHIPPED = adapter_store.SHIPPED_DIR / DEFAULT_FILTER_NAME
SAMPLE = TEST_DATA / "hotpotqa_sample.jsonl"


@pytest.fixture
def no_user_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty user cache for adapters, so a name can only mean the shipped filter."""
    monkeypatch.setattr(adapter_store, "adapters_dir", lambda: tmp_path / "adapters")


def test_the_shipped_filter_is_small_bf16_package_data_with_a_card():
    assert sorted(p.name for p in SHIPPED.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE,
                                                                CARD_FILE])
    assert (SHIPPED / WEIGHTS_FILE).stat().st_size <= 10 * 1024 * 1024
    config = json.loads((SHIPPED / CONFIG_FILE).read_text(encoding="utf-8"))
    assert config["base_model_name_or_path"] == EMBEDDED_MODELS[DEFAULT_MODEL].hub_name
    card = read_card(SHIPPED)
    assert card["base_model"] == DEFAULT_MODEL and len(card["base_model_sha256"]) == 64
    assert set(card["prompt_templates"]) == {"filter_chunk", "filter_sentence"}
    assert card["weights"]["dtype"] == "bfloat16"
    assert card["weights"]["p_yes_check"]["max_abs_diff_vs_float32"] <= 1e-2
    assert card["dataset"]["train_questions"] and card["dataset"]["fingerprint"]
    # MCF's default is the card's combination (its bar, min_keep, shift guard and top_k),
    # chosen leave-one-source-out: on each of its sources, left out of the fit, it kept at
    # least what the better of BM25's and dense's top-2 kept; a priors-only fit is beside it.
    assert MCFConfig().min_keep is None and MCFConfig().shift_guard
    combination = card["combination"]
    left_out = combination["fit"]["leave_one_source_out"]
    assert len(left_out) >= 5 and combination["shift_guard"] is not None
    assert all(row["default"]["margin"] >= 0 for row in left_out.values())
    assert combination["priors_only"]["weights"] and combination["priors_only"]["bar"]
    # The held-out eval-filter rows were measured before this fit: none is called the default.
    assert card["held_out"]["amber_default_row"] is None
    assert not any(row.startswith("MCF default") for row in card["held_out"]["chunk"])


def _passages() -> tuple[str, list[Document]]:
    """One gold passage and two distractors from the test data (in that order): the passage
    that names the song, the hard distractor about the same label, and another question's.
    (The question's other gold passage, the bridge entity "Love and Theft (duo)", which never
    names the song, scores below the hard distractor: P(Yes) 0.155 vs 0.191.)"""
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    first, second = rows
    by_title = {p["title"]: p for p in first["passages"] + second["passages"]}
    chosen = ["If You Ever Get Lonely", "Sarah Buxton", "National Treasure (film)"]
    return first["question"], [Document(id=t, title=t, text=by_title[t]["text"])
                               for t in chosen]


def test_the_shipped_filter_loads_on_the_embedded_model_and_ranks_gold_first(
        no_user_filters, embedded_model_dir):
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    folder = resolve_filter(DEFAULT_FILTER_NAME, DEFAULT_MODEL)
    assert folder == SHIPPED
    backend = HFBackend(HFBackendConfig(model=DEFAULT_MODEL, adapter=str(folder),
                                        device="cpu"))
    question, documents = _passages()
    scores = MultiGranularFilter(backend, MCFConfig(lexical_weight=0.0)).chunk_scores(
        question, documents)
    p_yes = [s["p_yes"] for s in scores]
    assert p_yes[0] > max(p_yes[1:]), p_yes


@pytest.mark.parametrize(("field", "value", "message"), [
    ("base_model_sha256", "00" * 32, "was trained on base model smollm2-135m-instruct "
                                     "\\(weights sha256 0000000000000000…\\), but the model"),
    ("prompt_templates", {"filter_chunk": "11" * 32},
     "trained with the prompt template filter_chunk \\(sha256 1111111111111111…\\)"),
])
def test_a_tampered_card_is_refused_with_the_clear_error(tmp_path, embedded_model_dir,
                                                         field, value, message):
    tampered = tmp_path / "tampered"
    shutil.copytree(SHIPPED, tampered)
    card = read_card(tampered)
    card[field] = value
    (tampered / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    with pytest.raises(AdapterError, match=message):
        resolve_filter(str(tampered), DEFAULT_MODEL)


def test_ask_answers_with_the_shipped_filter_and_traces_the_rounds(
        no_user_filters, embedded_model_dir, tmp_path, capsys):
    from sieverag.cli import main
    from sieverag.inference.retrieval.config import IndexConfig
    from sieverag.inference.retrieval.index_folder import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "title": "Liora Tamsin", "text": "Liora Tamsin was born in Quorrin in 1872."},
        {"id": "b", "title": "Penguins", "text": "Penguins huddle together in winter."},
        {"id": "c", "title": "Calder Bridge", "text": "The Calder Bridge opened in 1901."},
    ]), encoding="utf-8")
    index = tmp_path / "index"
    build_index(corpus, index, IndexConfig(dense=None), show_progress=False)
    assert main(["ask", "Where was Liora Tamsin born?", "--index", str(index), "--mode", "bm25",
                 "--models.generator.device", "cpu", "--models.filter.device", "cpu",
                 "--amber.max-iterations", "1", "--trace"]) == 0
    said = capsys.readouterr()
    shown = said.out
    assert shown.startswith("Answer: ")
    # What ranks is said first, once: the shipped card's fitted combination.
    assert said.err.count("MCF ranks by ") == 1
    # The shipped card's fit left the filter's score out: retrieval ranks, and it says so.
    assert "MCF ranks by BM25 + dense alone, the combination of" in said.err
    assert "left the filter's score out (it added +0.00" in said.err
    assert "Pipeline amber (filter mcf)" in shown
    assert "Round 1 — query: 'Where was Liora Tamsin born?'" in shown
    # The filter is not called for chunks (its score unused): P(relevant) of the priors.
    assert "no chunk is sent to the filter" in said.err
    assert "P(Yes)" not in shown and "filter s" not in shown
    # A round of 3 passages is unlike the card's fitting rounds (6 to 10): its score is not
    # called a calibrated probability there.
    assert "relevance 0." in shown and "(not calibrated here)" in shown
    assert "Liora Tamsin (a#0)" in shown
