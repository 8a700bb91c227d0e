"""The round's embeddings, shared by the dense prior (`combination.passage_priors`) and the
home test (`home.HomeTest`): one encoder call per round, cached."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


def round_vectors(question: str, texts: Sequence[str],
                  embedding_model: str = DEFAULT_EMBEDDING_MODEL) -> np.ndarray:
    """The unit embeddings of `question` (row 0) and each of `texts` (rows 1...) under
    `embedding_model`; cached per round (the priors and the home test read the same)."""
    return _round_vectors(question, tuple(texts), embedding_model)


@functools.lru_cache(maxsize=1024)
def _round_vectors(question: str, texts: tuple[str, ...], embedding_model: str) -> np.ndarray:
    from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

    # Small batches: a served request's few passages wait for one batch of another's many.
    vectors = make_encoder(DenseConfig(model=embedding_model, batch_size=16))([question, *texts])
    vectors.setflags(write=False)  # shared through the cache
    return vectors
