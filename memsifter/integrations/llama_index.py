"""LlamaIndex adapters over the recall service (see :mod:`memsifter.integrations`).

retriever = MemSifterRetriever(base_url=URL, api_key=KEY, user_id="alice", top_k=3)
nodes = retriever.retrieve("What is my dog called?")
rerank = MemSifterRerank(base_url=URL, api_key=KEY, top_n=2)
best = rerank.postprocess_nodes(nodes, query_str="What is my dog called?")
"""

from __future__ import annotations

from llama_index.core.bridge.pydantic import Field, SecretStr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from memsifter.errors import MemSifterError
from memsifter.integrations import hit_metadata, service_url
from memsifter.serving.client import MemSifterClient


class MemSifterRetriever(BaseRetriever):
    """The user's top-k memory pages (``POST /v1/users/{user_id}/recall``) as scored text nodes;
    a node's score is the fused coarse+bookmark score and its metadata says the rest."""

    def __init__(
        self,
        *,
        api_key: str,
        user_id: str,
        base_url: str | None = None,
        top_k: int = 5,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__()
        self._settings = (base_url or service_url(), api_key, timeout_s)
        self.user_id = user_id
        self.top_k = top_k

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        base_url, api_key, timeout_s = self._settings
        with MemSifterClient(base_url, api_key=api_key, timeout_s=timeout_s) as client:
            out = client.recall(self.user_id, query_bundle.query_str, top_k=self.top_k)
        return [
            NodeWithScore(
                node=TextNode(
                    id_=hit.page_id,
                    text=hit.text,
                    metadata=hit_metadata(hit, out.ranker),
                ),
                score=hit.score,
            )
            for hit in out.hits
        ]


class MemSifterRerank(BaseNodePostprocessor):
    """Reorders nodes by ``POST /v1/rerank`` and keeps the best ``top_n`` (all when None), each
    scored with its ``relevance_score``."""

    base_url: str = Field(default_factory=service_url)
    api_key: SecretStr
    top_n: int | None = Field(default=3)
    timeout_s: float = Field(default=60.0)

    @classmethod
    def class_name(cls) -> str:
        return "MemSifterRerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise MemSifterError("MemSifterRerank needs the query (query_bundle or query_str)")
        if not nodes:
            return []
        texts = [n.node.get_content() for n in nodes]
        key = self.api_key.get_secret_value()
        with MemSifterClient(self.base_url, api_key=key, timeout_s=self.timeout_s) as client:
            out = client.rerank(
                query_bundle.query_str, texts, top_n=self.top_n, return_documents=False
            )
        return [
            NodeWithScore(node=nodes[r.index].node, score=r.relevance_score) for r in out.results
        ]
