"""The LangChain and LlamaIndex adapters (``memsifter.integrations``) against a live service,
and the README's examples for them and for the Cohere SDK, run as they are printed there.

The service is seeded with the main job's sample user (``alice``) over HTTP, as
``memsifter serve --seed-sample`` seeds it, so the examples meet the data they are written for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from memsifter.serving.client import MemSifterClient, ServiceError  # noqa: E402
from memsifter.serving.config import ApiKeySettings, ServeConfig  # noqa: E402
from memsifter.serving.sample import SAMPLE_USER, sample_sessions  # noqa: E402
from memsifter.serving.schemas import SessionIn, TurnIn  # noqa: E402
from memsifter.serving.store import hash_key  # noqa: E402
from memsifter.testing.server import live_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "msk-integrations-0123456789"
DOG = "What is my dog called?"


@pytest.fixture(scope="module")
def url(serve_db: Callable[[str], str]) -> Iterator[str]:
    config = ServeConfig(
        db_url=serve_db("integrations"),
        api_keys=[ApiKeySettings(tenant="demo", key_sha256=hash_key(KEY))],
    )
    with live_server(config) as base, MemSifterClient(base, api_key=KEY) as client:
        client.ingest_sessions(
            SAMPLE_USER,
            [
                SessionIn(
                    id=s.id,
                    date=s.date,
                    date_text=s.date_text,
                    turns=[TurnIn(speaker=t.speaker, text=t.text) for t in s.turns],
                )
                for s in sample_sessions()
            ],
        )
        yield base


def test_langchain_retriever_and_reranker(url: str) -> None:
    from langchain_core.documents import Document

    from memsifter.integrations.langchain import MemSifterRerank, MemSifterRetriever

    docs = MemSifterRetriever(base_url=url, api_key=KEY, user_id=SAMPLE_USER, top_k=3).invoke(DOG)
    assert 1 <= len(docs) <= 3 and "Max" in docs[0].page_content
    meta = docs[0].metadata
    assert meta["rank"] == 1 and meta["ranker"] == "coarse-only" and meta["page_id"] == docs[0].id
    assert meta["keywords"] and meta["session_id"]

    pool = [
        Document(page_content="The quarterly report is due on Friday.", metadata={"src": "a"}),
        Document(page_content="My dog Max loves the beach.", metadata={"src": "b"}),
        Document(page_content="We went hiking in the Alps.", metadata={"src": "c"}),
    ]
    best = MemSifterRerank(base_url=url, api_key=KEY, top_n=2).compress_documents(pool, DOG)
    assert [d.metadata["src"] for d in best][0] == "b" and len(best) == 2
    assert best[0].metadata["relevance_score"] == 1.0
    assert pool[1].metadata == {"src": "b"}  # the caller's documents are not changed
    assert MemSifterRerank(base_url=url, api_key=KEY).compress_documents([], DOG) == []
    # A service error reaches the caller named, not as an empty result.
    wrong = MemSifterRetriever(base_url=url, api_key="wrong-0123456789", user_id=SAMPLE_USER)
    with pytest.raises(ServiceError, match="401"):
        wrong.invoke(DOG)


def test_llama_index_retriever_and_postprocessor(url: str) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode

    from memsifter.integrations.llama_index import MemSifterRerank, MemSifterRetriever

    nodes = MemSifterRetriever(base_url=url, api_key=KEY, user_id=SAMPLE_USER, top_k=2).retrieve(
        "Who is getting married in Porto?"
    )
    assert len(nodes) == 2 and "Clara" in nodes[0].node.get_content()
    assert nodes[0].score is not None and nodes[0].node.metadata["rank"] == 1

    pool = [
        NodeWithScore(node=TextNode(text="The quarterly report is due on Friday."), score=0.9),
        NodeWithScore(node=TextNode(text="My dog Max loves the beach."), score=0.1),
    ]
    best = MemSifterRerank(base_url=url, api_key=KEY, top_n=1).postprocess_nodes(
        pool, query_str=DOG
    )
    assert len(best) == 1 and "Max" in best[0].node.get_content() and best[0].score == 1.0


def _readme_examples() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# readme-example: (\w+)\n.*?)```", text, flags=re.S)
    return {name: code for code, name in blocks}


def test_the_readme_has_the_examples() -> None:
    assert set(_readme_examples()) == {"cohere", "langchain", "llama_index"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cohere", "langchain", "llama_index"])
def test_readme_example_runs(url: str, name: str, tmp_path: Path) -> None:
    if name == "cohere":
        pytest.importorskip("cohere")
    script = tmp_path / f"readme_example_{name}.py"  # not the package's own name
    script.write_text(_readme_examples()[name], encoding="utf-8")
    env = {**os.environ, "MEMSIFTER_URL": url, "MEMSIFTER_DEMO_KEY": KEY}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {"cohere": "My dog is called Max.", "langchain": "Max", "llama_index": "Clara"}
    assert expected[name] in done.stdout, done.stdout
