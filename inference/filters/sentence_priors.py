"""The priors' sentence rule: MCF's sentence stage without the filter (`mcf.sentence_rule
priors`), from the retrieval priors of each sentence and where it sits in its chunk.

A round's kept chunks are cut into their sentences (`mcf.document_sentences`); every sentence
gets BM25 against the question (IDF over all the round's sentences) and the cosine of its
embedding with the question's (the model the card's combination uses), by the same
`passage_priors` that scores the chunks. Within each chunk:

    fused = z(BM25) + z(dense) + FIRST_SENTENCE_PRIOR · [the chunk's first sentence]

z over the chunk's sentences, so the bar means "this far above the chunk's average sentence"
whatever the chunk's length or topic. A sentence is key when its fused score is at least
`mcf.sentence_bar`, and the `mcf.sentence_min_keep` best are key whatever the bar (ties to the
earlier). No model runs besides the embedding model.

tests/benchmarks/bench_sentence_rule.py measured the rule against the filter's sentence stage
on five sources and chose the first-sentence prior and the bar (docs/results/filter.md,
"Sentences by the best rule"): a chunk's first sentence often names its subject, but a prior
for it helped as many sources as it hurt (HotpotQA, NQ and web snippets against SQuAD), so on
every source together the prior is 0 (tied with 0.5, the smaller kept) and the bar 0.5.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sieverag.inference.filters.document_filter import z_scores

# What bench_sentence_rule.py chose on every source (z units): the first sentence's prior
# and the bar on the fused score.
FIRST_SENTENCE_PRIOR = 0.0
DEFAULT_SENTENCE_BAR = 0.5

# question, texts, embedding model → (BM25, dense cosine) per text (`passage_priors`)
PriorScorer = Callable[[str, Sequence[str], str], tuple[Sequence[float], Sequence[float]]]


def fused_sentence_scores(question: str, chunks: Sequence[Sequence[str]], priors: PriorScorer,
                          embedding_model: str,
                          first_prior: float = FIRST_SENTENCE_PRIOR) -> list[list[float]]:
    """Each chunk's sentences' fused scores (same order): z(BM25) + z(dense) over the chunk's
    sentences, BM25's IDF over every sentence of `chunks`, plus `first_prior` for its first.
    Priors are computed once for the round; a chunk of one sentence scores `first_prior`."""
    flat = [sentence for sentences in chunks for sentence in sentences]
    if not flat:
        return [[] for _ in chunks]
    bm25, dense = priors(question, flat, embedding_model)
    fused, start = [], 0
    for sentences in chunks:
        end = start + len(sentences)
        chunk = [b + d for b, d in zip(z_scores(bm25[start:end]), z_scores(dense[start:end]),
                                       strict=True)] if sentences else []
        fused.append([score + (first_prior if i == 0 else 0.0)
                      for i, score in enumerate(chunk)])
        start = end
    return fused


def prior_key_sentences(scores: Sequence[float], bar: float, min_keep: int) -> list[int]:
    """The key sentences, in order: those whose fused score is at least `bar`, and at least
    the `min_keep` best (ties to the earlier)."""
    keys = {i for i, score in enumerate(scores) if score >= bar}
    keys.update(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:min_keep])
    return sorted(keys)
