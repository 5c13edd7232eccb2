"""``POST /v1/rerank`` and its ``/rerank`` and ``/v2/rerank`` aliases: the JSON contract that
vLLM, Jina and Cohere clients expect, the real ``cohere`` SDK (``ClientV2`` with ``base_url``)
against a live server, the proxy's order through the same endpoint, and bad input. Runs on
SQLite, and on PostgreSQL too when ``MEMSIFTER_TEST_PG_DSN`` is set (the ``serve_db`` fixture)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from memsifter.coarse import build_filter
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, LimitSettings, ServeConfig
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.store import hash_key
from memsifter.testing.backends import ScriptedBackend, reverse_ranking
from memsifter.testing.server import live_server

KEY = "key-rerank-tests-0123456789"
DOCS = [
    "We went hiking in the Alps last summer.",
    "My dog is called Max and he loves the beach.",
    "The quarterly report is due on Friday.",
    "Max the dog chased a ball at the park; dog toys everywhere.",
]
QUERY = "What is my dog called?"


def _config(db_url: str, **limits: int) -> ServeConfig:
    return ServeConfig(
        db_url=db_url,
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
        limits=LimitSettings(**limits),
    )


@pytest.fixture(scope="module")
def client(serve_db: Callable[[str], str]) -> Iterator[TestClient]:
    app = create_app(_config(serve_db("rerank"), max_sessions=6, max_text_chars=500))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_json_contract(client: TestClient, path: str) -> None:
    r = client.post(path, json={"model": "memsifter", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"id", "model", "usage", "results"}
    assert body["model"] == "memsifter" and body["usage"]["total_tokens"] > 0
    results = body["results"]
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
    for x in results:
        assert set(x) == {"index", "document", "relevance_score"}
        assert x["document"] == {"text": DOCS[x["index"]]}
        assert 0.0 <= x["relevance_score"] <= 1.0
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0
    assert {results[0]["index"], results[1]["index"]} == {1, 3}  # the dog documents lead
    assert scores[-1] == 0.0  # no term in common with the query: no relevance
    assert body["ranker"] == "coarse-only"


def test_rerank_top_n_objects_and_return_documents(client: TestClient) -> None:
    docs = [{"text": d} for d in DOCS]
    r = client.post(
        "/v1/rerank",
        json={"query": QUERY, "documents": docs, "top_n": 2, "return_documents": False},
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and all(set(x) == {"index", "relevance_score"} for x in results)
    # top_n over the documents' count returns them all, as Cohere's does
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS[:2], "top_n": 50})
    assert len(r.json()["results"]) == 2
    # no model named: the response names the ranker that ranked
    assert r.json()["model"] == "coarse-only"


def test_rerank_max_tokens_per_doc_cuts_before_ranking(client: TestClient) -> None:
    docs = ["one two three four five six seven dog", "dog"]
    r = client.post(
        "/v1/rerank", json={"query": "dog", "documents": docs, "max_tokens_per_doc": 3}
    ).json()
    assert r["results"][0]["index"] == 1 and r["results"][1]["relevance_score"] == 0.0
    assert r["results"][1]["document"]["text"] == docs[0]  # returned whole, ranked cut


@pytest.mark.parametrize(
    ("body", "status", "field", "says"),
    [
        ({"query": QUERY, "documents": ["d"] * 7}, 413, "body.documents", "limits.max_sessions"),
        ({"query": QUERY, "documents": ["d", "x" * 501]}, 413, "body.documents[1]", "500"),
        ({"query": "q" * 3000, "documents": ["d"]}, 422, "body.query", "2000"),
        ({"query": QUERY, "documents": []}, 422, "body.documents", "at least 1"),
        ({"query": " ", "documents": ["d"]}, 422, "body.query", "empty"),
        ({"query": QUERY, "documents": ["d"], "top_n": 0}, 422, "body.top_n", "greater"),
        ({"query": QUERY, "documents": [{"txt": "d"}]}, 422, "body.documents[0]", ""),
        ({"query": QUERY, "documents": ["d"], "rank_fields": ["x"]}, 422, "rank_fields", ""),
    ],
)
def test_rerank_bad_input_names_the_limit(
    client: TestClient, body: dict, status: int, field: str, says: str
) -> None:
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert any(field in f["field"] for f in err["fields"]), err
    assert says in err["message"] + " ".join(f["message"] for f in err["fields"])


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_needs_a_tenant_key(client: TestClient, path: str) -> None:
    body = {"query": QUERY, "documents": DOCS}
    assert client.post(path, json=body, headers={"Authorization": ""}).status_code == 401
    wrong = {"Authorization": "Bearer not-a-key-0123456789"}
    r = client.post(path, json=body, headers=wrong)
    assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"


def test_rerank_through_the_proxy_keeps_its_order(serve_db: Callable[[str], str]) -> None:
    ranker = ServiceRanker(build_filter("bm25"), ScriptedBackend(reverse_ranking), PromptSpec())
    app = create_app(_config(serve_db("rerank_proxy")), ranker)
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        ranked = c.post("/v1/rank", json={
            "question": QUERY,
            "sessions": [
                {"id": str(i), "turns": [{"speaker": "document", "text": d}]}
                for i, d in enumerate(DOCS)
            ],
        }).json()  # fmt: skip
        body = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    assert body["ranker"] == ranked["ranker"] != "coarse-only"
    assert [str(x["index"]) for x in body["results"]] == [x["id"] for x in ranked["ranking"]]
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores[0] == 1.0 and all(a > b > 0 for a, b in zip(scores, scores[1:], strict=False))
    assert body["timings"]["proxy_ms"] is not None


@pytest.mark.slow
def test_cohere_sdk_round_trip(serve_db: Callable[[str], str]) -> None:
    cohere = pytest.importorskip("cohere")
    with live_server(_config(serve_db("rerank_cohere"))) as url:
        co = cohere.ClientV2(api_key=KEY, base_url=url)
        got = co.rerank(model="memsifter", query=QUERY, documents=DOCS, top_n=3)
        assert len(got.results) == 3
        assert {got.results[0].index, got.results[1].index} == {1, 3}
        scores = [x.relevance_score for x in got.results]
        assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
        with pytest.raises(cohere.errors.UnauthorizedError):
            cohere.ClientV2(api_key="wrong-key-0123456789", base_url=url).rerank(
                model="memsifter", query=QUERY, documents=DOCS
            )
        # The v1 client (documents as objects, return_documents) on /v1/rerank.
        v1 = cohere.Client(api_key=KEY, base_url=url)
        old = v1.rerank(
            model="memsifter",
            query=QUERY,
            documents=[{"text": d} for d in DOCS],
            return_documents=True,
            top_n=1,
        )
        assert old.results[0].document.text in (DOCS[1], DOCS[3])
