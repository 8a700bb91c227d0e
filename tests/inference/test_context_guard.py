"""The context guard (inference/llm/context_guard.py) on the hf backend and the tiny model: a prompt
over the context is cut in its documents only (or refused, as configured), the record counts
the cut, and a prompt that fits runs exactly as before."""

from __future__ import annotations

import pickle

import pytest

from sieverag.data_gen.cxmi import BatchedCXMI, SharedPrefixCXMI
from sieverag.inference.core.errors import ConfigError, ContextError
from sieverag.inference.core.prompt_templates import TemplateText, load_template
from sieverag.inference.core.types import Document, Example
from sieverag.inference.eval.result_records import build_record
from sieverag.inference.eval.summary import summarize
from sieverag.inference.filters.judge import MainRagJudge
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.llm.context_guard import TRUNCATION_MARKER
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig
from sieverag.inference.pipelines import PipelineContext, build_pipeline
from sieverag.inference.pipelines.pipeline_registry import format_documents

CONTEXT = 256
QUESTION = "Which river flows through the city of Cairo in Egypt?"
FILLER = "The delta of the great river spreads into many branches near the northern coast. "
DOCUMENTS = tuple(Document(id=f"d{i}", title=f"Doc {i}", text=FILLER * 8) for i in range(4))
EXAMPLE = Example(id="q1", question=QUESTION, answers=("Nile",), documents=DOCUMENTS)
SETTINGS = GenerationSettings(max_new_tokens=8)


def guarded(tiny_model_dir, **config) -> HFBackend:
    return HFBackend(HFBackendConfig(model=str(tiny_model_dir), context_length=CONTEXT,
                                     **config))


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> HFBackend:
    return guarded(tiny_model_dir)


def reader_prompt(documents: str = format_documents(DOCUMENTS)):
    return load_template("answer_with_documents").messages(question=QUESTION,
                                                            documents=documents)


def test_a_prompt_that_fits_runs_byte_for_byte_as_before(tiny_model_dir):
    plain = HFBackend(HFBackendConfig(model=str(tiny_model_dir)))  # the model's own 1024
    prompt = reader_prompt()
    (fitted,) = plain.fit([prompt], SETTINGS.max_new_tokens, agent="generator")
    assert fitted.conversation is prompt and fitted.tokens_dropped == 0
    assert fitted.text == plain.render(prompt) and fitted.ids == plain.prompt_ids(prompt)
    plain.generate([prompt], SETTINGS)
    usage = plain.meter.snapshot()["generator"]
    assert (usage.truncated_prompts, usage.tokens_dropped) == (0, 0)
    assert usage.prompt_tokens == len(fitted.ids)


def test_a_reader_prompt_over_the_context_loses_only_the_end_of_its_documents(backend):
    prompt = reader_prompt()
    full = len(backend.prompt_ids(prompt))
    assert full > CONTEXT
    (fitted,) = backend.fit([prompt], SETTINGS.max_new_tokens, agent="generator")
    assert len(fitted.ids) + SETTINGS.max_new_tokens <= CONTEXT
    assert fitted.tokens_dropped == full - len(fitted.ids) > 0
    system, user = (message["content"] for message in fitted.conversation)
    assert system == prompt[0]["content"]  # the instruction, whole
    assert user.count(f"Question: {QUESTION}") == 2  # the question, both times, whole
    documents = user.values["documents"]
    assert documents.endswith(TRUNCATION_MARKER)
    assert format_documents(DOCUMENTS).startswith(documents.removesuffix(TRUNCATION_MARKER))
    # The first-ranked documents are kept, the last ones go.
    assert documents.startswith("[1] Doc 0\n") and "[4] Doc 3" not in documents
    # The same prompt is always cut the same way (the prompt cache matches exact prefixes).
    assert backend.fit([prompt], SETTINGS.max_new_tokens, agent="generator") == [fitted]


def test_vanilla_over_the_context_answers_and_its_record_says_it_was_cut(backend):
    before = backend.meter.snapshot()
    context = PipelineContext(generator=backend, judge_backend=backend, generation=SETTINGS)
    output = build_pipeline("vanilla", context).run(EXAMPLE)
    usage = backend.meter.since(before)
    assert usage["generator"].completion_tokens > 0  # the model wrote an answer
    assert 0 < usage["generator"].prompt_tokens <= CONTEXT - SETTINGS.max_new_tokens
    record = build_record(EXAMPLE, output, usage, 0.5).to_json()
    dropped = usage["generator"].tokens_dropped
    assert dropped > 0
    assert (record["truncated_prompts"], record["tokens_dropped"]) == (1, dropped)
    assert record["usage"]["generator"]["truncated_prompts"] == 1
    assert record["usage"]["generator"]["tokens_dropped"] == dropped
    fitting = build_record(EXAMPLE, output, {}, 0.5)
    assert "truncated_prompts" not in fitting.to_json()  # only present when a prompt was cut
    summary = summarize([build_record(EXAMPLE, output, usage, 0.5), fitting])
    assert summary["truncated_rate"] == 0.5
    assert summary["tokens_dropped_per_question"] == dropped / 2


def test_error_setting_refuses_the_prompt_naming_agent_and_sizes(tiny_model_dir):
    strict = guarded(tiny_model_dir, context_overflow="error")
    prompt = reader_prompt()
    length = len(strict.prompt_ids(prompt))
    with pytest.raises(ContextError) as refused:
        strict.generate([prompt], SETTINGS, agent="generator")
    message = str(refused.value)
    assert "'generator'" in message and f"{length:,} tokens" in message
    assert f"context of {CONTEXT} tokens" in message and "8 new tokens" in message
    assert "context_overflow" in message
    assert not strict.meter.snapshot()  # nothing ran


def test_documents_are_cut_before_the_memory_notes(backend):
    template = load_template("amber_answer")
    memory, evidence = "The Nile flows north through Cairo. " * 4, FILLER * 30
    (fitted,) = backend.fit([template.messages(question=QUESTION, memory=memory,
                                               evidence=evidence)], 8, agent="generator")
    user = fitted.conversation[-1]["content"]
    assert user.values["memory"] == memory
    assert user.values["evidence"].endswith(TRUNCATION_MARKER)
    # Evidence too short to make room: it goes, then the notes lose their end.
    (fitted,) = backend.fit([template.messages(question=QUESTION, memory=FILLER * 30,
                                               evidence="Cairo is in Egypt.")], 8,
                            agent="generator")
    user = fitted.conversation[-1]["content"]
    assert user.values["evidence"] == TRUNCATION_MARKER.strip()
    assert user.values["memory"].endswith(TRUNCATION_MARKER)
    assert len(fitted.ids) + 8 <= CONTEXT


def test_a_prompt_without_documents_to_cut_is_refused_even_when_truncating(backend):
    too_long = [{"role": "user", "content": FILLER * 30}]  # not rendered from a template
    with pytest.raises(ContextError, match="'router' .* no documents to cut"):
        backend.generate([too_long], SETTINGS, agent="router")
    long_question = load_template("answer_with_documents").messages(
        question=FILLER * 30, documents="short")
    with pytest.raises(ContextError, match="cut to nothing it is still"):
        backend.generate([long_question], SETTINGS)


def test_a_multi_megabyte_passage_is_cut_before_the_model_sees_it(backend):
    huge = "word " * 400_000  # 2 MB
    (fitted,) = backend.fit([reader_prompt(huge)], 8, agent="generator")
    assert len(fitted.ids) + 8 <= CONTEXT
    assert fitted.tokens_dropped > 300_000


def test_scoring_calls_leave_room_for_their_label_and_continuation(backend):
    judge = load_template("judge_predictor").messages(question=QUESTION,
                                                      document=FILLER * 30)
    before = backend.meter.snapshot()
    (scores,) = backend.label_logprobs([judge], ["Yes", "No"], agent="judge")
    assert set(scores) == {"Yes", "No"}
    reply = "The Nile river"
    (logprob,) = backend.continuation_logprob([judge], [reply], agent="cxmi")
    assert logprob < 0
    usage = backend.meter.since(before)
    assert usage["judge"].truncated_prompts == usage["cxmi"].truncated_prompts == 1
    assert usage["judge"].prompt_tokens <= CONTEXT - 1
    assert usage["cxmi"].prompt_tokens <= CONTEXT  # prompt and reply tokens together


def test_the_judge_over_the_context_scores_the_same_with_and_without_the_prompt_cache(
        backend, tiny_model_dir):
    uncached = guarded(tiny_model_dir, prompt_cache_tokens=0)
    documents = [Document(id="long", text=FILLER * 30), Document(id="short", text="Cairo.")]
    cached_result = MainRagJudge(backend).select(QUESTION, documents)
    plain_result = MainRagJudge(uncached).select(QUESTION, documents)
    for mine, reference in zip(cached_result.scored, plain_result.scored, strict=True):
        assert mine.score == pytest.approx(reference.score, abs=1e-4)
    assert uncached.meter.snapshot()["judge"].truncated_prompts == 1


def test_cxmi_labelling_cuts_its_contexts_through_the_same_guard(backend):
    contexts = ["The Nile flows through Cairo.", FILLER * 30]
    shared = SharedPrefixCXMI(backend).score(QUESTION, ["Nile"], contexts)
    batched = BatchedCXMI(backend).score(QUESTION, ["Nile"], contexts)
    for mine, reference in zip(shared, batched, strict=True):
        assert mine.score == pytest.approx(reference.score, abs=1e-4)
    assert backend.meter.snapshot()["cxmi"].truncated_prompts >= 2


def test_template_text_is_a_plain_string_that_can_render_again():
    prompt = reader_prompt("one document")
    text = prompt[1]["content"]
    assert isinstance(text, TemplateText) and str.__eq__(text, text.template.format(
        question=QUESTION, documents="one document"))
    assert text.with_values(documents="other") == text.replace("one document", "other")
    assert pickle.loads(pickle.dumps(text)).values == text.values


@pytest.mark.parametrize(("settings", "named"), [
    ({"context_overflow": "drop"}, "context_overflow"),
    ({"context_length": 0}, "context_length"),
    ({"endpoint": "http://127.0.0.1:1/v1", "model": "m", "context_length": 512},
     "chat_template_model"),
])
def test_bad_context_settings_name_the_field(settings, named):
    with pytest.raises(ConfigError, match=named):
        BackendSpec(**settings)
