"""Dense filters on the offline models that pip ships (all-MiniLM-L6-v2, WordLlama), plus the
passage splitter and the embed-once cache."""

from __future__ import annotations

import pytest

from memsifter.coarse import build_filter
from memsifter.coarse.dense import EmbeddingFilter, chunk_session
from memsifter.data import load_locomo
from memsifter.data.types import Session, Turn
from memsifter.models import resolve_model


def _session(sid: str, lines: list[str]) -> Session:
    return Session(id=sid, turns=tuple(Turn("A", t) for t in lines), date_text="1 May 2023")


def test_chunk_session_keeps_whole_turns_and_date() -> None:
    s = _session("s", [f"turn number {i} " + "word " * 20 for i in range(10)])
    chunks = chunk_session(s, 50)
    assert len(chunks) > 1
    assert all(c.startswith("Date: 1 May 2023") for c in chunks)
    joined = "\n".join(c.split("\n", 1)[1] for c in chunks)
    assert joined == "\n".join(t.render() for t in s.turns)
    assert chunk_session(s, None) == [s.render()]


class _CountingFilter(EmbeddingFilter):
    """Bag-of-letters encoder: enough to test caching and max-passage scoring without a model."""

    name = "counting"

    def __init__(self, chunk_tokens: int | None) -> None:
        super().__init__()
        self.chunk_tokens = chunk_tokens
        self.encoded: list[str] = []

    def encode_documents(self, texts: list[str]):
        import numpy as np

        self.encoded.extend(texts)
        out = np.zeros((len(texts), 26), dtype=np.float32)
        for i, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out


def test_sessions_are_encoded_once_and_best_passage_wins() -> None:
    f = _CountingFilter(chunk_tokens=8)
    zzz = _session("zzz", ["aaa bbb ccc ddd eee fff", "zzzz zzzz zzzz zzzz zzzz zzzz"])
    other = _session("other", ["aaa bbb ccc ddd eee fff", "ggg hhh iii jjj kkk lll"])
    sessions = [other, zzz]
    assert f.score("zzzz", sessions).ids[0] == "zzz"
    n = len(f.encoded)
    f.score("aaa", sessions)
    assert len(f.encoded) == n + 1  # only the query was encoded the second time


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["minilm", "wordllama"])
def test_offline_dense_filter_ranks_fixture(spec: str, locomo_mini_path) -> None:
    ds = load_locomo(locomo_mini_path)
    f = build_filter(spec)
    qs = [q for q in ds.queries if q.has_evidence and q.category in ("4", "1")][:6]
    hits = 0
    for q in qs:
        r = f.score(q.question, q.haystack)
        assert sorted(r.ids) == sorted(s.id for s in q.haystack)
        assert list(r.scores) == sorted(r.scores, reverse=True)
        hits += bool(set(r.ids[:2]) & set(q.gold_session_ids))
    assert hits >= len(qs) // 2
    again = build_filter(spec).score(qs[0].question, qs[0].haystack)
    assert again.ids == f.score(qs[0].question, qs[0].haystack).ids


def test_resolve_builtin_and_local(tmp_path) -> None:
    m = resolve_model("minilm")
    assert m.builtin and m.local and m.path.endswith("model")
    assert resolve_model(str(tmp_path)).local
    assert resolve_model("BAAI/bge-m3").path == "BAAI/bge-m3"  # hub ids pass through
    from memsifter.errors import MemSifterError

    with pytest.raises(MemSifterError, match="does not exist"):
        resolve_model("./no/such/folder")
