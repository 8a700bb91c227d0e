"""Run folders written before two renames, read under today's names (docs/compatibility.md):
a record's trust metrics (`records.TrustMetrics` applies `migrate_trust` to every line it
reads) and a pipeline's summary.json figures (`report.read_run_summary` applies
`migrate_summary`). Values are never changed by a rename.

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

Anything else is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RENAMED = {"faithfulness": "sentence_similarity",
           "hallucination_rate": "unsupported_sentence_rate",
           "lexical_faithfulness": "faithfulness"}
OLD_MARK = "lexical_faithfulness"
# The grader's old names: a record's grades, a summary's invalid replies and mean per criterion.
GRADER_RENAMED = {"llm_judge": "llm_grader", "llm_judge_invalid": "grader_invalid",
                  **{f"llm_judge_{criterion}": f"grader_{criterion}"
                     for criterion in ("correctness", "relevance", "completeness",
                                       "evidence_grounding", "hallucination_risk", "overall")}}


def _renamed(values: Mapping[str, Any], table: Mapping[str, str] = RENAMED) -> dict[str, Any]:
    return {table.get(key, key): value for key, value in values.items()}


def _complement(faithful: float | None) -> float | None:
    return None if faithful is None else 1.0 - faithful


def migrate_trust(values: Any) -> Any:
    """A record's trust metrics (a results line's `trust` object) under today's names, with
    `hallucination_rate` = 1 − faithfulness; any other value unchanged."""
    if not isinstance(values, Mapping):
        return values
    migrated = _renamed(values, GRADER_RENAMED)
    if OLD_MARK not in migrated:
        return migrated
    migrated = _renamed(migrated)
    migrated["hallucination_rate"] = _complement(migrated["faithfulness"])
    return migrated


def migrate_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's summary.json figures under today's names: the grader's, the means
    (`hallucination_rate` = 1 − the mean faithfulness, rounded to 4 digits as means are),
    `trust_counts` (the hallucination rate covers faithfulness's answers) and `by_kind`, whose
    tables held no token faithfulness: there `faithfulness` and `hallucination_rate` are
    None."""
    graded = _renamed(summary, GRADER_RENAMED)
    if OLD_MARK not in graded:
        return graded
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
