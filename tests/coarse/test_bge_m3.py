"""BGEM3Filter on a tiny random BGE-M3-shaped model: the real FlagEmbedding loading and encoding
path, offline, deterministic, and with sessions encoded once however many queries come."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memsifter.data.types import Ranking, Session, Turn
from memsifter.testing import build_tiny_bge_m3

torch.set_num_threads(2)

TEXTS = (
    "I adopted a golden retriever named Max last spring.",
    "我的猫叫小白，它很喜欢睡觉。",
    "The marathon in Berlin was the hardest race I ever ran.",
    "Can you recommend a vegetarian recipe for dinner tonight?",
    "明天我要去医院看望我的奶奶。",
)
QUERY = "What did I name my dog?"


@pytest.fixture(scope="session")
def tiny_bge_m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bge_m3(tmp_path_factory.mktemp("tiny-bge-m3"))


@pytest.fixture()
def sessions() -> list[Session]:
    return [
        Session(id=f"conv-1/session_{i}", turns=(Turn("user", text), Turn("assistant", "Noted.")))
        for i, text in enumerate(TEXTS)
    ]


def _filter(path: Path, **options: Any) -> Any:
    from memsifter.coarse.bge_m3 import BGEM3Filter

    return BGEM3Filter(str(path), device="cpu", **options)


def _spy_encode(monkeypatch: pytest.MonkeyPatch, filt: Any) -> list[list[str]]:
    """Record the texts of every call into FlagEmbedding's encode."""
    calls: list[list[str]] = []
    real: Callable[..., Any] = filt.model.encode

    def spy(texts: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(list(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(filt.model, "encode", spy)
    return calls


def test_tiny_model_builds_are_byte_identical(tiny_bge_m3: Path, tmp_path: Path) -> None:
    again = build_tiny_bge_m3(tmp_path / "again")
    names = sorted(p.name for p in tiny_bge_m3.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"colbert_linear.pt", "sparse_linear.pt", "model.safetensors"} <= set(names)
    for name in names:
        assert (tiny_bge_m3 / name).read_bytes() == (again / name).read_bytes(), name


def test_tiny_tokenizer_is_xlmr_compatible(tiny_bge_m3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bge_m3)
    assert tok.is_fast
    specials = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
    assert tok.convert_tokens_to_ids(list(specials)) == list(range(len(specials)))
    ids = tok("I adopted a dog. 我的猫叫小白")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids  # trained pieces cover both languages


@pytest.mark.slow
def test_ranks_every_session_once_and_deterministically(
    tiny_bge_m3: Path, sessions: list[Session], tmp_path: Path
) -> None:
    first = _filter(tiny_bge_m3).score(QUERY, sessions)
    second = _filter(tiny_bge_m3).score(QUERY, sessions)
    rebuilt = _filter(build_tiny_bge_m3(tmp_path / "rebuilt")).score(QUERY, sessions)

    assert sorted(first.ids) == sorted(s.id for s in sessions)
    assert len(set(first.ids)) == len(sessions)
    assert list(first.scores) == sorted(first.scores, reverse=True)
    assert first.source == "bge-m3"
    assert first == second == rebuilt
    assert len(set(first.scores)) == len(sessions)  # the tiny model does tell texts apart
    assert _filter(tiny_bge_m3).score(QUERY, []) == Ranking(ids=(), source="bge-m3")


@pytest.mark.slow
def test_sessions_are_encoded_once(
    tiny_bge_m3: Path, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    filt = _filter(tiny_bge_m3)
    calls = _spy_encode(monkeypatch, filt)
    filt.score(QUERY, sessions)
    filt.score("Where did I run a marathon?", list(reversed(sessions)))
    assert sorted(text for call in calls for text in call) == sorted(
        [s.render() for s in sessions] + [QUERY, "Where did I run a marathon?"]
    )

    # An edited session has a new fingerprint, so only it is encoded again.
    calls.clear()
    edited = Session(id=sessions[0].id, turns=(Turn("user", "I adopted a cat."),))
    filt.score(QUERY, [edited, *sessions[1:]])
    assert calls == [[edited.render()], [QUERY]]


@pytest.mark.slow
def test_sparse_mode_adds_lexical_matching(
    tiny_bge_m3: Path, sessions: list[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    query = "golden retriever named Max"  # shares pieces with the first session
    dense = _filter(tiny_bge_m3).score(query, sessions)
    sparse_off = _filter(tiny_bge_m3, use_sparse=True, sparse_weight=0.0).score(query, sessions)
    sparse_filter = _filter(tiny_bge_m3, use_sparse=True, sparse_weight=0.3)
    calls = _spy_encode(monkeypatch, sparse_filter)
    sparse = sparse_filter.score(query, sessions)
    sparse_filter.score(QUERY, sessions)

    assert sorted(sparse.ids) == sorted(dense.ids)
    assert sparse.source == "bge-m3-sparse" and dense.source == "bge-m3"
    assert sparse_off.ids == dense.ids
    np.testing.assert_allclose(sparse_off.scores, dense.scores, rtol=0, atol=1e-6)
    dense_by_id = dict(zip(dense.ids, dense.scores, strict=True))
    boost = {sid: s - dense_by_id[sid] for sid, s in zip(sparse.ids, sparse.scores, strict=True)}
    assert all(b >= -1e-6 for b in boost.values())  # lexical weights are ReLU outputs
    assert boost[sessions[0].id] == max(boost.values()) > 0
    # Lexical weights are cached per session like the dense vectors, not recomputed per query.
    assert set(sparse_filter._lexical) == {s.fingerprint for s in sessions}
    assert [len(call) for call in calls] == [len(sessions), 1, 1]


@pytest.mark.slow
def test_build_filter_spec_and_cpu_precision(tiny_bge_m3: Path, sessions: list[Session]) -> None:
    from memsifter.coarse import build_filter
    from memsifter.coarse.bge_m3 import BGEM3Filter

    filt = build_filter(f"bge-m3:{tiny_bge_m3}")
    assert isinstance(filt, BGEM3Filter)
    assert filt.name == "bge-m3"
    ranking = filt.score(QUERY, sessions)
    assert sorted(ranking.ids) == sorted(s.id for s in sessions)
    if filt.device == "cpu":  # on a GPU box the spec picks CUDA + fp16, so scores differ slightly
        assert ranking == _filter(tiny_bge_m3).score(QUERY, sessions)
    assert build_filter(f"bge-m3-sparse:{tiny_bge_m3}").use_sparse

    forced = _filter(tiny_bge_m3, use_fp16=True)  # fp16 is CUDA-only; CPU stays fp32
    assert forced.use_fp16 is False
    assert next(forced.model.model.parameters()).dtype == torch.float32
