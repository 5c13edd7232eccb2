"""Loaders against the committed synthetic fixtures: schema quirks, repairs and error messages.

The fixtures copy the official schemas and every malformed-evidence case of the real LoCoMo file,
so these tests pin down what a fresh clone (without ../shared) can check. Bad input must fail with
a DataError naming the file, the record and the field, which the tests read off the message.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsifter.data import dump_jsonl, load_dataset, load_jsonl, load_locomo, load_longmemeval
from memsifter.data.locomo import parse_evidence
from memsifter.errors import DataError, UnknownNameError

# ------------------------------------------------------------------------------------------
# helpers


def _raw(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _assert_where(err: DataError, file: Path | str, record: str | None, field: str | None) -> None:
    """The message itself (what a user sees) must locate the problem."""
    msg = str(err)
    assert f"file={file}" in msg
    if record is not None:
        assert f"record={record}" in msg
    if field is not None:
        assert f"field={field}" in msg


def test_fixtures_are_reproducible(fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed files are exactly what scripts/make_fixtures.py writes (no hand edits)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the script is executed.
    monkeypatch.setitem(sys.modules, "make_fixtures", module)
    spec.loader.exec_module(module)
    files = module.build_all()
    assert set(files) == {"locomo_mini.json", "longmemeval_mini.json", "users_mini.jsonl"}
    for name, text in files.items():
        assert (fixtures_dir / name).read_text(encoding="utf-8") == text, name
        assert len(text.encode("utf-8")) < 200_000


# ------------------------------------------------------------------------------------------
# LoCoMo


@pytest.fixture(scope="module")
def locomo(locomo_mini_path: Path):
    return load_locomo(locomo_mini_path)


def test_locomo_shapes(locomo, locomo_mini_path: Path) -> None:
    raw = _raw(locomo_mini_path)
    # No question is dropped, whatever its evidence looks like.
    assert len(locomo.queries) == sum(len(s["qa"]) for s in raw) == 24
    assert locomo.report.n_questions == 24
    # conv-m3 also lists a session_5_date_time with no session_5, as the release does.
    assert "session_5_date_time" in raw[2]["conversation"]
    assert {k: len(v) for k, v in locomo.conversations.items()} == {
        "conv-m1": 5,
        "conv-m2": 6,
        "conv-m3": 4,
    }
    assert locomo.report.n_sessions == 15
    q = locomo.queries[0]
    assert q.qid == "conv-m1/q0" and q.source == "locomo" and q.conversation_id == "conv-m1"
    assert [s.id for s in q.haystack] == [f"conv-m1/session_{n}" for n in range(1, 6)]
    assert q.category == "4"


@pytest.mark.parametrize(
    ("qid", "evidence", "gold"),
    [
        ("conv-m1/q3", ["D2:3; D3:1"], ("conv-m1/session_2", "conv-m1/session_3")),
        ("conv-m1/q2", ["D:3:3"], ("conv-m1/session_3",)),
        ("conv-m1/q5", [], ()),
        ("conv-m2/q3", ["D1:3 D2:3 D2:5"], ("conv-m2/session_1", "conv-m2/session_2")),
        ("conv-m2/q0", ["D1:3", "D", "D1:1"], ("conv-m2/session_1",)),
        ("conv-m2/q1", ["D99:1"], ()),
        ("conv-m3/q3", ["D2:3", "D3:1"], ("conv-m3/session_2", "conv-m3/session_3")),
    ],
)
def test_locomo_malformed_evidence(locomo, qid: str, evidence: list[str], gold: tuple) -> None:
    q = next(q for q in locomo.queries if q.qid == qid)
    assert q.meta["evidence"] == evidence
    assert q.gold_session_ids == gold
    assert q.has_evidence == bool(gold)


def test_locomo_report_counts_every_repair(locomo) -> None:
    report = locomo.report
    assert report.repaired_evidence == Counter({"D2:3; D3:1": 1, "D:3:3": 1, "D1:3 D2:3 D2:5": 1})
    assert report.unusable_evidence == Counter({"D": 1, "D99:* (no such session)": 1})
    assert report.no_evidence_qids == ["conv-m1/q5", "conv-m2/q1"]
    summary = report.summary()
    assert "24 questions" in summary and "2 questions without usable evidence" in summary
    assert "D99:* (no such session)" in summary


def test_locomo_adversarial_answer(locomo, locomo_mini_path: Path) -> None:
    raw = _raw(locomo_mini_path)
    by_qid = {q.qid: q for q in locomo.queries}
    n = 0
    for sample in raw:
        for j, item in enumerate(sample["qa"]):
            if item["category"] == 5:
                n += 1
                assert by_qid[f"{sample['sample_id']}/q{j}"].answer == item["adversarial_answer"]
    assert n == 6
    # The release has category-5 items carrying both fields; the adversarial one is the gold.
    both = by_qid["conv-m3/q6"]
    assert both.category == "5" and both.answer == "Yes"


def test_locomo_image_captions_kept_as_text(locomo, locomo_mini_path: Path) -> None:
    sessions = locomo.sessions
    shared = []
    for sample in _raw(locomo_mini_path):
        for key, value in sample["conversation"].items():
            if isinstance(value, list):
                turns = {t.turn_id: t for t in sessions[f"{sample['sample_id']}/{key}"].turns}
                shared += [(t, turns[t["dia_id"]]) for t in value if "blip_caption" in t]
    for raw_turn, turn in shared:
        assert turn.text == f"{raw_turn['text']} [shares an image: {raw_turn['blip_caption']}]"
        assert turn.speaker == raw_turn["speaker"]
    assert len(shared) == 6
    # Some released turns have a caption but no img_url; the caption is still kept.
    assert sum("img_url" not in t for t, _ in shared) == 1


def test_locomo_dates_parsed(locomo) -> None:
    s1 = locomo.conversations["conv-m1"][0]
    assert s1.date_text == "1:56 pm on 4 March, 2023"
    assert s1.date == datetime(2023, 3, 4, 13, 56)
    for conv in locomo.conversations.values():
        dates = [s.date for s in conv]
        assert all(d is not None for d in dates)
        assert dates == sorted(dates)  # type: ignore[type-var]
    assert s1.render().startswith("Date: 1:56 pm on 4 March, 2023\n")


def test_locomo_filter_conversations(locomo) -> None:
    sub = locomo.filter_conversations(["conv-m2", "2"])
    assert list(sub.conversations) == ["conv-m2", "conv-m3"]
    assert {q.conversation_id for q in sub.queries} == {"conv-m2", "conv-m3"}
    with pytest.raises(UnknownNameError, match="conv-nope"):
        locomo.filter_conversations(["conv-nope"])


def test_load_dataset_by_name(locomo_mini_path: Path) -> None:
    assert len(load_dataset("locomo", locomo_mini_path).queries) == 24
    with pytest.raises(UnknownNameError, match="unknown dataset 'nope'"):
        load_dataset("nope", locomo_mini_path)


# ------------------------------------------------------------------------------------------
# parse_evidence


def test_parse_evidence_examples() -> None:
    sessions, repaired, unusable = parse_evidence(["D1:2", "D:11:26", "D8:6; D9:17", "D", ""])
    assert sessions == [1, 11, 8, 9]
    assert repaired == Counter({"D:11:26": 1, "D8:6; D9:17": 1})
    assert unusable == Counter({"D": 1, "": 1})
    # Past int()'s 4300-digit limit: unusable, not a crash.
    huge = "D" + "1" * 5000 + ":1"
    assert parse_evidence([huge]) == ([], Counter(), Counter({huge: 1}))


# Built by composition: st.from_regex is ~30x slower and this must stay a fast test.
_ID = st.builds(
    lambda colon, n, m: f"D{colon}{n}:{m}",
    st.sampled_from(["", ":"]),
    st.integers(0, 999),
    st.integers(0, 999),
)
_IDS = st.tuples(st.lists(_ID, min_size=1, max_size=4), st.sampled_from(["; ", " ", ", ", ";"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(), _IDS.map(lambda t: t[1].join(t[0])))))
def test_parse_evidence_never_raises(items: list[str]) -> None:
    sessions, repaired, unusable = parse_evidence(items)
    assert all(isinstance(n, int) and n >= 0 for n in sessions)
    # Every string lands in exactly one place: strict id, repaired or unusable.
    strict = sum(1 for i in items if i.strip() not in repaired and i.strip() not in unusable)
    assert strict + sum(repaired.values()) + sum(unusable.values()) == len(items)


@settings(max_examples=100, deadline=None)
@given(_IDS)
def test_parse_evidence_reads_every_id(ids_sep: tuple[list[str], str]) -> None:
    ids, sep = ids_sep
    sessions, _, unusable = parse_evidence([sep.join(ids)])
    assert sessions == [int(i.removeprefix("D").lstrip(":").split(":")[0]) for i in ids]
    assert not unusable


# ------------------------------------------------------------------------------------------
# LongMemEval


@pytest.fixture(scope="module")
def lme(longmemeval_mini_path: Path):
    return load_longmemeval(longmemeval_mini_path)


def test_longmemeval_gold_and_abstention(lme, longmemeval_mini_path: Path) -> None:
    raw = _raw(longmemeval_mini_path)
    assert len(lme.queries) == len(raw) == 6
    for q, r in zip(lme.queries, raw, strict=True):
        assert q.qid == r["question_id"] and q.category == r["question_type"]
        assert q.answer == r["answer"] and q.question_date == r["question_date"]
        assert q.meta["answer_session_ids"] == r["answer_session_ids"]
        if r["question_id"].endswith("_abs"):
            # Unanswerable by design: kept, gold withheld from retrieval metrics.
            assert q.meta["abstention"] and q.gold_session_ids == ()
            assert r["answer_session_ids"]
        else:
            assert not q.meta["abstention"]
            assert q.gold_session_ids == tuple(r["answer_session_ids"])
    assert lme.report.no_evidence_qids == ["gpt4_0b2f1d8c_abs"]


def test_longmemeval_haystack_order_and_dates(lme, longmemeval_mini_path: Path) -> None:
    raw = _raw(longmemeval_mini_path)
    for q, r in zip(lme.queries, raw, strict=True):
        assert [s.id for s in q.haystack] == r["haystack_session_ids"]
        # Each record's own timeline, even for filler sessions shared with other records.
        assert [s.date_text for s in q.haystack] == r["haystack_dates"]
        dates = [s.date for s in q.haystack]
        assert dates == sorted(dates)  # type: ignore[type-var]
        first = q.haystack[0]
        assert first.turns[0].speaker == r["haystack_sessions"][0][0]["role"]
        assert first.turns[0].text == r["haystack_sessions"][0][0]["content"]
    assert lme.queries[0].haystack[0].date == datetime(2023, 5, 3, 4, 19)
    # Shared sessions really are shared in the fixture, on different dates.
    seen: dict[str, set[str]] = {}
    for r in raw:
        for sid, d in zip(r["haystack_session_ids"], r["haystack_dates"], strict=True):
            seen.setdefault(sid, set()).add(d)
    assert any(len(d) > 1 for d in seen.values())
    assert lme.report.n_sessions == len(seen) == 13


# ------------------------------------------------------------------------------------------
# JSONL


def test_jsonl_load(users_mini_path: Path) -> None:
    ds = load_jsonl(users_mini_path)
    assert [q.qid for q in ds.queries] == ["u1-q1", "u1-q2", "u1-q3", "u2-q1", "u2-q2"]
    by = {q.qid: q for q in ds.queries}
    # Default haystack: every session of the conversation, in file order.
    assert [s.id for s in by["u1-q1"].haystack] == ["u1-s1", "u1-s2", "u1-s3"]
    assert [s.id for s in by["u1-q2"].haystack] == ["u1-s2", "u1-s3"]
    assert by["u1-q3"].gold_session_ids == () and by["u1-q3"].answer == ""
    assert ds.report.no_evidence_qids == ["u1-q3"]
    s2 = ds.sessions["u1-s2"]
    assert s2.turns[0].timestamp == datetime(2024, 5, 9, 20, 10)
    assert s2.turns[0].turn_id == "u1-s2-t1"
    # Chinese text survives byte for byte.
    assert by["u2-q1"].question == "我上次去哪座山爬山了？" and by["u2-q1"].answer == "黄山"
    assert "黄山的云海很有名" in ds.sessions["u2-s1"].render()


def test_dump_jsonl_round_trip_locomo(locomo, tmp_path: Path) -> None:
    out = tmp_path / "locomo.jsonl"
    dump_jsonl(locomo, out)
    back = load_jsonl(out)
    # The JSONL format has no "source" field; everything else must survive.
    assert [dataclasses.replace(q, source="locomo") for q in back.queries] == locomo.queries
    assert back.conversations == locomo.conversations
    assert back.report.no_evidence_qids == locomo.report.no_evidence_qids


def test_dump_jsonl_round_trip_chinese(users_mini_path: Path, tmp_path: Path) -> None:
    ds = load_jsonl(users_mini_path)
    out = tmp_path / "users.jsonl"
    dump_jsonl(ds, out)
    assert "年糕" in out.read_text(encoding="utf-8")  # written as text, not \\u escapes
    back = load_jsonl(out)
    assert back.queries == ds.queries
    assert back.conversations == ds.conversations


# ------------------------------------------------------------------------------------------
# bad input


def test_locomo_missing_field(locomo_mini_path: Path, tmp_path: Path) -> None:
    data = _raw(locomo_mini_path)
    del data[0]["qa"][2]["question"]
    bad = _write_json(tmp_path / "bad.json", data)
    with pytest.raises(DataError, match="missing required field") as e:
        load_locomo(bad)
    _assert_where(e.value, bad, "conv-m1/qa_2", "question")


def test_locomo_wrong_type(locomo_mini_path: Path, tmp_path: Path) -> None:
    data = _raw(locomo_mini_path)
    data[1]["qa"][0]["category"] = "4"
    bad = _write_json(tmp_path / "bad.json", data)
    with pytest.raises(DataError, match="expected int, got str") as e:
        load_locomo(bad)
    _assert_where(e.value, bad, "conv-m2/qa_0", "category")


def test_locomo_bad_turn_and_date(locomo_mini_path: Path, tmp_path: Path) -> None:
    data = _raw(locomo_mini_path)
    del data[0]["conversation"]["session_2"][1]["speaker"]
    bad = _write_json(tmp_path / "bad.json", data)
    with pytest.raises(DataError) as e:
        load_locomo(bad)
    _assert_where(e.value, bad, "conv-m1/session_2/turn_1", "speaker")

    data = _raw(locomo_mini_path)
    data[2]["conversation"]["session_3_date_time"] = "sometime"
    bad = _write_json(tmp_path / "bad2.json", data)
    with pytest.raises(DataError, match="unparseable date 'sometime'") as e:
        load_locomo(bad)
    _assert_where(e.value, bad, "conv-m3", "session_3_date_time")


def test_longmemeval_wrong_type_and_unknown_session(
    longmemeval_mini_path: Path, tmp_path: Path
) -> None:
    data = _raw(longmemeval_mini_path)
    data[1]["haystack_dates"] = "2023/05/20"
    bad = _write_json(tmp_path / "bad.json", data)
    with pytest.raises(DataError, match="expected list, got str") as e:
        load_longmemeval(bad)
    _assert_where(e.value, bad, "2ce6a0f2", "haystack_dates")

    data = _raw(longmemeval_mini_path)
    data[0]["answer_session_ids"] = ["answer_nope"]
    bad = _write_json(tmp_path / "bad2.json", data)
    with pytest.raises(DataError, match="answer_nope") as e:
        load_longmemeval(bad)
    _assert_where(e.value, bad, "e47becba", "answer_session_ids")

    data = _raw(longmemeval_mini_path)
    del data[2]["haystack_sessions"][0][1]["content"]
    bad = _write_json(tmp_path / "bad3.json", data)
    sid = data[2]["haystack_session_ids"][0]
    with pytest.raises(DataError, match="missing required field") as e:
        load_longmemeval(bad)
    _assert_where(e.value, bad, f"gpt4_93f6379c/{sid}/turn_1", "content")


def test_jsonl_errors_name_the_line(users_mini_path: Path, tmp_path: Path) -> None:
    lines = users_mini_path.read_text(encoding="utf-8").splitlines()

    def write(name: str, new_lines: list[str]) -> Path:
        p = tmp_path / name
        p.write_text("\n".join(new_lines) + "\n", encoding="utf-8")
        return p

    unknown = json.loads(lines[7])
    unknown["haystack"] = ["u1-s2", "no-such-session"]
    bad = write("unknown.jsonl", [*lines[:7], json.dumps(unknown)])
    with pytest.raises(DataError, match=r"unknown session ids \['no-such-session'\]") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 8", "haystack")

    wrong = json.loads(lines[0])
    wrong["turns"] = "hello"
    bad = write("wrong.jsonl", [json.dumps(wrong)])
    with pytest.raises(DataError, match="expected list, got str") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 1", "turns")

    missing = json.loads(lines[3])
    del missing["turns"][1]["speaker"]
    bad = write("missing.jsonl", [lines[0], "", json.dumps(missing, ensure_ascii=False)])
    with pytest.raises(DataError, match="missing required field") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 3 turn 1", "speaker")

    bad = write("invalid.jsonl", [lines[0], lines[1], '{"type": "session", "id": '])
    with pytest.raises(DataError, match="invalid JSON") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 3", None)

    bad = write("dup.jsonl", [lines[0], lines[0]])
    with pytest.raises(DataError, match="duplicate session id 'u1-s1'") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 2", "id")

    bad = write("kind.jsonl", ['{"type": "memo", "id": "x"}'])
    with pytest.raises(DataError, match="unknown record type 'memo'") as e:
        load_jsonl(bad)
    _assert_where(e.value, bad, "line 1", "type")


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval, load_jsonl])
def test_invalid_json(loader, tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('[{"sample_id": "x",\n  "qa": [', encoding="utf-8")
    with pytest.raises(DataError, match="invalid JSON") as e:
        loader(bad)
    _assert_where(e.value, bad, None, None)


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('[\n  {"sample_id": "x",,}\n]', encoding="utf-8")
    with pytest.raises(DataError, match="invalid JSON at line 2 col") as e:
        load_locomo(bad)
    _assert_where(e.value, bad, None, None)


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval, load_jsonl])
def test_not_utf8(loader, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes('[{"sample_id": "café"}]\n'.encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8") as e:
        loader(bad)
    _assert_where(e.value, bad, None, None)


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval, load_jsonl])
def test_missing_file(loader, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match="file not found") as e:
        loader(missing)
    _assert_where(e.value, missing, None, None)


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval])
def test_top_level_not_a_list(loader, tmp_path: Path) -> None:
    bad = _write_json(tmp_path / "obj.json", {"qa": []})
    with pytest.raises(DataError, match="expected a list") as e:
        loader(bad)
    _assert_where(e.value, bad, None, None)


def test_pages_keep_dates_and_map_turn_evidence(locomo_mini_path: Path) -> None:
    from memsifter.data.types import Page
    from memsifter.data.units import page_session, to_units

    q = next(q for q in load_locomo(locomo_mini_path).queries if q.gold_session_ids)
    paged = to_units(q, "page", turns_per_page=2)
    assert sum(len(s.turns) for s in paged.haystack) == sum(len(s.turns) for s in q.haystack)
    assert all(len(p.turns) <= 2 for p in paged.haystack)
    by_id = {s.id: s for s in q.haystack}
    for p in paged.haystack:
        assert isinstance(p, Page) and p.session_id == p.id.split("#")[0]
        session = by_id[p.session_id]
        assert p.date_text == session.date_text
        assert session.turns[p.first_turn : p.first_turn + len(p.turns)] == p.turns
    assert paged.gold_session_ids
    assert {g.split("#")[0] for g in paged.gold_session_ids} <= set(q.gold_session_ids)
    evidence = set(q.meta["evidence"])
    if not paged.meta["session_level_gold"]:
        for g in paged.gold_session_ids:
            page = next(p for p in paged.haystack if p.id == g)
            assert any(t.turn_id in evidence for t in page.turns)
    assert to_units(q, "session") is q
    with pytest.raises(ValueError, match="turns_per_page"):
        page_session(q.haystack[0], 0)
