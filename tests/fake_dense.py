"""A dense encoder for tests: deterministic hashed bag-of-words vectors, no model."""

from __future__ import annotations

import numpy as np

from sieverag.inference.retrieval.dense import DenseConfig


def fake_encoder(texts):
    """Deterministic bag-of-words vectors (hashed words), unit length."""
    vectors = np.zeros((len(texts), 64), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            vectors[row, sum(map(ord, word.strip(".,?"))) % 64] += 1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


FAKE_DENSE = DenseConfig(model="fake", shard_size=2, batch_size=2)
