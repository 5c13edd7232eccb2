"""``LetterFilter``: a dense coarse filter without a model, for tests that count embeddings.

An ``EmbeddingFilter`` whose vector of a text is its count of each letter a-z. Exact and
instant, it runs the real filter's caching and best-passage scoring, and it records every text it
encodes (queries included), so a test reads the embedding cache's hits and misses off ``encoded``.
"""

from __future__ import annotations

import numpy as np

from memsifter.coarse.dense import EmbeddingCache, EmbeddingFilter


class LetterFilter(EmbeddingFilter):
    name = "letters"
    encoder_id = "letters"

    def __init__(
        self, chunk_tokens: int | None = None, cache: EmbeddingCache | None = None
    ) -> None:
        super().__init__(cache)
        self.chunk_tokens = chunk_tokens
        self.encoded: list[str] = []  # every text encoded, in order

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        self.encoded.extend(texts)
        out = np.zeros((len(texts), 26), dtype=np.float32)
        for i, text in enumerate(texts):
            for ch in text.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out
