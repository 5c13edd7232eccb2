"""LangChain adapters over the recall service (see :mod:`memsifter.integrations`).

retriever = MemSifterRetriever(base_url=URL, api_key=KEY, user_id="alice", top_k=3)
docs = retriever.invoke("What is my dog called?")
rerank = MemSifterRerank(base_url=URL, api_key=KEY, top_n=2)
best = rerank.compress_documents(docs, "What is my dog called?")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, SecretStr

from memsifter.integrations import hit_metadata, service_url
from memsifter.serving.client import MemSifterClient


def _client(base_url: str, api_key: SecretStr, timeout_s: float) -> MemSifterClient:
    return MemSifterClient(base_url, api_key=api_key.get_secret_value(), timeout_s=timeout_s)


class MemSifterRetriever(BaseRetriever):
    """The user's top-k memory pages for a query (``POST /v1/users/{user_id}/recall``), as
    Documents whose metadata carries the page, its scores, keywords and the ranker."""

    base_url: str = Field(default_factory=service_url)
    api_key: SecretStr
    user_id: str
    top_k: int = 5
    timeout_s: float = 60.0

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        with _client(self.base_url, self.api_key, self.timeout_s) as client:
            out = client.recall(self.user_id, query, top_k=self.top_k)
        return [
            Document(
                page_content=hit.text,
                id=hit.page_id,
                metadata=hit_metadata(hit, out.ranker),
            )
            for hit in out.hits
        ]


class MemSifterRerank(BaseDocumentCompressor):
    """Reorders documents by ``POST /v1/rerank`` and keeps the best ``top_n`` (all when None);
    each kept document is a copy with ``relevance_score`` added to its metadata, as LangChain's
    own rerankers do."""

    base_url: str = Field(default_factory=service_url)
    api_key: SecretStr
    top_n: int | None = 3
    timeout_s: float = 60.0

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        if not documents:
            return []
        with _client(self.base_url, self.api_key, self.timeout_s) as client:
            out = client.rerank(
                query,
                [d.page_content for d in documents],
                top_n=self.top_n,
                return_documents=False,
            )
        kept = []
        for result in out.results:
            doc = documents[result.index]
            meta: dict[str, Any] = {**doc.metadata, "relevance_score": result.relevance_score}
            kept.append(Document(page_content=doc.page_content, id=doc.id, metadata=meta))
        return kept
