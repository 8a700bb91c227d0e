"""`amber`: Amber's iterative memory loop (arXiv 2504.05312) — retrieve → filter (MCF, the
judge, both, or none) → memory update (AMU) → is the memory enough? (AIC) → next query …
→ answer from the memory.

Each round:
1. Documents: the top `amber.k` documents for the round's query that no earlier round saw
   (seen documents are never filtered again). With an index (`context.search`) they come from
   its search; otherwise the question's given documents are a small pool ranked by a BM25
   built over them for this question (ties in the given order). Round 1's query is the
   question.
2. Filter: the round's documents through the filter stage, whose prompts read the question
   as every agent does (multiple-choice options listed; the queries are the plain question);
   kept documents (MCF: narrowed to their key sentences) join the evidence, in the filter's
   reading order.
3. AMU (`memory`) revises the memory with the new evidence (skipped
   when nothing new was kept, and in the last round when the answer reads the evidence alone).
   The adaptive loop (`amber.adaptive`, the default) decides here first: when the kept
   evidence (every round's so far) is strong enough — its strength under
   `amber.evidence_signal`, the best (or the sum) of MCF's calibrated P(relevant) of the kept
   chunks, reaches `amber.answer_at` — it answers now from that evidence (`strong_evidence`),
   with no memory agent and no collector; otherwise it runs the memory agents and the
   collector's next query, the evidence signal standing in for the sufficiency prompt. The
   round's trace says which branch it took and why (`branch`). A filter that gives no
   calibrated P(relevant) (the judge, `none`) runs the paper's loop, with a warning.
4. Stop when the round added nothing (no new evidence, memory unchanged: `no_progress`), at
   `max_iterations` (`max_iterations`), when the question's given pool has no unseen
   document left (`pool_exhausted`: e.g. `k` ≥ the given documents, so round 1 filters them
   all), or when the AIC (`collector`) finds the memory sufficient
   (`sufficient`); otherwise the AIC writes the next query, and the loop stops when it has no
   new one (`no_new_query`).

The answer is one generator call (agent `generator`) on the memory and, by default, the kept
evidence (`amber.answer_from`: also the memory alone, or the evidence alone); when fewer
than `amber.min_evidence` chunks were kept, the best-scored dropped ones are read too (a weak
filter or a strict bar must not leave the answer blind); with nothing to read it answers
directly. `documents_read` is the kept evidence (key sentences only).
The trace (`loop_trace.AmberTrace`, dumped to JSON-ready data) holds every round: query,
documents, scores and sentence choices, the three memory agents' replies, the memory after the
round, the sufficiency verdict, the next query, and the stop reason. `amber-mcf`,
`amber-judge`, `amber-stack` and `amber-none` are `amber` with the filter fixed, so one run can
compare them; `amber-paper` is the paper's loop whatever the run's `amber` and `mcf` sections
say (`config.paper_amber`, `config.paper_mcf`: the sufficiency check and the memory agents
every round, the answer from the memory, MCF on chunks then sentences; the `amber-paper` preset
sets the same); `amber-no-amu`
and `amber-no-aic` are `amber` with the memory agents or the collector switched off
(`amber.amu`, `amber.aic`), so one run gives the paper's ablation table
(-MCF is `amber-none`). Without the AMU the memory is the kept evidence itself; without the
AIC each round takes the next unseen documents for the question, with no sufficiency check.

The package: `loop` (the pipeline and its registered variants), `memory` (AMU), `collector`
(AIC), `config` (`AmberConfig`, the `amber` section) and `loop_trace` (the typed trace).
"""

from sieverag.inference.pipelines.amber.config import AMBER_SECTION, AmberConfig
from sieverag.inference.pipelines.amber.loop import (
    AMBER_ABLATIONS,
    AMBER_PIPELINES,
    AmberPipeline,
)
from sieverag.inference.pipelines.amber.loop_trace import AmberTrace

__all__ = ["AMBER_ABLATIONS", "AMBER_PIPELINES", "AMBER_SECTION", "AmberConfig",
           "AmberPipeline", "AmberTrace"]
