"""The paper's reward definitions: Fibonacci tiers and weights, the marginal-utility answer reward,
the NDCG retrieval reward and the warm-up shaping schedule, by hand-computed values and by
hypothesis properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memsifter.ir_metrics import evaluate_rankings
from memsifter.rewards import (
    ShapingSchedule,
    fibonacci_tiers,
    marginal_utility,
    position_value,
    retrieval_reward,
    retrieval_rewards,
    tier_weights,
)

scores = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
tier_sets = st.lists(st.integers(1, 200), min_size=1, max_size=12, unique=True).map(
    lambda xs: tuple(sorted(xs))
)


def test_fibonacci_tiers() -> None:
    assert fibonacci_tiers(8) == (1, 2, 3, 5, 8)
    assert fibonacci_tiers(1) == (1,)  # the sequence's two 1s are one tier
    assert fibonacci_tiers(4) == (1, 2, 3)
    assert fibonacci_tiers(13) == (1, 2, 3, 5, 8, 13)
    assert fibonacci_tiers(20) == (1, 2, 3, 5, 8, 13)
    with pytest.raises(ValueError):
        fibonacci_tiers(0)


def test_tier_weights_are_the_papers_by_default_and_the_official_codes_as_tail() -> None:
    w = tier_weights((1, 2, 3, 5, 8))
    # The paper's published w_1 ... w_8: every tier against the next Fibonacci number.
    assert [round(x, 4) for x in w] == [0.3691, 0.1309, 0.1131, 0.0714, 0.0528]
    assert w[-1] == position_value(8) - position_value(13)
    assert w == tier_weights((1, 2, 3, 5, 8, 13))[:5]  # a deeper list only adds tiers
    assert round(w[0] / w[-1], 1) == 7.0  # top-1 weighs 7x top-8
    tail = tier_weights((1, 2, 3, 5, 8), "tail")
    assert [round(x, 4) for x in tail] == [0.3691, 0.1309, 0.1131, 0.0714, 0.3155]
    assert tail[-1] == position_value(8)
    assert tier_weights((1,)) == (1 - position_value(2),)
    assert position_value(1) == 1.0
    for bad in ((), (0, 1), (2, 2), (3, 1)):
        with pytest.raises(ValueError):
            tier_weights(bad)
    with pytest.raises(ValueError, match="paper"):
        tier_weights((1, 2), "official")


@given(tier_sets)
def test_weights_sum_to_their_span(tiers: tuple[int, ...]) -> None:
    nxt = tiers[-1] + (tiers[-2] if len(tiers) > 1 else 1)
    paper = tier_weights(tiers)
    assert all(x > 0 for x in paper)
    # paper: C(first) - C(next after the last); tail telescopes to C(first).
    want = position_value(tiers[0]) - position_value(nxt)
    assert math.isclose(sum(paper), want, rel_tol=1e-12)
    tail = tier_weights(tiers, "tail")
    assert math.isclose(sum(tail), position_value(tiers[0]), rel_tol=1e-12)


@given(st.integers(1, 10_000))
def test_fibonacci_tail_weights_sum_to_one(max_k: int) -> None:
    assert math.isclose(sum(tier_weights(fibonacci_tiers(max_k), "tail")), 1.0, rel_tol=1e-12)


def test_hand_computed_example() -> None:
    s = {0: 0.2, 1: 0.4, 2: 0.5, 3: 0.6, 5: 0.7, 8: 0.8}

    def c(k: int) -> float:
        return 1 / math.log2(k + 1)

    head = (
        (c(1) - c(2)) * (0.4 - 0.2)
        + (c(2) - c(3)) * (0.5 - 0.2)
        + (c(3) - c(5)) * (0.6 - 0.2)
        + (c(5) - c(8)) * (0.7 - 0.2)
    )
    paper = head + (c(8) - c(13)) * (0.8 - 0.2)
    tail = head + c(8) * (0.8 - 0.2)
    assert marginal_utility(s) == pytest.approx(paper, abs=1e-15)
    assert round(marginal_utility(s), 4) == 0.2257
    assert marginal_utility(s, weights="tail") == pytest.approx(tail, abs=1e-15)
    assert round(marginal_utility(s, weights="tail"), 4) == 0.3833
    # Tier k = 1 counts (the official loop drops it): without it the value would be far lower.
    assert marginal_utility(s) - marginal_utility({k: v for k, v in s.items() if k != 1}) > 0.05


def test_the_paper_weights_care_where_the_useful_session_sits() -> None:
    """One useful session raises the score from 0 to 1 from the tier that first shows it: at
    rank 1 versus rank 8, paper weights pay 0.7374 vs 0.0528 (14x), tail weights 1 vs 0.3155."""
    tiers = (1, 2, 3, 5, 8)

    def useful_at(rank: int, weights: str) -> float:
        return marginal_utility({0: 0.0, **{k: float(k >= rank) for k in tiers}}, weights=weights)

    assert round(useful_at(1, "paper"), 4) == 0.7374
    assert round(useful_at(8, "paper"), 4) == 0.0528
    assert round(useful_at(1, "tail"), 4) == 1.0
    assert round(useful_at(8, "tail"), 4) == 0.3155


@given(scores, st.integers(1, 10_000))
def test_no_gain_no_reward(s0: float, max_k: int) -> None:
    tiers = fibonacci_tiers(max_k)
    assert marginal_utility({0: s0, **dict.fromkeys(tiers, s0)}) == 0.0


@given(scores, st.floats(0.01, 1.0), st.integers(2, 10_000), st.data())
def test_earlier_gain_earns_more(s0: float, gain: float, max_k: int, data: st.DataObject) -> None:
    """A score that rises at tier k and stays up earns gain * (C(k) - C(F_{N+1})) (paper
    weights; gain * C(k) with tail weights): more the smaller k is."""
    tiers = fibonacci_tiers(max_k)
    i = data.draw(st.integers(0, len(tiers) - 2))
    j = data.draw(st.integers(i + 1, len(tiers) - 1))

    def step_at(n: int) -> float:
        return marginal_utility({0: s0, **{k: s0 + gain * (t >= n) for t, k in enumerate(tiers)}})

    assert step_at(i) > step_at(j)
    nxt = tiers[-1] + (tiers[-2] if len(tiers) > 1 else 1)
    want = gain * (position_value(tiers[i]) - position_value(nxt))
    assert step_at(i) == pytest.approx(want, rel=1e-9, abs=1e-12)


@given(st.lists(scores, min_size=6, max_size=6), st.integers(0, 4), st.floats(1e-3, 1.0))
def test_raising_any_tier_score_raises_reward(values: list[float], tier: int, delta: float) -> None:
    s = dict(zip((0, 1, 2, 3, 5, 8), values, strict=True))
    k = (1, 2, 3, 5, 8)[tier]
    higher = {**s, k: s[k] + delta}
    assert marginal_utility(higher) > marginal_utility(s)


def test_marginal_utility_needs_s0_and_a_tier() -> None:
    with pytest.raises(ValueError, match="s_0"):
        marginal_utility({1: 0.5})
    with pytest.raises(ValueError, match="no tier"):
        marginal_utility({0: 0.5})


# -- R_ret --------------------------------------------------------------------------------------


def test_retrieval_reward_values() -> None:
    assert retrieval_reward([3, 1, 2], {3}) == 1.0
    assert retrieval_reward([1, 3, 2], {3}) == pytest.approx(1 / math.log2(3))
    assert retrieval_reward([1, 2], {3}) == 0.0  # gold never ranked
    assert retrieval_reward([], {3}) == 0.0
    assert retrieval_reward([1, 2], set()) == 0.0  # nothing to find
    assert retrieval_rewards([], {1}) == []
    # Beyond the cutoff nothing counts.
    assert retrieval_reward(list(range(20)), {15}, k=10) == 0.0
    # Same numbers as the retrieval benchmark's metrics for the same ranking.
    ranking = ["s4", "s1", "s7", "s2"]
    bench = evaluate_rankings({"q": ranking}, {"q": ["s1", "s2"]}, cutoffs=(10,))
    assert retrieval_reward(ranking, ["s1", "s2"]) == bench["ndcg@10"]


@settings(max_examples=200)
@given(st.permutations(list(range(12))), st.sets(st.integers(0, 11), min_size=1), st.data())
def test_moving_gold_up_never_lowers_r_ret(
    ranking: list[int], gold: set[int], data: st.DataObject
) -> None:
    base = retrieval_reward(ranking, gold)
    assert 0.0 <= base <= 1.0
    p = data.draw(st.sampled_from([i for i, x in enumerate(ranking) if x in gold]))
    q = data.draw(st.integers(0, p))
    moved = ranking[:q] + [ranking[p]] + ranking[q:p] + ranking[p + 1 :]
    assert retrieval_reward(moved, gold) >= base - 1e-12


# -- shaping ------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_endpoints(schedule: str) -> None:
    s = ShapingSchedule(alpha=1.0, beta0=0.8, decay_steps=100, schedule=schedule)  # type: ignore[arg-type]
    assert s.beta(0) == 0.8
    assert s.beta(50) == pytest.approx(0.4)  # both schedules cross half-way at half time
    assert s.beta(100) == 0.0 and s.beta(10_000) == 0.0
    betas = [s.beta(t) for t in range(0, 101)]
    assert all(a >= b for a, b in zip(betas, betas[1:], strict=False))
    assert 0.0 < s.beta(99) < 0.8


def test_schedule_shapes_differ_and_validate() -> None:
    lin = ShapingSchedule(beta0=1.0, decay_steps=100, schedule="linear")
    cos = ShapingSchedule(beta0=1.0, decay_steps=100, schedule="cosine")
    assert cos.beta(10) > lin.beta(10) and cos.beta(90) < lin.beta(90)
    assert ShapingSchedule(beta0=1.0, decay_steps=0).beta(0) == 0.0  # no warm-up
    with pytest.raises(ValueError):
        ShapingSchedule(schedule="step")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        lin.beta(-1)


@given(
    st.floats(-2, 2),
    st.floats(-1, 1),
    st.floats(0, 1),
    st.floats(0, 3),
    st.integers(0, 500),
    st.sampled_from(["linear", "cosine"]),
)
@example(0.0, 0.0, 1.0, 5e-324, 0, "cosine")  # a subnormal beta_0 once rounded to 0 at step 0
def test_shaping_at_beta_zero_is_alpha_r_ans(
    alpha: float, r_ans: float, r_ret: float, beta0: float, extra: int, schedule: str
) -> None:
    s = ShapingSchedule(alpha, beta0, 50, schedule)  # type: ignore[arg-type]
    assert s.combine(r_ans, r_ret, 50 + extra) == alpha * r_ans
    assert s.combine(r_ans, r_ret, 0) == alpha * r_ans + beta0 * r_ret


def test_decay_fraction_is_sized_to_the_run() -> None:
    frac = ShapingSchedule(beta0=1.0, decay_steps=None, decay_fraction=0.25)
    assert not frac.resolved
    with pytest.raises(ValueError, match="for_run"):
        frac.beta(0)  # the run's length is unknown: no guessing
    run = frac.for_run(100)
    assert run.resolved and run.decay_steps == 25 and run.decay_fraction is None
    assert run.beta(0) == 1.0 and run.beta(24) > 0.0 and run.beta(25) == 0.0
    assert frac.for_run(400).decay_steps == 100
    # ceil, without float noise: 0.3 * 10 is 3.0000000000000004 in floats.
    assert ShapingSchedule(decay_steps=None, decay_fraction=0.3).for_run(10).decay_steps == 3
    assert ShapingSchedule(decay_steps=None, decay_fraction=0.01).for_run(10).decay_steps == 1
    assert ShapingSchedule(decay_steps=None, decay_fraction=1.0).for_run(7).decay_steps == 7
    fixed = ShapingSchedule(decay_steps=50)
    assert fixed.for_run(1000) is fixed  # decay_steps keeps working, whatever the run
    with pytest.raises(ValueError, match="both set"):
        ShapingSchedule(decay_steps=10, decay_fraction=0.5)
    with pytest.raises(ValueError, match="set decay_steps or decay_fraction"):
        ShapingSchedule(decay_steps=None)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="decay_fraction must be in"):
            ShapingSchedule(decay_steps=None, decay_fraction=bad)
    with pytest.raises(ValueError, match="total_steps"):
        frac.for_run(0)
