"""Run folders written before three renames and a redefinition, read under today's names
(docs/compatibility.md): a record's trust metrics (`result_records.TrustMetrics` applies
`migrate_trust` to every line it reads) and a pipeline's summary.json figures
(`report.read_run_summary` applies `migrate_summary`). Values are never changed by a rename.

The trust metrics took the Auto-RAG study's names (`RENAMED`):

* `faithfulness` (mean best cosine of the answer's sentences) → `sentence_similarity`;
* `hallucination_rate` (1 − sentence support rate) → `unsupported_sentence_rate`;
* `lexical_faithfulness` (share of the answer's content tokens read) → `faithfulness`;

and the study's `hallucination_rate`, 1 − faithfulness, is derived from the old
`lexical_faithfulness`. Only data that old holds `lexical_faithfulness`, so it marks what to
migrate.

The answer-grading LLM, once "the LLM judge", is the grader ("judge" names the MAIN-RAG
judge): a record's `llm_judge` grades are `llm_grader`, a summary's `llm_judge_<criterion>`
and `llm_judge_invalid` are `grader_<criterion>` and `grader_invalid` (`GRADER_RENAMED`).
No key of today's holds an old grader name, so these are renamed wherever they appear.

TAAS took the study's definition (`trust.taas`): what was written as `taas` before is the
sentence score, `sentence_taas`. A record written without `sentence_taas` gets it from its
`taas`, and its TAAS is computed from its stored AQS, faithfulness and hallucination rate; a
summary's mean TAAS cannot be recomputed from means, so there it is None (`sieverag report`
on the records gives it).

The study's context precision, evidence noise and sentence support rate took its definitions
(token-level context precision, evidence noise read from it, support by whole retrieved
chunks): what was written under those names before is sieverag's own sentence-cosine measures
(`SENTENCE_RENAMED`): `context_precision` → `sentence_context_precision`, `evidence_noise` →
`sentence_evidence_noise`, `sentence_support_rate` → `sentence_support_by_sentence`. Data
written without `sentence_context_precision` is that old. A record's study context precision
and evidence noise are computed from its stored answer and the text it read (`contexts`, what
the metrics read; `migrate_record`); its sentence support rate needs the encoder, so it is
None, as are a summary's three means (not recomputed from means; counted for no answer).

Anything else is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sieverag.inference.metrics.trust import context_precision, evidence_noise, taas

RENAMED = {"faithfulness": "sentence_similarity",
           "hallucination_rate": "unsupported_sentence_rate",
           "lexical_faithfulness": "faithfulness"}
OLD_MARK = "lexical_faithfulness"
SENTENCE_RENAMED = {"context_precision": "sentence_context_precision",
                    "evidence_noise": "sentence_evidence_noise",
                    "sentence_support_rate": "sentence_support_by_sentence"}
SENTENCE_MARK = "sentence_context_precision"
# The grader's old names: a record's grades, a summary's invalid replies and mean per criterion.
GRADER_RENAMED = {"llm_judge": "llm_grader", "llm_judge_invalid": "grader_invalid",
                  **{f"llm_judge_{criterion}": f"grader_{criterion}"
                     for criterion in ("correctness", "relevance", "completeness",
                                       "evidence_grounding", "hallucination_risk", "overall")}}


def _renamed(values: Mapping[str, Any], table: Mapping[str, str] = RENAMED) -> dict[str, Any]:
    return {table.get(key, key): value for key, value in values.items()}


def _complement(faithful: float | None) -> float | None:
    return None if faithful is None else 1.0 - faithful


def _study_taas(trust: dict[str, Any]) -> dict[str, Any]:
    """A record's trust written before TAAS took the study's definition: its `taas` (the
    sentence score) is `sentence_taas`, and TAAS is computed from its stored terms."""
    if "taas" not in trust or "sentence_taas" in trust:
        return trust
    return {**trust, "sentence_taas": trust["taas"],
            "taas": taas(trust.get("answer_quality"), bool(trust.get("retrieved", True)),
                         faithfulness=trust.get("faithfulness"),
                         hallucination_rate=trust.get("hallucination_rate"))}


def _study_evidence(values: dict[str, Any]) -> dict[str, Any]:
    """Trust figures written before the study's context precision, evidence noise and
    sentence support rate: the old values under sieverag's own names, the study's None."""
    if "context_precision" not in values or SENTENCE_MARK in values:
        return values
    return {**_renamed(values, SENTENCE_RENAMED), **dict.fromkeys(SENTENCE_RENAMED)}


def migrate_trust(values: Any) -> Any:
    """A record's trust metrics (a results line's `trust` object) under today's names, with
    `hallucination_rate` = 1 − faithfulness and the study's TAAS; any other value
    unchanged."""
    if not isinstance(values, Mapping):
        return values
    migrated = _renamed(values, GRADER_RENAMED)
    if OLD_MARK in migrated:
        migrated = _renamed(migrated)
        migrated["hallucination_rate"] = _complement(migrated["faithfulness"])
    return _study_evidence(_study_taas(migrated))


def migrate_record(values: Any) -> Any:
    """A results line whose trust was written before the study's context precision
    (`_study_evidence`): its trust under today's names, with the study's context precision and
    evidence noise computed from the answer scored and the text read, where the line keeps
    that text for every document read; any other value unchanged."""
    if not isinstance(values, Mapping) or not isinstance(values.get("trust"), Mapping):
        return values
    trust = values["trust"]
    if "context_precision" not in trust or SENTENCE_MARK in trust:
        return values
    migrated = migrate_trust(trust)
    contexts, read = values.get("contexts"), values.get("documents_read")
    if (migrated.get("retrieved", True) and isinstance(contexts, list) and contexts
            and isinstance(read, list) and len(contexts) == len(read)):
        answer = str(values.get("prediction", ""))
        migrated["context_precision"] = context_precision(answer, contexts)
        migrated["evidence_noise"] = evidence_noise(answer, contexts)
    return {**values, "trust": migrated}


def migrate_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's summary.json figures under today's names: the grader's, the means
    (`hallucination_rate` = 1 − the mean faithfulness, rounded to 4 digits as means are),
    `trust_counts` (the hallucination rate covers faithfulness's answers) and `by_kind`, whose
    tables held no token faithfulness: there `faithfulness` and `hallucination_rate` are
    None."""
    graded = _renamed(summary, GRADER_RENAMED)
    return _summary_evidence(_summary_taas(_summary_names(summary, graded)
                                           if OLD_MARK in graded else graded))


def _summary_evidence(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary written before the study's context precision, evidence noise and sentence
    support rate (`_study_evidence`): the old means under sieverag's own names, the study's
    None and counted for no answer; the per-kind tables' context precision None."""
    if "context_precision" not in summary or SENTENCE_MARK in summary:
        return summary
    migrated = _study_evidence(summary)
    if isinstance(summary.get("trust_counts"), Mapping):
        migrated["trust_counts"] = {**_renamed(summary["trust_counts"], SENTENCE_RENAMED),
                                    **dict.fromkeys(SENTENCE_RENAMED, 0)}
    if isinstance(summary.get("by_kind"), Mapping):
        migrated["by_kind"] = {kind: _study_evidence(dict(figures))
                               for kind, figures in summary["by_kind"].items()}
    return migrated


def _summary_taas(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary written before TAAS took the study's definition: its mean `taas` was the
    sentence score (now `sentence_taas`); the study's mean cannot be recomputed from means, so
    it is None, in the per-kind tables too, and counted for no answer."""
    if "taas" not in summary or "sentence_taas" in summary:
        return summary
    migrated = {**summary, "sentence_taas": summary["taas"], "taas": None}
    if isinstance(summary.get("trust_counts"), Mapping):
        counts = summary["trust_counts"]
        migrated["trust_counts"] = {**counts, "sentence_taas": counts.get("taas"), "taas": 0}
    if isinstance(summary.get("by_kind"), Mapping):
        migrated["by_kind"] = {kind: {**figures, "taas": None}
                               for kind, figures in summary["by_kind"].items()}
    return migrated


def _summary_names(summary: Mapping[str, Any], graded: Mapping[str, Any]) -> dict[str, Any]:
    """The trust metrics' renames in a summary written before them."""
    migrated = _renamed(graded)
    hallucinated = _complement(migrated["faithfulness"])
    migrated["hallucination_rate"] = None if hallucinated is None else round(hallucinated, 4)
    if isinstance(summary.get("trust_counts"), Mapping):
        counts = _renamed(summary["trust_counts"])
        counts["hallucination_rate"] = counts.get("faithfulness")
        migrated["trust_counts"] = counts
    if isinstance(summary.get("by_kind"), Mapping):
        migrated["by_kind"] = {kind: {**_renamed(figures), "faithfulness": None,
                                      "hallucination_rate": None}
                               for kind, figures in summary["by_kind"].items()}
    return migrated
