"""The LoCoMo loader on the real ``locomo10.json``: the published counts and every known quirk.

The file is CC BY-NC and never committed; it is read from ``../shared/data/locomo`` (or
``$MEMSIFTER_LOCOMO``). On a fresh clone without it these tests skip; the synthetic fixture
covers the same cases in test_loaders.py.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from memsifter.data import load_locomo
from memsifter.data.locations import locomo_file

LOCOMO = locomo_file()

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not LOCOMO.is_file(), reason=f"real LoCoMo not found at {LOCOMO}"),
]


@pytest.fixture(scope="module")
def raw() -> list[dict]:
    return json.loads(LOCOMO.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ds():
    return load_locomo(LOCOMO)


def test_published_counts(ds) -> None:
    assert len(ds.queries) == ds.report.n_questions == 1986
    assert sum(q.has_evidence for q in ds.queries) == 1982
    assert ds.report.n_sessions == len(ds.sessions) == 272
    assert [len(v) for v in ds.conversations.values()] == [19, 19, 32, 29, 29, 28, 31, 30, 25, 30]
    assert Counter(q.category for q in ds.queries) == Counter(
        {"4": 841, "5": 446, "2": 321, "1": 282, "3": 96}
    )


def test_evidence_repairs_counted(ds) -> None:
    report = ds.report
    assert report.repaired_evidence == Counter(
        {
            "D8:6; D9:17": 1,
            "D:11:26": 1,
            "D9:1 D4:4 D4:6": 1,
            "D22:1 D22:2 D9:10 D9:11": 1,
            "D21:18 D21:22 D11:15 D11:19": 1,
        }
    )
    assert report.unusable_evidence == Counter({"D": 1})
    # Questions with an empty evidence list are kept and named.
    assert report.no_evidence_qids == ["conv-26/q30", "conv-26/q46", "conv-50/q39", "conv-50/q42"]
    by_qid = {q.qid: q for q in ds.queries}
    assert by_qid["conv-26/q37"].gold_session_ids == ("conv-26/session_8", "conv-26/session_9")
    assert "conv-43/session_11" in by_qid["conv-43/q18"].gold_session_ids
    # The bare "D" sits beside good ids, which still count.
    assert by_qid["conv-42/q88"].meta["evidence"] == ["D1:18", "D", "D1:20"]
    assert by_qid["conv-42/q88"].gold_session_ids == ("conv-42/session_1",)


def test_gold_sessions_exist_in_haystack(ds) -> None:
    for q in ds.queries:
        assert set(q.gold_session_ids) <= {s.id for s in q.haystack}


def test_adversarial_answers(ds, raw) -> None:
    by_qid = {q.qid: q for q in ds.queries}
    both = 0
    for sample in raw:
        for j, item in enumerate(sample["qa"]):
            q = by_qid[f"{sample['sample_id']}/q{j}"]
            if item["category"] == 5:
                assert q.answer == str(item["adversarial_answer"])
                both += "answer" in item
            else:
                assert q.answer == str(item["answer"])
    assert both == 2  # two released category-5 items also carry a plain "answer"


def test_image_captions_in_turn_text(ds, raw) -> None:
    n_captions = 0
    for sample in raw:
        sessions = {s.id.rsplit("/", 1)[1]: s for s in ds.conversations[sample["sample_id"]]}
        for key, session in sessions.items():
            turns = {t.turn_id: t for t in session.turns}
            for t in sample["conversation"][key]:
                if t.get("blip_caption"):
                    n_captions += 1
                    assert turns[t["dia_id"]].text.endswith(
                        f"[shares an image: {t['blip_caption']}]"
                    )
    assert n_captions > 0
    marked = sum("[shares an image: " in t.text for s in ds.sessions.values() for t in s.turns)
    assert marked == n_captions


def test_dates_parsed(ds) -> None:
    first = ds.conversations["conv-26"][0]
    assert first.date_text == "1:56 pm on 8 May, 2023"
    assert (first.date.year, first.date.month, first.date.day, first.date.hour) == (2023, 5, 8, 13)
    assert all(s.date is not None for s in ds.sessions.values())
