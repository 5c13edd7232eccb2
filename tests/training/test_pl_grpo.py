"""The PL-GRPO estimator: the prefix the reward reads, the per-place ratio, the prefix KL.

Exact checks on tiny score vectors (enumerating every ranking where a probability is needed),
plus the contract with the reward service that makes a prefix safe to hand over: a ranking cut
at the depth :func:`reward_depth` names is paid exactly what the whole ranking is paid."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import pytest
import torch

from memsifter.errors import DataError
from memsifter.qa.answerer import Answerer
from memsifter.ranker.first_token import (
    gumbel_topk,
    pl_log_prob,
    pl_place_log_probs,
    pl_prefix_kl,
    ranking_text,
)
from memsifter.rewards import RewardConfig, RewardRequest, RewardService
from memsifter.rewards.marginal_utility import marginal_utility_to_go
from memsifter.testing.rewards import FakeWorkingLLM, fact_sessions
from memsifter.training.config import GRPOSettings, TrainConfig
from memsifter.training.pl_grpo import (
    PLGRPOTrainer,
    group_advantages,
    pl_grpo_loss,
    place_advantages,
    reward_depth,
)

PINF = float("-inf")


def _prefixes(n: int, k: int) -> list[tuple[int, ...]]:
    return list(itertools.permutations(range(n), k))


def test_place_terms_sum_to_log_pl_and_a_prefix_is_its_marginal() -> None:
    scores = torch.tensor([[0.3, -1.2, 2.0, 0.5]])
    full = torch.tensor([[list(p) for p in _prefixes(4, 4)]])
    places = pl_place_log_probs(scores, full)
    assert torch.allclose(places.sum(-1), pl_log_prob(scores, full))
    # P(top-2 = (a, b)) is the sum of P(σ) over the full rankings that start with (a, b).
    top2 = pl_log_prob(scores, full[..., :2]).exp()[0]
    by_prefix: dict[tuple[int, int], float] = {}
    for perm, p in zip(full[0].tolist(), pl_log_prob(scores, full).exp()[0].tolist(), strict=True):
        by_prefix[tuple(perm[:2])] = by_prefix.get(tuple(perm[:2]), 0.0) + p
    for perm, p in zip(full[0].tolist(), top2.tolist(), strict=True):
        assert p == pytest.approx(by_prefix[tuple(perm[:2])], rel=1e-5)


def _exact_prefix_kl(p: torch.Tensor, q: torch.Tensor, k: int) -> float:
    """KL of the two top-k distributions, by enumerating every top-k."""
    pre = torch.tensor([[list(x) for x in _prefixes(p.shape[-1], k)]])
    lp, lq = pl_log_prob(p, pre)[0], pl_log_prob(q, pre)[0]
    return float((lp.exp() * (lp - lq)).sum())


def test_prefix_kl_is_the_chain_rule_kl_zero_at_the_reference() -> None:
    p = torch.tensor([[0.3, -1.2, 2.0, 0.5, 0.0]])
    q = torch.tensor([[1.0, 0.2, -0.5, 0.5, -1.0]])
    k = 3
    pre = torch.tensor([[list(x) for x in _prefixes(5, k)]])
    weights = pl_log_prob(p, pre).exp()[0]  # P(σ) of each drawn prefix
    estimate = (pl_prefix_kl(p, q, pre).sum(-1)[0] * weights).sum()
    # E_{σ ~ P}[Σ_j KL_j] is exactly the prefix's KL: the estimator is unbiased.
    assert float(estimate) == pytest.approx(_exact_prefix_kl(p, q, k), rel=1e-5)
    assert float(estimate) > 0
    assert torch.allclose(pl_prefix_kl(p, p, pre), torch.zeros(1, len(pre[0]), k), atol=1e-6)
    # The first place alone is the head's first-place KL.
    lp, lq = torch.log_softmax(p, -1), torch.log_softmax(q, -1)
    first = float((lp.exp() * (lp - lq)).sum())
    assert float(pl_prefix_kl(p, q, pre)[0, 0, 0]) == pytest.approx(first, rel=1e-5)


def test_prefix_kl_gradient_is_finite_with_padded_candidates() -> None:
    p = torch.tensor([[0.3, -1.2, 2.0, PINF, PINF], [1.0, 0.0, -1.0, 0.5, 0.2]], requires_grad=True)
    q = torch.tensor([[0.0, 0.1, 0.2, PINF, PINF], [0.0, 0.0, 0.0, 0.0, 0.0]])
    drawn = gumbel_topk(p, 6, k=3, generator=torch.Generator().manual_seed(0))
    assert (drawn[0] < 3).all()  # padding is never inside a row's prefix
    kl = pl_prefix_kl(p, q, drawn)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and (kl >= -1e-6).all()
    assert torch.isfinite(p.grad).all()
    assert (p.grad[0, 3:] == 0).all()  # padding gets no gradient


def test_first_iteration_gradient_is_minus_a_grad_log_pl_of_the_prefix() -> None:
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 7, generator=gen, requires_grad=True)
    drawn = gumbel_topk(scores, 5, k=4, generator=gen)
    adv = torch.randn(3, 5, generator=gen)
    depths = torch.tensor([4, 2, 3])
    mask = (torch.arange(4)[None, :] < depths[:, None]).float().unsqueeze(1)
    logp = pl_place_log_probs(scores, drawn)
    loss = pl_grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28)
    (got,) = torch.autograd.grad(loss, scores)
    want_loss = 0.0
    for b, d in enumerate(depths.tolist()):
        want_loss = (
            want_loss - (adv[b] * pl_log_prob(scores[b : b + 1], drawn[b : b + 1, :, :d])[0]).sum()
        )
    (want,) = torch.autograd.grad(want_loss / adv.numel(), scores)
    assert torch.allclose(got, want, atol=1e-6)


def test_each_place_is_clipped_on_its_own() -> None:
    """A place whose ratio left the trust region stops pulling (A > 0, ρ_j > 1 + ε_high); the
    others still do. A whole-ranking ratio would have clipped every place at once, or none."""
    logp = torch.tensor([[[0.0, 0.0, 0.0]]], requires_grad=True)
    old = torch.tensor([[[-1.0, 0.0, 0.0]]])  # place 0's ratio is e, far above 1.28
    loss = pl_grpo_loss(logp, old, torch.tensor([[1.0]]), torch.ones(1, 1, 3), 0.2, 0.28)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 0, 0] == 0 and (grad[0, 0, 1:] == -1).all()
    assert float(loss.detach()) == pytest.approx(-(1.28 + 1 + 1))


def test_reward_depth_is_the_deepest_component_the_reward_reads() -> None:
    cfg = RewardConfig()  # max_k 8, retrieval_k 10, longmemeval's tiers stop at 3
    assert reward_depth(cfg, 0.0, 20, "locomo", "1") == 8
    assert reward_depth(cfg, 0.3, 20, "locomo", "1") == 10  # the warm-up's NDCG@10 reads deeper
    assert reward_depth(cfg, 0.3, 6, "locomo", "1") == 6  # never past the candidates
    assert reward_depth(cfg, 0.0, 20, "longmemeval", None) == 3
    assert reward_depth(RewardConfig(max_k=7), 0.0, 20, "x", None) == 5  # the deepest tier
    assert reward_depth(cfg, 0.0, 20, "locomo", "5") == 1  # R_ans off, beta 0: flat reward
    assert reward_depth(RewardConfig(alpha=0.0, format_reward=0.0), 0.3, 20, "x", None) == 10


@pytest.mark.parametrize("step", [0, 50])  # warm-up on (beta > 0), then off
def test_the_service_pays_a_prefix_at_the_reward_depth_what_it_pays_the_whole_ranking(
    step: int,
) -> None:
    n = 10
    cfg = RewardConfig(
        max_k=5, retrieval_k=7, beta0=0.5, decay_steps=20, default_task_metric="f1",
        task_metrics={},
    )  # fmt: skip
    service = RewardService(
        Answerer(FakeWorkingLLM(), 100_000, 8, memory_order="chronological"), cfg
    )
    depth = reward_depth(cfg, service.shaping.beta(step), n, "custom", None)
    assert depth == (7 if step == 0 else 5)
    rng = random.Random(0)
    perms = [rng.sample(range(n), n) for _ in range(30)]
    texts = [ranking_text(p) for p in perms]
    request = RewardRequest(
        question="What is the fact of c?",
        answer="blue Lisbon",
        candidates=fact_sessions(n, "c"),
        gold_ids=("c/s0", "c/s1"),
        question_date="9 May 2023",
        data_source="custom",
        completions=tuple(texts + [ranking_text(p[:depth]) for p in perms]),
    )
    (group,) = service.score([request], step=step).rewards
    whole, prefix = group[: len(perms)], group[len(perms) :]
    assert [c.reward for c in prefix] == [c.reward for c in whole]
    # One place shorter is not the same: the depth is the reward's, not an arbitrary cut.
    short = dict(request.__dict__, completions=tuple(ranking_text(p[: depth - 1]) for p in perms))
    (cut,) = service.score([RewardRequest(**short)], step=step).rewards
    assert [c.reward for c in cut] != [c.reward for c in whole]


def test_pl_depth_is_validated_and_auto_needs_the_reward_config() -> None:
    assert GRPOSettings().pl_depth == "auto"
    assert GRPOSettings(pl_depth=3).pl_depth == 3
    for bad in ("deep", 0):
        with pytest.raises(ValueError, match="pl_depth"):
            GRPOSettings(pl_depth=bad)
    cfg = TrainConfig()
    cfg.grpo = GRPOSettings(num_generations=2, per_device_train_batch_size=2)

    def plain(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [0.0] * len(completions)

    # Refused before any model loads: a guess at the depth would be a silent choice.
    with pytest.raises(DataError, match="pl_depth"):
        PLGRPOTrainer(cfg, "unused", [{"prompt": "p", "n_candidates": 3}], plain, Path("x"))


def test_pl_depth_knob_loads_from_yaml(tmp_path: Path) -> None:
    from memsifter.training.config import load_train_config

    for value, want in (("full", "full"), ("5", 5), ("auto", "auto")):
        path = tmp_path / "t.yaml"
        path.write_text(f"grpo:\n  pl_depth: {value}\n", encoding="utf-8")
        assert load_train_config(path).grpo.pl_depth == want


# -- a place's credit (grpo.pl_credit: tiers) ------------------------------------------------


def test_marginal_utility_to_go_keeps_the_tiers_deeper_than_each_place() -> None:
    from memsifter.rewards.marginal_utility import marginal_utility, marginal_utility_to_go
    from memsifter.rewards.tiers import tier_weights

    scores = {0: 0.25, 1: 1.0, 2: 0.0, 3: 1.0, 5: 0.5, 8: 1.0}
    w = dict(zip((1, 2, 3, 5, 8), tier_weights((1, 2, 3, 5, 8)), strict=True))
    for s0 in (True, False):
        got = marginal_utility_to_go(scores, 10, s0)
        assert got[0] == marginal_utility(scores, s0)  # the same float, not just close
        base = 0.25 if s0 else 0.0
        for j in range(10):
            want = sum(w[k] * (scores[k] - base) for k in w if k > j)
            assert got[j] == pytest.approx(want, abs=1e-12)
        assert got[8:] == [0.0, 0.0]  # past the deepest tier nothing is left to change
    with pytest.raises(ValueError, match="depth"):
        marginal_utility_to_go(scores, 0)


def _exact_credit_gradient(credit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """E over every top-3 of Σ_j ∇log π(σ_j | σ_<j) · credit_j (no baseline), against the exact
    ∇E[R_ans], on 5 candidates with one useful one (s_k = 1 once it is in the top k)."""
    from memsifter.rewards.marginal_utility import marginal_utility, marginal_utility_to_go

    scores = torch.tensor([[0.4, -0.3, 1.1, 0.0, -0.8]], requires_grad=True)
    useful, depth = 3, 3
    prefixes = torch.tensor([[list(p) for p in _prefixes(5, depth)]])
    places = pl_place_log_probs(scores, prefixes)[0]  # [P, 3]
    prob = places.sum(-1).exp()
    value, surrogate = torch.zeros(()), torch.zeros(())
    for i, p in enumerate(prefixes[0].tolist()):
        tiers = {0: 0.0, **{k: float(useful in p[:k]) for k in (1, 2, 3)}}
        value = value + prob[i] * marginal_utility(tiers)
        to_go = marginal_utility_to_go(tiers, depth)
        r = to_go[0]
        # "tiers": place j gets what it can change; "past": the settled tiers instead (wrong)
        per_place = to_go if credit == "tiers" else [r - t for t in to_go]
        if credit == "ranking":
            per_place = [r] * depth
        surrogate = surrogate + prob[i].detach() * (places[i] * torch.tensor(per_place)).sum()
    (exact,) = torch.autograd.grad(value, scores, retain_graph=True)
    (got,) = torch.autograd.grad(surrogate, scores)
    return got[0], exact[0]


def test_tier_credit_estimates_the_same_gradient_and_settled_tiers_do_not() -> None:
    for credit in ("ranking", "tiers"):
        got, exact = _exact_credit_gradient(credit)
        assert torch.allclose(got, exact, atol=1e-6), (credit, got, exact)
    # The control: crediting each place with the tiers above it is a different, wrong gradient.
    got, exact = _exact_credit_gradient("past")
    assert not torch.allclose(got, exact, atol=1e-3)


def _scored(hits: list[tuple[float, ...]], r_ret: float, shaping: object) -> list[object]:
    from memsifter.rewards.marginal_utility import marginal_utility
    from memsifter.rewards.service import CompletionReward

    out = []
    for h in hits:
        tiers = {0: 0.0, **dict(zip((1, 2, 3), h, strict=True))}
        r_ans = marginal_utility(tiers)
        reward = shaping.combine(r_ans, r_ret, 0)  # type: ignore[attr-defined]
        out.append(CompletionReward(reward, True, (0, 1, 2), r_ans, r_ret, tiers))
    return out


def test_tier_credit_first_place_is_grpos_advantage_and_r_ret_stays_whole() -> None:
    from memsifter.rewards.shaping import ShapingSchedule
    from memsifter.rewards.tiers import tier_weights
    from memsifter.training.pl_grpo import group_advantages, place_advantages, tier_credit

    cfg = RewardConfig(max_k=3)
    shaping = ShapingSchedule(alpha=1.0, beta0=0.5, decay_steps=10)
    hits = [(1.0, 1.0, 1.0), (0.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.0, 0.0, 1.0)]
    done = _scored(hits, 0.4, shaping)
    to_go = tier_credit(done, shaping, 0, cfg, 3)
    rewards = torch.tensor([[c.reward for c in done]])  # type: ignore[attr-defined]
    assert [row[0] for row in to_go] == [c.reward for c in done]  # type: ignore[attr-defined]
    # Place 2 (0-based) changes tier 3 only; R_ret (beta 0.5 at step 0) is on every place.
    w3 = tier_weights((1, 2, 3))[2]
    assert [row[2] for row in to_go] == pytest.approx([w3 * h[2] + 0.5 * 0.4 for h in hits])
    for scale in ("group", "batch", "none"):
        adv = place_advantages(torch.tensor([to_go]), rewards, scale)
        assert torch.allclose(adv[..., 0], group_advantages(rewards, scale))
        assert torch.allclose(adv.mean(1), torch.zeros(1, 3), atol=1e-6)  # each place centred
    # A reward with another term added cannot be split by place: refused, not approximated.
    bad = [dataclasses.replace(done[0], reward=done[0].reward + 1.0)]  # type: ignore[type-var]
    with pytest.raises(DataError, match="pl_credit"):
        tier_credit(bad, shaping, 0, cfg, 3)


def test_pl_credit_is_validated_and_tiers_needs_the_reward_service() -> None:
    assert GRPOSettings().pl_credit == "ranking"
    with pytest.raises(ValueError, match="pl_credit"):
        GRPOSettings(pl_credit="places")
    cfg = TrainConfig()
    cfg.grpo = GRPOSettings(
        num_generations=2, per_device_train_batch_size=2, pl_depth=3, pl_credit="tiers"
    )

    def plain(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [0.0] * len(completions)

    with pytest.raises(DataError, match="pl_credit"):
        PLGRPOTrainer(cfg, "unused", [{"prompt": "p", "n_candidates": 3}], plain, Path("x"))


# -- what a group's rankings weigh (grpo.pl_advantage: best_of_group) ---------------------------


def test_best_of_group_is_a_cross_entropy_on_the_best_rankings_and_flat_groups_teach_nothing() -> (
    None
):
    from memsifter.training.pl_grpo import best_of_group_advantages

    rewards = torch.tensor([[0.1, 0.7, 0.3, 0.7], [0.2, 0.2, 0.2, 0.2], [-1.0, -0.5, -2.0, -3.0]])
    adv = best_of_group_advantages(rewards)
    # Ties share the weight (2 of 4 best: 4/2 - 1), a flat group is all 0, negatives work.
    assert torch.allclose(adv[0], torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.allclose(adv[2], torch.tensor([-1.0, 3.0, -1.0, -1.0]))
    assert torch.allclose(adv.mean(1), torch.zeros(3), atol=1e-6)
    # The first pass's gradient: the cross-entropy on the best prefixes minus the group's mean
    # score function, one cross-entropy's weight a prompt however unlikely the best was.
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(3, 6, generator=gen, requires_grad=True)
    drawn = gumbel_topk(scores, 4, k=3, generator=gen)
    mask = torch.ones(3, 1, 3)
    logp = pl_place_log_probs(scores, drawn)
    (got,) = torch.autograd.grad(pl_grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28), scores)
    ll = pl_log_prob(scores, drawn)  # [B, G] log PL of each prefix
    best = adv > -1.0
    ce = -sum((ll[b][best[b]].mean() - ll[b].mean()) for b in range(3) if not best[b].all())
    (want,) = torch.autograd.grad(ce / 3, scores)
    assert torch.allclose(got, want, atol=1e-6)


def test_best_of_group_is_validated_and_refuses_what_does_not_apply() -> None:
    assert GRPOSettings().pl_advantage == "grpo"
    with pytest.raises(ValueError, match="pl_advantage"):
        GRPOSettings(pl_advantage="best")

    def plain(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [0.0] * len(completions)

    for setting, field in (
        ({"pl_credit": "tiers"}, "pl_credit"),
        ({"scale_rewards": "none"}, "scale_rewards"),
    ):
        cfg = TrainConfig()
        cfg.grpo = GRPOSettings(
            num_generations=2,
            per_device_train_batch_size=2,
            pl_depth=3,
            pl_advantage="best_of_group",
            **setting,
        )
        with pytest.raises(DataError, match=field):
            PLGRPOTrainer(cfg, "unused", [{"prompt": "p", "n_candidates": 3}], plain, Path("x"))


def _learn_linear(shuffle: bool, steps: int = 40, n: int = 10) -> float:
    """A linear scorer trained by best_of_group on R_ans's tiers in the content-only world of
    :mod:`memsifter.testing.linear_world`; its held-out NDCG@1."""
    from memsifter.rewards.tiers import fibonacci_tiers, tier_weights
    from memsifter.testing.linear_world import LinearWorld
    from memsifter.training.pl_grpo import best_of_group_advantages

    tiers = torch.tensor(fibonacci_tiers(8))
    weights = torch.tensor(tier_weights(tuple(tiers.tolist()), "paper"))
    world = LinearWorld(n, d=8, seed=0, held_out=400)
    theta = torch.zeros(8, requires_grad=True)
    opt = torch.optim.AdamW([theta], lr=0.05, weight_decay=0.0)
    for _ in range(steps):
        x, u = world.prompts(16)
        scores = x @ theta
        drawn = gumbel_topk(scores.detach(), 8, k=8, generator=world.gen)
        hit = drawn == u[:, None, None]
        place = torch.where(hit.any(-1), hit.float().argmax(-1), 10**6)
        rewards = (place[..., None] < tiers).float() @ weights
        if shuffle:  # the control: the same rewards, no longer on the rankings that earned them
            rewards = rewards.flatten()[torch.randperm(rewards.numel(), generator=world.gen)]
            rewards = rewards.view(16, 8)
        logp = pl_place_log_probs(scores, drawn)
        adv = best_of_group_advantages(rewards)
        loss = pl_grpo_loss(logp, logp.detach(), adv, torch.ones(1, 1, 8), 0.2, 0.28)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return world.accuracy(theta)


def test_best_of_group_learns_from_the_reward_and_a_shuffled_reward_does_not() -> None:
    learned, control = _learn_linear(shuffle=False), _learn_linear(shuffle=True)
    assert learned >= 0.8, learned  # chance is 0.1
    assert control <= 0.3, control


def test_subtracting_s0_changes_no_advantage_when_the_reader_is_deterministic() -> None:
    """Marginal utility against the absolute score (docs/gym.md, finding 21), in the head
    trainer's own advantage functions (tests/data/test_gym.py shows the shift through the reward
    service). With a deterministic reader s_0 is one number a question, so every ranking in a
    group is paid ``sum_k w_k s_0`` less (and each place's to-go ``sum_{k > place} w_k s_0``
    less). Centring on the group mean removes that: under ``group`` and ``none`` scaling (and
    tier credit) the two rewards give the same advantages, so the same gradient. ``batch``
    scaling divides by something the shift moves, and ``mean`` scaling takes the absolute score
    only."""
    rng = random.Random(0)
    tiers, depth = (1, 2, 3, 5, 8), 8
    groups, size = 6, 16
    marginal, absolute, to_go_m, to_go_a = [], [], [], []
    for g in range(groups):
        s0 = 0.0 if g % 2 else rng.choice([0.25, 0.5, 1.0])  # half the questions: s_0 > 0
        rows = []
        for _ in range(size):
            scores = {0: s0}
            scores.update({k: float(rng.random() < 0.4 + 0.1 * i) for i, k in enumerate(tiers)})
            rows.append(scores)
        for subtract, rewards, to_go in ((True, marginal, to_go_m), (False, absolute, to_go_a)):
            per_place = [marginal_utility_to_go(s, depth, subtract, "tail") for s in rows]
            rewards.append([p[0] for p in per_place])
            to_go.append(per_place)
    m, a = torch.tensor(marginal), torch.tensor(absolute)
    assert not torch.allclose(m, a)  # the rewards themselves differ on the s_0 > 0 groups
    for scale in ("group", "none"):
        assert torch.allclose(group_advantages(m, scale), group_advantages(a, scale), atol=1e-5)
        assert torch.allclose(
            place_advantages(torch.tensor(to_go_m), m, scale),
            place_advantages(torch.tensor(to_go_a), a, scale),
            atol=1e-5,
        )
    # The batch's std includes the spread between groups, which the per-group shift moves.
    batch_m, batch_a = group_advantages(m, "batch"), group_advantages(a, "batch")
    assert not torch.allclose(batch_m, batch_a, atol=1e-3)
    # mean scaling divides by the group's mean reward: only the absolute score is allowed, as
    # s_k - s_0 goes below 0 where memory spoils an answer.
    assert torch.isfinite(group_advantages(a, "mean")).all()
    with pytest.raises(DataError, match="negative rewards"):
        group_advantages(m, "mean")
