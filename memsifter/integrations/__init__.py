"""Adapters that put the recall service behind the interfaces apps already use, installed with
the ``client`` extra (``pip install memsifter[client]``: these, the HTTP client, and no torch):

* :mod:`memsifter.integrations.langchain`: ``MemSifterRetriever`` (a LangChain ``BaseRetriever``
  over a user's recall) and ``MemSifterRerank`` (a ``BaseDocumentCompressor`` over
  ``/v1/rerank``);
* :mod:`memsifter.integrations.llama_index`: ``MemSifterRetriever`` (a LlamaIndex retriever) and
  ``MemSifterRerank`` (a node postprocessor).

Each talks to a running service over HTTP through :class:`memsifter.serving.client.
MemSifterClient`, so ids, errors and limits behave as they do for every other client. The
service's address is ``base_url``, else ``$MEMSIFTER_URL``, else ``http://127.0.0.1:8080`` (where
``memsifter serve`` listens by default).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memsifter.serving.schemas import RecallHit

DEFAULT_URL = "http://127.0.0.1:8080"


def service_url() -> str:
    return os.environ.get("MEMSIFTER_URL") or DEFAULT_URL


def hit_metadata(hit: RecallHit, ranker: str) -> dict[str, Any]:
    """What a recalled page carries besides its text, the same in every framework."""
    return {
        "page_id": hit.page_id,
        "session_id": hit.session_id,
        "rank": hit.rank,
        "score": hit.score,
        "coarse_score": hit.coarse_score,
        "bookmark_score": hit.bookmark_score,
        "keywords": list(hit.keywords),
        "date_text": hit.date_text,
        "ranker": ranker,
    }
