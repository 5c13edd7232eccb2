"""BGE-M3 coarse filter: dense cosine, optionally plus BGE-M3's own sparse lexical matching.

BGE-M3 (``BAAI/bge-m3``) reads 8192 tokens, so unlike MiniLM it sees a whole LoCoMo session
instead of its first 256 tokens, and it is multilingual. We run it through FlagEmbedding's
``BGEM3FlagModel`` (imported via ``memsifter._compat.flagembedding`` so it loads under
transformers 5) because that class also owns the sparse head: with ``use_sparse`` the score is
``cosine(dense) + sparse_weight * lexical_matching_score``.

As in every ``EmbeddingFilter``, a session is encoded once (dense vector and, when used, its
lexical weights, both keyed by ``Session.fingerprint`` and the ``cache_scope`` in force); a
query costs one short encode.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from memsifter.coarse.base import rank_by_scores
from memsifter.coarse.dense import EmbeddingFilter
from memsifter.data.types import Ranking, Session
from memsifter.models import resolve_model
from memsifter.scopes import ScopedKey, scoped

logger = logging.getLogger(__name__)

LexicalWeights = dict[str, float]


class BGEM3Filter(EmbeddingFilter):
    """Rank sessions with BGE-M3 (a hub id or a local folder with the hub repo's layout)."""

    name = "bge-m3"

    def __init__(
        self,
        model: str = "BAAI/bge-m3",
        use_sparse: bool = False,
        sparse_weight: float = 0.3,
        max_length: int = 8192,
        batch_size: int = 4,
        device: str | None = None,
        use_fp16: bool | None = None,
    ) -> None:
        super().__init__()
        import torch

        from memsifter._compat.flagembedding import import_flagembedding

        # One explicit device: given None, FlagEmbedding would spread encoding over every visible
        # GPU with a multiprocessing pool, which we neither need nor want inside a server.
        self.device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        on_cuda = self.device.startswith("cuda")
        if use_fp16 and not on_cuda:
            logger.warning(
                "bge-m3: fp16 was asked for on %s; using fp32 (fp16 is CUDA-only)", self.device
            )
        self.use_fp16 = on_cuda if use_fp16 is None else bool(use_fp16 and on_cuda)
        self.use_sparse = use_sparse
        # Distinct name so eval output never mixes dense-only and dense+sparse results.
        self.name = "bge-m3-sparse" if use_sparse else "bge-m3"
        self.sparse_weight = sparse_weight
        self.batch_size = batch_size

        resolved = resolve_model(model)
        flag_embedding = import_flagembedding()
        self.model: Any = flag_embedding.BGEM3FlagModel(
            resolved.path,
            use_fp16=self.use_fp16,
            devices=self.device,
            batch_size=batch_size,
            query_max_length=max_length,
            passage_max_length=max_length,
            return_dense=True,
            return_sparse=use_sparse,
            return_colbert_vecs=False,
        )
        # FlagEmbedding truncates to max_length as given; for a folder whose model has a shorter
        # window that would index past its position embeddings, so never exceed what it declares.
        declared = getattr(self.model.tokenizer, "model_max_length", None)
        self.max_length = min(max_length, declared) if isinstance(declared, int) else max_length
        self._lexical: dict[ScopedKey, LexicalWeights] = {}

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, list[LexicalWeights] | None]:
        """Dense vectors (n, dim) and, in sparse mode, one {token id: weight} map per text."""
        out = self.model.encode(
            texts,
            batch_size=self.batch_size,
            max_length=self.max_length,
            return_dense=True,
            return_sparse=self.use_sparse,
            return_colbert_vecs=False,
        )
        dense = np.asarray(out["dense_vecs"], dtype=np.float32).reshape(len(texts), -1)
        if not self.use_sparse:
            return dense, None
        # FlagEmbedding returns defaultdicts of numpy scalars; plain float dicts are smaller to
        # cache and cannot grow a key when a lookup misses.
        lexical = [
            {tok: float(w) for tok, w in weights.items()} for weights in out["lexical_weights"]
        ]
        return dense, lexical

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self._encode(texts)[0]

    def index(self, sessions: Sequence[Session]) -> None:
        keyed = {scoped(s.fingerprint): s for s in sessions}
        todo = {k: s for k, s in keyed.items() if k not in self._vectors}
        if not todo:
            return
        keys = list(todo)
        dense, lexical = self._encode([todo[k].render() for k in keys])
        self._vectors.update(zip(keys, self._normalise(dense), strict=True))
        if lexical is not None:
            self._lexical.update(zip(keys, lexical, strict=True))

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        self.index(sessions)
        dense, lexical = self._encode([query])
        keys = [scoped(s.fingerprint) for s in sessions]
        matrix = np.stack([self._vectors[k] for k in keys])
        scores = (matrix @ self._normalise(dense[0])).astype(np.float64)
        if lexical is not None:
            # Query weights go first: the model's matcher loops over its first argument, and a
            # query has far fewer tokens than a session.
            lexical_scores = self.model.compute_lexical_matching_score(
                [lexical[0]], [self._lexical[k] for k in keys]
            )
            scores = scores + self.sparse_weight * np.asarray(lexical_scores, dtype=np.float64)[0]
        return rank_by_scores(sessions, scores, self.name)
