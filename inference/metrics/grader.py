"""The Auto-RAG study's LLM-as-a-judge, here the grader (not the MAIN-RAG judge, which scores
documents): six 1-5 criteria as strict JSON, its prompts (`answer_grader`,
`answer_grader_no_context`), the strict parsing of a reply, and grading many answers in one
batch."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import parse_json
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.types import Document
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend

Evidence = Document | str

GRADER_CRITERIA = ("correctness", "relevance", "completeness", "evidence_grounding",
                  "hallucination_risk", "overall")
# Scales of the study: every criterion 1 (worst) to 5 (best) except hallucination risk,
# where 1 is the lowest risk — lower is better there.
LOWER_IS_BETTER = frozenset({"hallucination_risk"})
# Grounding in evidence is not applicable to an answer given without retrieval.
GROUNDING_CRITERIA = frozenset({"evidence_grounding"})
GRADER_PROMPT = "answer_grader"
GRADER_PROMPT_NO_CONTEXT = "answer_grader_no_context"
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class GraderVerdict:
    """Six 1–5 scores as the study defines them: higher is better except for
    `hallucination_risk` (1 = no invented content, 5 = mostly invented); `evidence_grounding`
    is None for an answer given without retrieval (not applicable).

    When the reply is not a valid verdict every score is None and `error` says why;
    `raw` keeps the reply either way.
    """

    correctness: int | None = None
    relevance: int | None = None
    completeness: int | None = None
    evidence_grounding: int | None = None
    hallucination_risk: int | None = None
    overall: int | None = None
    error: str | None = None
    raw: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def scores(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in GRADER_CRITERIA}


def grader_criteria(retrieved: bool) -> tuple[str, ...]:
    """The criteria asked of an answer: all six with retrieval, no grounding without."""
    return tuple(c for c in GRADER_CRITERIA if retrieved or c not in GROUNDING_CRITERIA)


def parse_grader_reply(reply: str, retrieved: bool = True) -> GraderVerdict:
    """Parse a grader reply strictly: one JSON object (surrounding text and code fences are
    ignored) holding every criterion asked (`grader_criteria(retrieved)`) as an integer 1–5;
    other keys are ignored (a grounding score given without retrieval too)."""
    match = _JSON_OBJECT.search(reply)
    if match is None:
        return GraderVerdict(error="no JSON object in the reply", raw=reply)
    try:  # any text json cannot read (syntax, huge numbers, deep nesting) is a bad reply
        payload: Any = parse_json(match.group(), "the reply")
    except DatasetError as error:
        return GraderVerdict(error=str(error), raw=reply)
    if not isinstance(payload, dict):
        return GraderVerdict(error="the JSON is not an object", raw=reply)
    asked = grader_criteria(retrieved)
    missing = [name for name in asked if name not in payload]
    if missing:
        return GraderVerdict(error=f"missing score(s): {', '.join(missing)}", raw=reply)
    invalid = [name for name in asked
               if type(payload[name]) is not int or not 1 <= payload[name] <= 5]
    if invalid:
        return GraderVerdict(error=f"score(s) not an integer 1-5: {', '.join(invalid)}",
                            raw=reply)
    return GraderVerdict(**{name: payload[name] for name in asked}, raw=reply)


def _format_documents(documents: Sequence[Evidence]) -> str:
    return "\n\n".join(f"[{i}] {d if isinstance(d, str) else d.as_context()}"
                       for i, d in enumerate(documents, start=1))


@dataclass(frozen=True)
class GraderItem:
    """One answer to grade: its question, the reference answer and what the generator read
    (empty: answered without retrieval)."""

    question: str
    answer: str
    reference: str
    documents: Sequence[Evidence] = ()


def grade_answers(backend: LLMBackend, items: Sequence[GraderItem],
                 settings: GenerationSettings = GenerationSettings(max_new_tokens=128)
                 ) -> list[GraderVerdict]:
    """Grade many answers in one batch (see `GraderVerdict`). An answer given without
    retrieval is asked the five criteria that apply (prompt `answer_grader_no_context`).
    An invalid reply yields None scores with the reason in `error`, never an exception;
    backend failures (a server that is down) propagate as the backend raises them."""
    with_context = load_template(GRADER_PROMPT)
    without = load_template(GRADER_PROMPT_NO_CONTEXT)
    prompts = [with_context.messages(question=i.question, answer=i.answer,
                                     reference=i.reference,
                                     documents=_format_documents(i.documents))
               if i.documents else
               without.messages(question=i.question, answer=i.answer, reference=i.reference)
               for i in items]
    replies = backend.generate(prompts, settings, agent="grader") if prompts else []
    return [parse_grader_reply(reply, bool(item.documents))
            for reply, item in zip(replies, items, strict=True)]
