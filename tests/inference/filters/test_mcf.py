"""MCF on the tiny model with a random LoRA adapter (scores = label log-probs, one batch per
stage), the sentence stage's parsing and ordering, the stack combinations, the registry."""

from __future__ import annotations

import pytest
from fake_backend import ScriptedBackend
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import validate_settings
from sieverag.inference.core.types import Document
from sieverag.inference.filters import (
    FilterSetup,
    MainRagJudge,
    MCFConfig,
    MultiGranularFilter,
    StackConfig,
    StackedFilter,
    build_filter,
)
from sieverag.inference.filters.filter_format import CHUNK_LABELS, chunk_prompt
from sieverag.inference.filters.stack import z_scores
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

DOCUMENTS = [
    Document(id="gold", title="Liora Tamsin", text="Liora Tamsin was born in Quorrin in 1848. "
             "She later worked as a cartographer. Her maps are kept in Ostmere.", is_gold=True),
    Document(id="noise", title="Penguins", text="Penguins huddle together in winter.",
             is_gold=False),
    Document(id="data-split", title="Bridge", text="ignored when sentences are given",
             sentences=("The Calder Bridge opened in 1901.", " It crosses a gorge.",
                        " Its engineer was Wren Ivers."), supporting_sentences=(0, 2)),
]


@pytest.fixture(scope="module")
def filter_backend(tiny_model_dir, adapter_dir):
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), adapter=str(adapter_dir),
                                     batch_size=2))


def test_chunk_scores_are_yes_minus_no_log_probs_of_the_adapter(filter_backend, tiny_model_dir):
    mcf = MultiGranularFilter(filter_backend, MCFConfig(bar="fixed", sentence_stage=False))
    before = filter_backend.meter.snapshot()
    result = mcf.select("Where was Liora Tamsin born?", DOCUMENTS)
    usage = filter_backend.meter.since(before)
    assert set(usage) == {"filter_chunk"} and usage["filter_chunk"].calls == 3
    manual = filter_backend.label_logprobs(
        [chunk_prompt("Where was Liora Tamsin born?", d.text, d.title) for d in DOCUMENTS],
        CHUNK_LABELS)
    expected = [lp["Yes"] - lp["No"] for lp in manual]
    assert [s.score for s in result.scored] == pytest.approx(expected, abs=1e-4)
    assert result.threshold == 0.0
    assert [s.kept for s in result.scored] == [e >= 0 for e in expected]
    assert [s.score for s in result.kept] == sorted((s.score for s in result.kept), reverse=True)
    # The adapter changes the scores: the base model alone gives others.
    base = HFBackend(HFBackendConfig(model=str(tiny_model_dir), batch_size=2))
    plain = MultiGranularFilter(base, MCFConfig(bar="fixed")).chunk_stage(
        "Where was Liora Tamsin born?", DOCUMENTS)
    assert [s.score for s in plain.scored] != pytest.approx(expected, abs=1e-3)


def test_adaptive_bar_keeps_scores_at_or_above_the_mean(filter_backend):
    result = MultiGranularFilter(filter_backend, MCFConfig(bar="adaptive", sentence_stage=False)
                                 ).select("Who engineered the Calder Bridge?", DOCUMENTS)
    scores = [s.score for s in result.scored]
    assert result.threshold == pytest.approx(sum(scores) / 3)
    assert {s.document.id for s in result.kept} == {
        s.document.id for s in result.scored if s.score >= result.threshold}


def test_top_k_bar_keeps_the_k_best_chunks(filter_backend):
    result = MultiGranularFilter(filter_backend, MCFConfig(bar="top_k", top_k=2,
                                                           sentence_stage=False)
                                 ).select("Who engineered the Calder Bridge?", DOCUMENTS)
    ranked = sorted(result.scored, key=lambda s: -s.score)
    assert [s.document.id for s in result.kept] == [s.document.id for s in ranked[:2]]
    assert result.threshold == ranked[1].score
    # More k than chunks keeps them all.
    every = MultiGranularFilter(filter_backend, MCFConfig(bar="top_k", top_k=5,
                                                          sentence_stage=False)
                                ).chunk_stage("Who engineered the Calder Bridge?", DOCUMENTS)
    assert len(every.kept) == 3
    with pytest.raises(ConfigError, match="mcf.top_k"):
        MCFConfig(bar="top_k", top_k=0)


def test_lexical_prior_fuses_z_scores_of_filter_and_bm25(filter_backend):
    from sieverag.inference.filters.document_filter import z_scores
    from sieverag.inference.retrieval.bm25 import question_scores

    question = "Who engineered the Calder Bridge?"
    alone = MultiGranularFilter(filter_backend, MCFConfig(bar="top_k", lexical_weight=0.0)
                                ).chunk_stage(question, DOCUMENTS)
    fused = MultiGranularFilter(filter_backend, MCFConfig(bar="top_k", lexical_weight=0.5,
                                                          sentence_stage=False)
                                ).chunk_stage(question, DOCUMENTS)
    bm25 = question_scores(question, [d.as_context() for d in DOCUMENTS])
    expected = [f + 0.5 * b for f, b in zip(z_scores([s.score for s in alone.scored]),
                                            z_scores(bm25), strict=True)]
    assert [s.score for s in fused.scored] == pytest.approx(expected, abs=1e-6)
    assert [s.details["bm25"] for s in fused.scored] == pytest.approx(bm25, abs=1e-3)
    assert [s.details["filter_score"] for s in fused.scored] == pytest.approx(
        [s.score for s in alone.scored], abs=1e-3)
    assert len(fused.kept) == 2
    with pytest.raises(ConfigError, match="lexical_weight needs bar"):
        MCFConfig(bar="fixed", lexical_weight=1.0)
    with pytest.raises(ConfigError, match="lexical_weight must be"):
        MCFConfig(bar="top_k", lexical_weight=-1)


def test_both_stages_on_the_adapter_record_every_sentence_decision(filter_backend):
    mcf = MultiGranularFilter(filter_backend, MCFConfig(bar="fixed", threshold=-1e9,
                                                        sentence_stage=True))  # keep all
    before = filter_backend.meter.snapshot()
    result = mcf.select("Who engineered the Calder Bridge?", DOCUMENTS)
    usage = filter_backend.meter.since(before)
    # One chunk-stage batch over 3 chunks; the sentence stage asks only multi-sentence chunks.
    assert usage["filter_chunk"].calls == 3 and usage["filter_sentence"].calls == 2
    statuses = {s.document.id: s.details["sentence_status"] for s in result.scored}
    assert statuses["noise"] == "single"
    assert {statuses["gold"], statuses["data-split"]} <= {"parsed", "unparsed", "none"}
    for scored in result.kept:
        assert scored.document.id in {d.id for d in DOCUMENTS}
        assert scored.details["key_sentences"] == sorted(scored.details["key_sentences"])


def scripted(reply: str, yes: dict[str, float] | None = None) -> ScriptedBackend:
    yes = yes or {}
    return ScriptedBackend(
        reply=lambda text: reply,
        labels=lambda text: {"Yes": next((v for k, v in yes.items() if k in text), 0.0),
                             "No": -1.0})


def test_sentence_stage_keeps_key_sentences_in_original_order_with_ids_and_gold():
    backend = scripted("1, 3")
    result = MultiGranularFilter(backend, MCFConfig(sentence_stage=True)).select(
        "Who engineered it?", DOCUMENTS[2:])
    (kept,) = result.kept
    assert kept.document.id == "data-split"
    assert kept.document.text == "The Calder Bridge opened in 1901. Its engineer was Wren Ivers."
    assert kept.document.sentences == ("The Calder Bridge opened in 1901.",
                                       "Its engineer was Wren Ivers.")
    assert kept.document.supporting_sentences == (0, 1)  # renumbered within the kept ones
    assert kept.details["key_sentences"] == [0, 2]
    assert kept.details["sentence_status"] == "parsed"
    # The sentences were the data's own split, numbered in the prompt.
    sentence_prompts = [text for agent, text in backend.calls if agent == "filter_sentence"]
    assert "[2] It crosses a gorge." in sentence_prompts[0]


def test_blank_sentences_are_not_numbered_and_gold_follows_the_data_split():
    from sieverag.inference.filters.mcf import document_sentences, source_positions

    document = Document(id="d", title="Bridge", text="unused",
                        sentences=("It opened in 1901.", "  ", "Wren Ivers built it.",
                                   "It is red."), supporting_sentences=(2,))
    assert document_sentences(document) == ["It opened in 1901.", "Wren Ivers built it.",
                                             "It is red."]
    assert source_positions(document) == [0, 2, 3]
    backend = scripted("2")
    result = MultiGranularFilter(backend, MCFConfig(sentence_stage=True)).select(
        "Who built it?", [document])
    (kept,) = result.kept
    assert kept.details["key_sentences"] == [1]  # the number the filter named, 0-based
    assert kept.document.sentences == ("Wren Ivers built it.",)
    assert kept.document.supporting_sentences == (0,)  # gold index 2 of the data's split
    (prompt,) = [text for agent, text in backend.calls if agent == "filter_sentence"]
    assert "[2] Wren Ivers built it." in prompt and "[4]" not in prompt


@pytest.mark.parametrize(("reply", "setting", "status", "kept_text"), [
    ("3, 1", "keep_chunk", "unparsed", "whole"),
    ("sentence two", "drop_chunk", "unparsed", "whole"),
    ("none", "keep_chunk", "none", "whole"),
    ("none", "drop_chunk", "none_dropped", None),
    ("2", "keep_chunk", "parsed", "She later worked as a cartographer."),
])
def test_sentence_replies_that_do_not_name_sentences(reply, setting, status, kept_text):
    mcf = MultiGranularFilter(scripted(reply), MCFConfig(empty_sentence_answer=setting,
                                                          sentence_stage=True))
    result = mcf.select("Where was she born?", DOCUMENTS[:1])
    (scored,) = result.scored
    assert scored.details["sentence_status"] == status
    assert scored.details["sentence_reply"] == reply
    if kept_text is None:
        assert result.kept == () and not scored.kept
    else:
        (kept,) = result.kept
        # Without a data split the text is split with split_sentences.
        assert kept.document.text == (DOCUMENTS[0].text if kept_text == "whole" else kept_text)


def test_z_scores():
    assert z_scores([1.0, 3.0]) == [-1.0, 1.0]
    assert z_scores([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("combine", "kept"), [
    ("both", {"alpha"}),
    ("either", {"alpha", "beta", "gamma"}),
    ("zmean", {"alpha", "beta"}),
])
def test_stack_combinations(combine, kept):
    documents = [Document(id=i, text=f"text {i}") for i in ("alpha", "beta", "gamma", "delta")]
    # MCF keeps alpha and beta (s >= 0); the judge keeps alpha and gamma (r >= mean r); the
    # mean z-scores are about 1.42, 0.17, -0.49 and -1.09.
    mcf = MultiGranularFilter(scripted("1", {"alpha": 3.0, "beta": 0.0, "gamma": -4.0,
                                             "delta": -3.0}),
                              MCFConfig(bar="fixed", sentence_stage=True))
    judge = MainRagJudge(scripted("pred", {"alpha": 2.0, "beta": 0.0, "gamma": 0.2,
                                           "delta": -2.0}))
    result = StackedFilter(mcf, judge, StackConfig(combine=combine)).select("q?", documents)
    assert {s.document.id for s in result.kept} == kept
    by_id = {s.document.id: s for s in result.scored}
    assert by_id["alpha"].details["mcf_kept"] and by_id["alpha"].details["judge_kept"]
    assert by_id["beta"].details["mcf_kept"] and not by_id["beta"].details["judge_kept"]
    assert by_id["alpha"].details["mcf_score"] == pytest.approx(4.0)
    assert by_id["alpha"].details["predicted_answer"] == "pred"
    assert [s.score for s in result.kept] == sorted((s.score for s in result.kept), reverse=True)
    assert result.threshold == (0.0 if combine == "zmean" else None)


def test_registry_builds_filters_by_name_and_explains_a_missing_trained_filter():
    backend = scripted("x")
    assert build_filter("none", FilterSetup(judge_backend=backend)).name == "none"
    assert build_filter("judge", FilterSetup(judge_backend=backend)).name == "judge"
    setup = FilterSetup(judge_backend=backend, mcf_backend=backend)
    assert build_filter("mcf", setup).name == "mcf"
    assert build_filter("stack", setup).name == "stack"
    with pytest.raises(ConfigError, match="needs the trained filter.*--models.filter.adapter"):
        build_filter("stack", FilterSetup(judge_backend=backend))
    with pytest.raises(ConfigError, match="unknown filter 'magic'"):
        build_filter("magic", setup)
    # A bad choice is refused when the settings are read, naming the field.
    with pytest.raises(ConfigError, match="bar: Input should be 'calibrated', 'top_k', 'fixed' or"):
        validate_settings(MCFConfig, {"bar": "mean"}, "test")
    with pytest.raises(ConfigError, match="combine: Input should be 'both', 'either' or"):
        validate_settings(StackConfig, {"combine": "all"}, "test")
