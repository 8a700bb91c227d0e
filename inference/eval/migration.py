"""Run folders written before the trust metrics took the Auto-RAG study's names, read under
today's names (docs/compatibility.md): a record's trust metrics (`records.TrustMetrics`
applies `migrate_trust` to every line it reads) and a pipeline's summary.json figures
(`report.read_run_summary` applies `migrate_summary`).

Old name → new name, values unchanged:

* `faithfulness` (mean best cosine of the answer's sentences) → `sentence_similarity`;
* `hallucination_rate` (1 − sentence support rate) → `unsupported_sentence_rate`;
* `lexical_faithfulness` (share of the answer's content tokens read) → `faithfulness`;

and the study's `hallucination_rate`, 1 − faithfulness, is derived from the old
`lexical_faithfulness`. Only old data holds `lexical_faithfulness`, so it marks what to
migrate; anything else is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RENAMED = {"faithfulness": "sentence_similarity",
           "hallucination_rate": "unsupported_sentence_rate",
           "lexical_faithfulness": "faithfulness"}
OLD_MARK = "lexical_faithfulness"


def _renamed(values: Mapping[str, Any]) -> dict[str, Any]:
    return {RENAMED.get(key, key): value for key, value in values.items()}


def _complement(faithful: float | None) -> float | None:
    return None if faithful is None else 1.0 - faithful


def migrate_trust(values: Any) -> Any:
    """A record's trust metrics (a results line's `trust` object) under today's names, with
    `hallucination_rate` = 1 − faithfulness; any other value unchanged."""
    if not isinstance(values, Mapping) or OLD_MARK not in values:
        return values
    migrated = _renamed(values)
    migrated["hallucination_rate"] = _complement(migrated["faithfulness"])
    return migrated


def migrate_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's summary.json figures under today's names: the means (`hallucination_rate`
    = 1 − the mean faithfulness, rounded to 4 digits as means are), `trust_counts` (the
    hallucination rate covers faithfulness's answers) and `by_kind`, whose tables held no
    token faithfulness: there `faithfulness` and `hallucination_rate` are None."""
    if OLD_MARK not in summary:
        return dict(summary)
    migrated = _renamed(summary)
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
