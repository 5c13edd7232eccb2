"""``POST /v1/rerank`` (and ``/rerank``, ``/v2/rerank``): the rerank API that Cohere's SDK,
Jina's clients, vLLM's ``/rerank``, Haystack's VLLMRanker and LiteLLM's hosted_vllm speak.

Documents are ranked as ``/v1/rank`` ranks sessions, by the service's configured ranker (the
coarse filter over the given documents, then the proxy when one runs); nothing is stored.
Results come back best first, with ``index`` into the request's documents.

``relevance_score`` lies in [0, 1] and never rises as the rank falls:

- coarse-only: the coarse score over the best one (BM25 0 stays 0: no term in common), made
  non-increasing along the ranking;
- with a proxy, which orders but does not score: the DCG discount of the rank, 1/log2(rank + 1),
  the position value the reward trains it on (``memsifter.rewards.tiers.position_value``).
"""

from __future__ import annotations

import math

import numpy as np
from fastapi import APIRouter

from memsifter.data.types import Session, Turn
from memsifter.serving.deps import Svc, Who, check_question, in_thread
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import request_id_var
from memsifter.serving.ranking import RankOutcome
from memsifter.serving.routes.rank import ERRORS, timings_out
from memsifter.serving.schemas import (
    RerankDocument,
    RerankDocumentOut,
    RerankIn,
    RerankOut,
    RerankResultOut,
    RerankUsage,
)

router = APIRouter(tags=["rerank"])
SPEAKER = "document"  # one turn per document; the same word in every one weighs ~0 in BM25


def relevance_scores(outcome: RankOutcome) -> list[float]:
    """One score per ranked id, in ``outcome.ids`` order (see the module doc)."""
    n = len(outcome.ids)
    if outcome.parse.status != "not_applicable":
        return [1.0 / math.log2(rank + 1) for rank in range(1, n + 1)]
    fused = np.asarray([outcome.score(sid) for sid in outcome.ids], dtype=np.float64)
    top = float(fused.max()) if n else 0.0
    scaled = np.clip(fused / top, 0.0, 1.0) if top > 0 else np.zeros(n)
    return np.minimum.accumulate(scaled).tolist() if n else []


def _text(doc: str | RerankDocument) -> str:
    return doc.text if isinstance(doc, RerankDocument) else doc


def _check(body: RerankIn, svc: Svc) -> list[str]:
    limits = svc.config.limits
    check_question(body.query, limits, "body.query")
    if len(body.documents) > limits.max_sessions:
        raise ServeError(
            f"{len(body.documents)} documents; the limit is {limits.max_sessions} "
            "(limits.max_sessions)",
            field="body.documents",
            status=413,
        )
    texts = [_text(d) for d in body.documents]
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            raise ServeError(
                f"document has {len(text)} characters; the limit is {limits.max_text_chars} "
                "(limits.max_text_chars)",
                field=f"body.documents[{i}]",
                status=413,
            )
    return texts


def _cut(text: str, max_words: int | None) -> str:
    if max_words is None:
        return text
    words = text.split()
    return text if len(words) <= max_words else " ".join(words[:max_words])


def _rerank(body: RerankIn, svc: Svc, who: Who) -> RerankOut:
    texts = _check(body, svc)
    sessions = [
        Session(id=str(i), turns=(Turn(speaker=SPEAKER, text=_cut(t, body.max_tokens_per_doc)),))
        for i, t in enumerate(texts)
    ]
    outcome = svc.ranker.rank(body.query, sessions, tenant=who.tenant_id)
    scores = relevance_scores(outcome)
    n = len(texts) if body.top_n is None else min(body.top_n, len(texts))
    results = [
        RerankResultOut(
            index=int(sid),
            relevance_score=score,
            document=RerankDocumentOut(text=texts[int(sid)]) if body.return_documents else None,
        )
        for sid, score in zip(outcome.ids[:n], scores[:n], strict=True)
    ]
    count = svc.memory.counter.count
    return RerankOut(
        id=f"rerank-{request_id_var.get()}",
        model=body.model or outcome.ranker,
        usage=RerankUsage(total_tokens=count(body.query) + sum(count(t) for t in texts)),
        results=results,
        ranker=outcome.ranker,
        timings=timings_out(outcome),
    )


def _route(path: str, *, in_schema: bool) -> None:
    @router.post(
        path,
        response_model=RerankOut,
        response_model_exclude_none=True,
        responses=ERRORS,
        include_in_schema=in_schema,
        name=f"rerank{path.replace('/', '_')}",
    )
    @in_thread
    def rerank(body: RerankIn, svc: Svc, who: Who) -> RerankOut:
        """Rank ``documents`` for ``query`` with the service's ranker (Cohere/Jina/vLLM
        request and response; ``/rerank`` and ``/v2/rerank`` are the same endpoint)."""
        return _rerank(body, svc, who)


for _path, _listed in (("/v1/rerank", True), ("/rerank", False), ("/v2/rerank", False)):
    _route(_path, in_schema=_listed)
