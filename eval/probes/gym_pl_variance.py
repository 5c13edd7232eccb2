"""How much noise do the places below the reward's depth add to PL-GRPO, and what does it cost?

    python -m eval.probes.gym_pl_variance            # ~2 min on one core
    python -m eval.probes.gym_pl_variance --quick    # a smoke run (fewer seeds and steps)

A probe of the estimator of :mod:`memsifter.training.pl_grpo`, on the reward it is built for:
R_ans with the paper's tier weights at the Fibonacci cut-offs 1, 2, 3, 5, 8 and s_0 = 0, on a
synthetic question with one useful candidate (the gym's memory question: s_k = 1 once the useful
session is in the top k, else 0). It reads the trainer's own pieces (``gumbel_topk``,
``pl_place_log_probs``, ``group_advantages``, ``pl_grpo_loss``, the tier weights) and compares:

* ``full``: whole rankings, every place's log-probability times the advantage (the trainer
  before ``grpo.pl_depth``);
* ``prefix``: the top 8 only (``pl_depth: auto`` for this reward), what the trainer does now;
* ``prefix+credit``: the top 8 with ``grpo.pl_credit: tiers`` (PL-Rank style): place j is
  credited only with the tiers it can still change (F_t > j), each place centred on its group's
  mean (the trainer's own ``tier_credit`` sums and ``place_advantages``).

and, in the learning runs only, two rules that do not estimate that gradient:

* ``prefix+best``: the top 8 with ``grpo.pl_advantage: best_of_group``, each group's
  best-rewarded rankings imitated (the trainer's ``best_of_group_advantages``);
* ``label``: a cross-entropy on the useful candidate's first place, which is told the answer:
  how fast the same scorer learns when it is supervised.

(a) **Gradient variance.** 16 prompts with fixed random scores N(0, 1) (the policy's parameters
are the scores themselves), 8 rankings per prompt, over ``--seeds`` draws: the trace of the
estimator's covariance relative to its mean's squared norm, the cosine of the mean to the exact
gradient of E[R] (computed by quadrature over the useful candidate's Gumbel noise, checked
against Monte Carlo), and the mean cosine of a single draw to it.

(b) **Steps to learn.** A linear scorer ``x · θ`` over d = 8 random candidate features, θ = 0 at
the start (a uniform policy); the useful candidate is ``argmax x · w*`` for a hidden w*. Each step
draws 16 fresh prompts, 8 rankings each, group-scaled advantages, one AdamW step (lr 0.05).
Validation: NDCG@1 of the useful candidate (greedy top-1 accuracy) on 500 fixed prompts every 5
steps; reported: the first step it is >= 0.9 (capped at ``--steps``), per seed.

n = 10 is the head's label capacity on SmolLM2 and Qwen3 today (single-digit labels), n = 30 a
wider candidate list. At n <= 8 the prefix is the whole ranking and nothing changes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from eval.common import command_line
from memsifter.ranker.first_token import gumbel_topk, pl_place_log_probs
from memsifter.rewards.marginal_utility import marginal_utility_to_go
from memsifter.rewards.tiers import fibonacci_tiers, tier_weights
from memsifter.testing.linear_world import LinearWorld
from memsifter.training.pl_grpo import (
    best_of_group_advantages,
    group_advantages,
    pl_grpo_loss,
    place_advantages,
)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "eval" / "results" / "gym_pl_variance" / "gym_pl_variance"
TIERS = fibonacci_tiers(8)
WEIGHTS = torch.tensor(tier_weights(TIERS, "paper"))
ESTIMATORS = ("full", "prefix", "prefix+credit")
# Learning runs only: not estimators of E[R]'s gradient. ``prefix+best`` is grpo.pl_advantage:
# best_of_group (the group's best rankings imitated); ``label`` a cross-entropy on the useful
# candidate's first place, which knows the answer: the ceiling a reward-only rule can reach.
LEARNERS = (*ESTIMATORS, "prefix+best", "label")
G = 8  # rankings per prompt
P = 16  # prompts per batch


def tier_hits(drawn: torch.Tensor, useful: torch.Tensor) -> torch.Tensor:
    """``[B, G, T]``: 1 where the useful candidate is within tier t's top F_t of the drawing."""
    hit = drawn == useful[:, None, None]
    pos = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full(hit.shape[:2], 10**6))
    return (pos[..., None] < torch.tensor(TIERS)).float()


def estimator_loss(scores: torch.Tensor, useful: torch.Tensor, how: str, scale: str, gen: Any):
    """The surrogate loss of one batch under estimator ``how``; its gradient is the estimate."""
    n = scores.shape[-1]
    depth = n if how == "full" else min(TIERS[-1], n)
    if how == "label":
        # The rankings are drawn and unused, so the generator (which also draws the learning
        # runs' prompts) stays in step with the other rows: the same prompts, paired by seed.
        gumbel_topk(scores.detach(), G, k=depth, generator=gen)
        return torch.nn.functional.cross_entropy(scores, useful), None
    drawn = gumbel_topk(scores, G, k=depth, generator=gen)
    hits = tier_hits(drawn, useful)
    rewards = (hits * WEIGHTS).sum(-1)  # R_ans with s_0 = 0
    logp = pl_place_log_probs(scores, drawn)
    adv = group_advantages(rewards, scale)
    if how == "prefix+best":
        adv = best_of_group_advantages(rewards)
    mask = torch.ones(1, 1, depth)
    if how != "prefix+credit":
        return pl_grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28), rewards
    # The trainer's own credit (grpo.pl_credit: tiers): place j gets the tiers reading deeper
    # than j, each place centred on its group's mean.
    to_go = torch.tensor(
        [marginal_utility_to_go({0: 0.0, **dict(zip(TIERS, h, strict=True))}, depth)
         for h in hits.view(-1, len(TIERS)).tolist()]
    ).view(*rewards.shape, depth)  # fmt: skip
    adv = place_advantages(to_go, rewards, scale)
    return pl_grpo_loss(logp, logp.detach(), adv, mask, 0.2, 0.28), rewards


def exact_value(scores: torch.Tensor, useful: torch.Tensor, grid: int = 4000) -> torch.Tensor:
    """E[R_ans] per prompt, exactly: P(useful in top k) = E_z[P(fewer than k others beat z)],
    z the useful candidate's perturbed score; the count is Poisson-binomial given z."""
    s = scores.double()
    su = s.gather(1, useful[:, None])  # [B, 1]
    g = torch.linspace(-4.0, 24.0, grid, dtype=torch.float64)
    z = su + g  # [B, grid]
    dens = torch.exp(-g - torch.exp(-g)) * (g[1] - g[0])  # Gumbel density x step
    others = torch.ones_like(s, dtype=torch.bool).scatter(1, useful[:, None], False)
    p_beat = 1 - torch.exp(-torch.exp(-(z[:, :, None] - s[:, None, :])))  # [B, grid, n]
    count = torch.zeros(*z.shape, TIERS[-1] + 1, dtype=torch.float64)
    count[..., 0] = 1.0  # P(count = c), truncated at c = 8 (no tier reads deeper)
    for j in range(s.shape[1]):
        pj = torch.where(others[:, None, j], p_beat[..., j], torch.zeros_like(z))[..., None]
        shifted = torch.cat([torch.zeros_like(count[..., :1]), count[..., :-1]], -1)
        count = count * (1 - pj) + shifted * pj
    in_top = torch.stack([count[..., :k].sum(-1) for k in TIERS], -1)  # [B, grid, T]
    return ((in_top * dens[None, :, None]).sum(1) * WEIGHTS.double()).sum(-1)


def variance(n: int, seeds: int, scale: str) -> dict[str, Any]:
    base = torch.Generator().manual_seed(1234 + n)
    scores0 = torch.randn(P, n, generator=base)
    useful = torch.randint(0, n, (P,), generator=base)
    s = scores0.clone().double().requires_grad_(True)
    (exact,) = torch.autograd.grad(exact_value(s, useful).mean(), s)
    exact = exact.float().flatten()
    # Monte Carlo check of the quadrature's value.
    with torch.no_grad():
        drawn = gumbel_topk(scores0, 20_000, k=8, generator=torch.Generator().manual_seed(7))
        mc = (tier_hits(drawn, useful) * WEIGHTS).sum(-1).mean(1)
        check = float((mc - exact_value(scores0, useful).float()).abs().max())
    out: dict[str, Any] = {"n": n, "scale": scale, "quadrature_vs_mc_max_abs": check}
    for how in ESTIMATORS:
        grads = []
        for seed in range(seeds):
            sc = scores0.clone().requires_grad_(True)
            loss, _ = estimator_loss(sc, useful, how, scale, torch.Generator().manual_seed(seed))
            (gr,) = torch.autograd.grad(loss, sc)
            grads.append(-gr.flatten())  # the ascent direction
        g = torch.stack(grads)
        mean = g.mean(0)
        trace = float(((g - mean) ** 2).sum(1).mean())
        cos_each = torch.nn.functional.cosine_similarity(g, exact[None, :], dim=1)
        out[how] = {
            "trace_cov": trace,
            "rel_var": trace / float((mean**2).sum()),
            "cos_mean_exact": float(torch.nn.functional.cosine_similarity(mean, exact, dim=0)),
            "cos_single_exact": float(cos_each.mean()),
        }
    return out


def learn(n: int, how: str, seed: int, steps: int, d: int = 8) -> int | None:
    world = LinearWorld(n, d, seed, held_out=500)
    theta = torch.zeros(d, requires_grad=True)
    opt = torch.optim.AdamW([theta], lr=0.05, weight_decay=0.0)
    for step in range(1, steps + 1):
        x, u = world.prompts(P)
        loss, _ = estimator_loss(x @ theta, u, how, "group", world.gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0 and world.accuracy(theta) >= 0.9:
            return step
    return None


def main(
    seeds: Annotated[int, typer.Option(help="draws per variance estimate")] = 400,
    runs: Annotated[int, typer.Option(help="seeds of the learning runs")] = 16,
    steps: Annotated[int, typer.Option(help="cap on a learning run's steps")] = 300,
    quick: Annotated[bool, typer.Option(help="smoke run: 40 draws, 2 runs, 100 steps")] = False,
) -> None:
    """PL-GRPO's place credit: gradient variance and steps to learn, whole reward vs tiers."""
    if quick:
        seeds, runs, steps = 40, 2, 100
    # The tensors are tiny: one thread is ~20x faster than two here (no thread hand-offs).
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ns = (10, 30)
    var = [variance(n, seeds, scale) for n in ns for scale in ("none", "group")]
    learning: dict[str, Any] = {}
    for n in ns:
        for how in LEARNERS:
            hit = [learn(n, how, seed, steps) for seed in range(runs)]
            done = sorted(h for h in hit if h is not None)
            learning[f"{n}/{how}"] = {
                "steps_to_0.9": hit,
                "mean_of_reached": sum(done) / len(done) if done else None,
                "median_of_reached": done[len(done) // 2] if done else None,
                "max": max(done) if len(done) == len(hit) else None,
                "reached": f"{len(done)}/{len(hit)}",
            }
            full = learning[f"{n}/full"]["steps_to_0.9"]
            if how != "full" and None not in hit + full:
                # Paired by seed: the same w*, prompts and validation set for both estimators.
                diff = [a - b for a, b in zip(full, hit, strict=True)]
                mean = sum(diff) / len(diff)
                se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (len(diff) - 1) / len(diff))
                learning[f"{n}/{how}"]["saved_vs_full"] = {"mean": mean, "se": se}
    from eval.common import git_dirty, git_head

    rev = git_head()
    # The code this probe measures; a result from an uncommitted edit of it says so.
    measured = [
        "eval/probes/gym_pl_variance.py",
        "memsifter/ranker/first_token.py",
        "memsifter/training/pl_grpo.py",
        "memsifter/rewards/tiers.py",
    ]
    if git_dirty(*measured):
        rev += " + uncommitted changes"
    result = {
        "code_version": rev,
        "command": command_line(),
        "settings": {
            "prompts_per_batch": P,
            "rankings_per_prompt": G,
            "variance_draws": seeds,
            "learning_runs": runs,
            "learning_step_cap": steps,
            "validation_prompts": 500,
            "tiers": list(TIERS),
            "tier_weights": "paper",
        },
        "variance": var,
        "learning": learning,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    OUT.with_suffix(".md").write_text(render(result), encoding="utf-8")
    print(render(result))


def render(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        "# PL-GRPO: the places below the reward's depth (eval/probes/gym_pl_variance.py)",
        "",
        f"Code `{r['code_version']}`, `{r['command']}`, {r['seconds']} s. Synthetic R_ans (paper "
        f"tier weights at {s['tiers']}, s_0 = 0, one useful candidate), {s['prompts_per_batch']} "
        f"prompts x {s['rankings_per_prompt']} rankings a batch.",
        "",
        f"## (a) Gradient variance ({s['variance_draws']} draws of one batch, fixed scores)",
        "",
        "rel. var = trace of the covariance / squared norm of the mean; cos = cosine to the exact",
        "gradient of E[R] (quadrature; its largest error against 20,000 Monte Carlo draws is in",
        "the last column).",
        "",
        "| n | advantage scale | estimator | trace cov | rel. var | cos(mean, exact) | "
        "cos(one draw, exact) | quadrature error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in r["variance"]:
        for how in ESTIMATORS:
            e = v[how]
            lines.append(
                f"| {v['n']} | {v['scale']} | {how} | {e['trace_cov']:.4g} | {e['rel_var']:.3g} "
                f"| {e['cos_mean_exact']:.3f} | {e['cos_single_exact']:.3f} | "
                f"{v['quadrature_vs_mc_max_abs']:.1e} |"
            )
    lines += [
        "",
        f"## (b) Steps until NDCG@1 >= 0.9 ({s['learning_runs']} seeds, cap "
        f"{s['learning_step_cap']}, validation n = {s['validation_prompts']})",
        "",
        "Same seed, same hidden w*, prompts and validation set for every estimator; *saved* is",
        "the paired difference full − estimator in steps (mean ± standard error).",
        "",
        "| n | estimator | steps per seed (None: not reached) | mean | median | max | reached "
        "| saved vs full |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, e in r["learning"].items():
        n, how = key.split("/", 1)

        def num(x: float | None) -> str:
            return "-" if x is None else f"{x:.0f}"

        saved = e.get("saved_vs_full")
        saved_text = "-" if saved is None else f"{saved['mean']:+.1f} ± {saved['se']:.1f}"
        lines.append(
            f"| {n} | {how} | {e['steps_to_0.9']} | {num(e['mean_of_reached'])} | "
            f"{num(e['median_of_reached'])} | {num(e['max'])} | {e['reached']} | {saved_text} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    typer.run(main)
