"""parse_ranking: every documented rule as a table row, plus fuzzing that it never raises and
that its counts and ids are right for generated answers with noise."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsifter.ranker import ParsedRanking, ParseErrorKind, parse_ranking

E = ParseErrorKind

# (text, num_sessions, ids, error, dropped, duplicates)
CASES: list[tuple[str, int, tuple[int, ...], ParseErrorKind | None, int, int]] = [
    ("<think>because</think><ranking>2, 0, 1</ranking>", 3, (2, 0, 1), None, 0, 0),
    ("<ranking>1,0</ranking>", 2, (1, 0), None, 0, 0),
    ("<ranking>3 1\n2</ranking>", 4, (3, 1, 2), None, 0, 0),
    ("<ranking>\n  3,\n  1\n</ranking>", 4, (3, 1), None, 0, 0),
    ("<ranking>[3; 1; 0]</ranking>", 4, (3, 1, 0), None, 0, 0),
    ("<ranking>(2), {0}</ranking>", 3, (2, 0), None, 0, 0),
    ("<ranking>2，0、1；3</ranking>", 4, (2, 0, 1, 3), None, 0, 0),
    ("<ranking>[Session 2], Session 0, session1</ranking>", 3, (2, 0, 1), None, 0, 0),
    ("<ranking>01, 002</ranking>", 3, (1, 2), None, 0, 0),
    ("<ranking>1, 1, 0, 1</ranking>", 2, (1, 0), None, 0, 2),
    ("<ranking>5, 1, -1, 2.5, x</ranking>", 3, (1,), None, 4, 0),
    ("<ranking>99999999999999999999, 0</ranking>", 3, (0,), None, 1, 0),
    ("<ranking>Session</ranking>", 3, (), E.NO_VALID_IDS, 1, 0),
    ("<ranking>３</ranking>", 5, (), E.NO_VALID_IDS, 1, 0),  # full-width digit is not an id
    ("<ranking>7, 9</ranking>", 3, (), E.NO_VALID_IDS, 2, 0),
    ("<ranking>0</ranking>", 0, (), E.NO_VALID_IDS, 1, 0),
    ("<ranking></ranking>", 3, (), E.EMPTY_RANKING, 0, 0),
    ("<ranking> , ;\n</ranking>", 3, (), E.EMPTY_RANKING, 0, 0),
    ("", 3, (), E.MISSING_RANKING, 0, 0),
    ("<think>hmm</think>I think 2 is best", 3, (), E.MISSING_RANKING, 0, 0),
    ("1, 2</ranking>", 3, (), E.MISSING_RANKING, 0, 0),
    ("<think>x</think><ranking>1, 2", 3, (), E.UNCLOSED_RANKING, 0, 0),
    # A ranking drafted inside the reasoning is not the answer...
    (
        "<think>draft <ranking>0, 1</ranking> no</think><ranking>1, 0</ranking>",
        2,
        (1, 0),
        None,
        0,
        0,
    ),
    # ...and when it is the only one, there is no answer.
    ("<think><ranking>0</ranking></think>", 3, (), E.MISSING_RANKING, 0, 0),
    # Anything after the last </think> is the answer, so a stray closing tag after the ranking
    # leaves nothing to read: strict on purpose, the reward must not guess.
    ("<think>a</think><ranking>0</ranking></think>", 3, (), E.MISSING_RANKING, 0, 0),
    # The last complete block wins; a half-written one after it does not count.
    ("</think><ranking>0</ranking> wait <ranking>1, 2</ranking>", 3, (1, 2), None, 0, 0),
    ("<ranking>0, 1</ranking><ranking>2", 3, (0, 1), None, 0, 0),
    ("<ranking>0 <ranking>1</ranking>", 3, (1,), None, 0, 0),
    ("<ranking>1</ranking> and also 2", 3, (1,), None, 0, 0),
]


@pytest.mark.parametrize(("text", "n", "ids", "error", "dropped", "duplicates"), CASES)
def test_table(
    text: str,
    n: int,
    ids: tuple[int, ...],
    error: ParseErrorKind | None,
    dropped: int,
    duplicates: int,
) -> None:
    parsed = parse_ranking(text, n)
    assert (parsed.ids, parsed.error, parsed.dropped, parsed.duplicates) == (
        ids,
        error,
        dropped,
        duplicates,
    )
    assert parsed.ok is (error is None)
    assert parsed.n_from_model == len(ids)
    assert parsed.completed_from is None


@pytest.mark.parametrize(
    ("text", "think", "unclosed"),
    [
        ("<think>  because  </think><ranking>0</ranking>", "because", False),
        ("<think></think><ranking>0</ranking>", "", False),
        ("<ranking>0</ranking>", None, False),
        # The chat template opened <think> in the prompt (DeepSeek-R1 style).
        ("reasoning here</think><ranking>0</ranking>", "reasoning here", False),
        ("<think>用户问的是猫</think><ranking>0</ranking>", "用户问的是猫", False),
        # Never closed, but a complete ranking follows: accepted, and flagged.
        ("<think>reasoning <ranking>0</ranking>", "reasoning", True),
        # Never closed and nothing follows: generation ran out while thinking.
        ("<think>still thinking...", "still thinking...", True),
        ("<think>a <ranking>0</ranking> b</think>", "a <ranking>0</ranking> b", False),
    ],
)
def test_think(text: str, think: str | None, unclosed: bool) -> None:
    parsed = parse_ranking(text, 1)
    assert parsed.think == think
    assert parsed.unclosed_think is unclosed


def test_unclosed_think_is_ok_but_not_clean() -> None:
    parsed = parse_ranking("<think>r <ranking>1, 0</ranking>", 2)
    assert parsed.ok and parsed.ids == (1, 0)
    assert not parsed.clean
    assert parse_ranking("<think>r</think><ranking>1, 0</ranking>", 2).clean
    assert not parse_ranking("<ranking>1, 1, 0</ranking>", 2).clean
    assert not parse_ranking("<ranking>1, 7, 0</ranking>", 2).clean


def test_error_kinds_are_stable_strings() -> None:
    parsed = parse_ranking("no tags", 3)
    assert parsed.error == "missing_ranking"
    assert isinstance(parsed.error, str)
    assert {k.value for k in ParseErrorKind} == {
        "missing_ranking",
        "unclosed_ranking",
        "empty_ranking",
        "no_valid_ids",
    }


def test_negative_num_sessions_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="num_sessions"):
        parse_ranking("<ranking>0</ranking>", -1)


# --- complete() --------------------------------------------------------------------------------


def test_complete_appends_in_fallback_order_and_keeps_the_record() -> None:
    parsed = parse_ranking("<think>t</think><ranking>3, 1</ranking>", 5)
    done = parsed.complete([4, 1, 0, 3, 2])
    assert done.ids == (3, 1, 4, 0, 2)
    assert done.completed_from == "coarse"
    assert done.n_from_model == 2
    assert done.ok and done.think == "t"
    assert parsed.ids == (3, 1)  # frozen: the original is untouched


def test_complete_keeps_the_error_visible() -> None:
    parsed = parse_ranking("<think>out of tokens", 3)
    done = parsed.complete([2, 0, 1], source="bm25")
    assert done.ids == (2, 0, 1)
    assert done.error is ParseErrorKind.MISSING_RANKING
    assert not done.ok  # a reward must still see a failure
    assert done.completed_from == "bm25"
    assert done.n_from_model == 0


def test_complete_fills_what_the_fallback_misses_in_prompt_order() -> None:
    parsed = parse_ranking("<ranking>2</ranking>", 5)
    assert parsed.complete([4, 4]).ids == (2, 4, 0, 1, 3)
    assert parsed.complete([]).ids == (2, 0, 1, 3, 4)


def test_complete_on_a_full_ranking_is_a_no_op() -> None:
    parsed = parse_ranking("<ranking>1, 0</ranking>", 2)
    assert parsed.complete([0, 1]) is parsed
    assert parsed.completed_from is None


def test_complete_rejects_positions_out_of_range() -> None:
    with pytest.raises(ValueError, match="outside 0..1"):
        parse_ranking("<ranking>0</ranking>", 2).complete([5])


# --- fuzzing -----------------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<ranking>",
        "</ranking>",
        "<rank",
        "ing>",
        "Session ",
        "0",
        "3",
        "17",
        "-2",
        ", ",
        ";",
        "\n",
        " ",
        "[",
        "]",
        "，",
        "x",
        "9999999999999999999999",
    ]
)
_MESSY = st.lists(_FRAGMENTS | st.text(max_size=4), max_size=40).map("".join)


def _check_invariants(parsed: ParsedRanking, n: int) -> None:
    assert len(set(parsed.ids)) == len(parsed.ids)
    assert all(0 <= i < n for i in parsed.ids)
    assert parsed.ok is (parsed.error is None)
    if not parsed.ok:
        assert parsed.ids == ()
    assert parsed.n_from_model == len(parsed.ids)
    assert parsed.dropped >= 0 and parsed.duplicates >= 0


@settings(max_examples=300, deadline=None)
@given(text=st.text() | _MESSY, n=st.integers(0, 40))
def test_fuzz_never_raises(text: str, n: int) -> None:
    parsed = parse_ranking(text, n)
    _check_invariants(parsed, n)
    done = parsed.complete(range(n))
    assert sorted(done.ids) == list(range(n))
    assert done.ids[: len(parsed.ids)] == parsed.ids


_SEPARATORS = st.sampled_from([", ", ",", " ", "\n", "; ", "，", " ,\n"])
_NOISE_WORDS = st.sampled_from(["x", "foo", "2.5", "-1", "#", "abc", "1e3", "n/a", "?", "３"])


@st.composite
def _noisy_ranking(draw: st.DrawFn) -> tuple[str, int, tuple[int, ...], int, int]:
    n = draw(st.integers(1, 30))
    items: list[str] = []
    expected: list[int] = []
    dropped = duplicates = 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["id", "id", "id", "out", "word"]))
        if kind == "id":
            pos = draw(st.integers(0, n - 1))
            items.append(draw(st.sampled_from([str(pos), f"Session {pos}", f"[{pos}]"])))
            if pos in expected:
                duplicates += 1
            else:
                expected.append(pos)
        elif kind == "out":
            items.append(str(draw(st.integers(n, 10**6))))
            dropped += 1
        else:
            items.append(draw(_NOISE_WORDS))
            dropped += 1
    body = "".join(item + draw(_SEPARATORS) for item in items)
    return body, n, tuple(expected), dropped, duplicates


@settings(max_examples=200, deadline=None)
@given(case=_noisy_ranking(), think=st.text(max_size=30).filter(lambda t: "think>" not in t))
def test_fuzz_counts_noise(case: tuple[str, int, tuple[int, ...], int, int], think: str) -> None:
    body, n, expected, dropped, duplicates = case
    parsed = parse_ranking(f"<think>{think}</think>\n<ranking>{body}</ranking>", n)
    _check_invariants(parsed, n)
    assert parsed.dropped == dropped
    assert parsed.duplicates == duplicates
    if expected:
        assert parsed.ok and parsed.ids == expected
    else:
        assert parsed.error is ParseErrorKind.NO_VALID_IDS


@settings(max_examples=200, deadline=None)
@given(
    perm=st.integers(1, 60).flatmap(lambda n: st.permutations(list(range(n)))),
    think=st.text().filter(lambda t: "think>" not in t),
    sep=_SEPARATORS,
)
def test_fuzz_round_trip(perm: list[int], think: str, sep: str) -> None:
    text = f"<think>{think}</think><ranking>{sep.join(map(str, perm))}</ranking>"
    parsed = parse_ranking(text, len(perm))
    assert parsed.ids == tuple(perm)
    assert parsed.think == think.strip()
    assert parsed.clean


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 30),
)
def test_fuzz_complete(data: st.DataObject, n: int) -> None:
    given_ids = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    fallback = data.draw(st.permutations(list(range(n))))
    parsed = parse_ranking(f"<ranking>{', '.join(map(str, given_ids))}</ranking>", n)
    done = parsed.complete(fallback)
    assert sorted(done.ids) == list(range(n))
    assert done.ids[: len(given_ids)] == tuple(given_ids)
    rest = done.ids[len(given_ids) :]
    assert list(rest) == [p for p in fallback if p not in given_ids]
    assert done.error == parsed.error
    assert (done.completed_from == "coarse") is bool(rest)
