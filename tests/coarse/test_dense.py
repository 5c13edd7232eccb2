"""Dense filters on the offline models that pip ships (all-MiniLM-L6-v2, WordLlama), plus the
passage splitter and the embed-once cache."""

from __future__ import annotations

import pytest

from memsifter.coarse import build_filter
from memsifter.coarse.dense import EmbeddingCache, chunk_session
from memsifter.data import load_locomo
from memsifter.data.types import Session, Turn
from memsifter.errors import MemSifterError
from memsifter.models import resolve_model
from memsifter.testing.coarse import LetterFilter


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


def test_sessions_are_encoded_once_and_best_passage_wins() -> None:
    f = LetterFilter(chunk_tokens=8)
    zzz = _session("zzz", ["aaa bbb ccc ddd eee fff", "zzzz zzzz zzzz zzzz zzzz zzzz"])
    other = _session("other", ["aaa bbb ccc ddd eee fff", "ggg hhh iii jjj kkk lll"])
    sessions = [other, zzz]
    assert f.score("zzzz", sessions).ids[0] == "zzz"
    n = len(f.encoded)
    f.score("aaa", sessions)
    assert len(f.encoded) == n + 1  # only the query was encoded the second time


def test_embedding_cache_outlives_the_filter_and_keeps_scores(tmp_path) -> None:
    sessions = [
        _session("a", ["aaa bbb ccc", "zzz yyy"]),
        _session("b", ["aaa bbb ccc", "qqq rrr sss"]),  # one passage shared with "a"
        _session("c", ["mmm nnn"]),
    ]
    plain = LetterFilter(chunk_tokens=4)
    first = LetterFilter(chunk_tokens=4, cache=EmbeddingCache(tmp_path))
    expected = plain.score("zzz qqq", sessions)
    assert first.score("zzz qqq", sessions) == expected
    # The shared passage is encoded once, not once per session.
    passages = [p for s in sessions for p in chunk_session(s, 4)]
    assert len(passages) > len(set(passages))
    assert len(first.encoded) == len(set(passages)) + 1
    # A new filter (a new process, a hybrid's member) reads every passage from disk.
    second = LetterFilter(chunk_tokens=4, cache=EmbeddingCache(tmp_path))
    assert second.score("zzz qqq", sessions) == expected
    assert second.encoded == ["zzz qqq"]
    # Another encoder never reads these rows.
    other = LetterFilter(chunk_tokens=4, cache=EmbeddingCache(tmp_path))
    other.encoder_id = "letters-v2"
    other.score("zzz qqq", sessions)
    assert len(other.encoded) == len(set(passages)) + 1
    assert len(EmbeddingCache(tmp_path)) == 2 * len(set(passages))


def test_embedding_cache_rejects_a_corrupt_file(tmp_path) -> None:
    (tmp_path / "embeddings.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(MemSifterError, match="embedding cache .* not usable"):
        EmbeddingCache(tmp_path)


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
