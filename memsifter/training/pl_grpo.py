"""GRPO for the first-token ranking head: a Plackett–Luce policy over rankings, scored by the
same reward service.

Per prompt one forward pass gives the head's scores (:mod:`memsifter.ranker.first_token`);
``num_generations`` rankings are drawn from ``PL(softmax(scores / temperature))`` without
replacement by Gumbel top-k. Each ranking is written as the completion ``generate`` mode would
produce (``<ranking>3, 0, 4</ranking>``) and scored by the run's reward function, unchanged:
the R_ret warm-up, R_ans with its tiers and s_0, shaping, the gym's reader or a real answerer.
Advantages are group-relative with GRPO's ``scale_rewards`` choices (``group``: the group's
std; ``batch``: the batch's; ``none``), as TRL computes them, or ``mean`` (the group's mean
reward: :mod:`memsifter.training.mean_scale`).

With LoRA on the top layers only, the frozen trunk below the adapter runs once a step without
grad (:class:`memsifter.ranker.first_token.HeadTrunk`): the policy's scores (each of
``num_iterations``) and the KL's reference (the top layers with the adapter off, which is the
start model exactly) are read from it, so ``beta > 0`` keeps no copy of the model.

**Only the places the reward reads are drawn and trained** (``grpo.pl_depth``, default
``auto``). R_ans reads the top ``max_k`` (its deepest Fibonacci tier; ``tier_max_k`` per data
source) and R_ret the top ``retrieval_k``, and only while the warm-up's beta is above 0. The
log-probability of the places below that depth has zero mean given the prefix and is
independent of the reward, so multiplying it by the advantage adds variance and nothing else
(both estimators have the same expectation; ``eval/probes/gym_pl_variance.py`` measures the
difference). So each row draws the top-``d`` prefix by Gumbel top-k (an exact PL sample of the
top d), the completion names those ``d`` candidates (the reward service completes a short
ranking for scoring with orders that sit below every tier and below NDCG's cut-off:
:mod:`memsifter.rewards.omission`), and the loss reads log PL of the prefix. ``d`` is read
from the run's reward config per row and per step, never guessed: a reward function without
one must be given an int or ``full``.

**Each place is a token.** The loss is TRL's clipped surrogate taken per place,
``-Σ_j min(ρ_j A, clip(ρ_j, 1-ε, 1+ε_high) A)`` with ``ρ_j = π(σ_j | σ_<j) / π_old(σ_j | σ_<j)``,
summed over the prefix's places and averaged over rankings. On the first pass over a batch
every ρ_j = 1 and the gradient is exactly ``-A ∇log PL(prefix)``, the same step size as the
whole-ranking loss before (a mean over places would divide it by the depth). With
``num_iterations > 1`` each place's ratio is clipped on its own: the ratio of a whole ranking
is a product over places, which a single clip lets explode or vanish.

**A place's credit** (``grpo.pl_credit``). ``ranking`` (GRPO's) multiplies every place by the
whole ranking's advantage A. But tier k of R_ans reads the top k, so a tier k <= j is settled
by the places above j and cannot depend on σ_j: for place j those terms have zero mean and only
add noise (the reward-to-go argument, PL-Rank's per-place credit). ``tiers`` credits place j
with the tiers deeper than j (:func:`tier_credit`), each place centred on its own group mean
and divided by the spread ``scale_rewards`` names (:func:`place_advantages`): place 0's
advantage is A exactly, and the estimator's expectation is the same. R_ret stays whole on every
place. ``eval/probes/gym_pl_variance.py`` measures the variance and the steps to learn of both.

**What a group's rankings weigh** (``grpo.pl_advantage``). ``grpo`` is the above: an unbiased
estimate of the gradient of E[R]. That gradient reaches a candidate in proportion to the
policy's probability of placing it: a useful session the start ranks first with p = 1/15 gets
a fifteenth of the push a cross-entropy on it would give, while anything the batch shares (a
position, recency) adds up over every prompt, is learned first, and the entropy collapses onto
it (docs/gym.md, findings 15 and 17). ``best_of_group`` weighs the group's best-rewarded
rankings (ties share the weight) by 1 and subtracts the group's mean log-probability as the
baseline: advantage ``G w_g - 1`` with ``w`` uniform over the best, 0 for a flat group.
The step on a prompt is then a cross-entropy on the best prefix the reward found, whatever its
probability was (RAFT's and ReST's "imitate the best-rewarded sample", in GRPO's clipped,
per-place loss). It optimises the best of G draws, not their mean, so it is biased for E[R]
and copies the luckiest draw of a noisy reward; the gym's reader is deterministic.

``beta > 0`` adds the KL of the policy's prefix distribution to the start model's
(:func:`memsifter.ranker.first_token.pl_prefix_kl`: the exact per-place KL over the candidates
not yet placed, summed over the drawn prefix: unbiased for the prefix's KL by the chain rule).

There is no decode, no format to learn and nothing to parse, so a step costs one forward and
one backward per prompt rather than per completion. No format SFT is needed; ``sft.enabled``
runs the head's own cold start instead, a listwise cross-entropy on the gold label
(:mod:`memsifter.training.listwise_sft`).

The trainer has the slice of ``transformers.Trainer``'s surface that the epoch loop uses
(``train(resume_from_checkpoint)``, ``state``, ``save_model``) and saves ``checkpoint-N``
folders the loop validates and averages like TRL's.

**Scale-out.** A step takes ``per_device_train_batch_size / num_generations`` prompts a
micro-batch, ``gradient_accumulation_steps`` micro-batches a process, and every process of an
``accelerate launch`` (DDP: each process holds the model, gradients are averaged with one flat
all-reduce after the step's backwards). The step's batch and its Gumbel noise are drawn once for
the whole step on every process, each process takes its rows, and the rewards are gathered before
the advantages, so ``scale_rewards: batch`` divides by the whole batch's std: two processes and
one process accumulating two micro-batches make the same update
(tests/training/test_pl_grpo_distributed.py). With one micro-batch a process, the rollout's forward
is the one trained on; with more, the rollout scores each micro-batch without grad and the update
forwards it again (one extra forward, so that a micro-batch's activations are never held for
another's). ``model.gradient_checkpointing``, ``lr_scheduler_type`` and ``warmup_steps`` apply as in
TRL's trainer, and a model whose trainable weights are not float32 (bf16 on GPU) keeps float32
master copies that AdamW steps, so its optimizer states and updates are float32. Launched with
``configs/accelerate/fsdp.yaml`` the model is sharded the ZeRO-3 way with FSDP2
(:mod:`memsifter.training.sharding`): float32 shards are the masters, FSDP's reduce-scatter
averages the gradients, checkpoints are gathered to full; the same test holds two sharded
processes to the one-process update. DeepSpeed is refused by name (its engine would own the
optimizer step).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from memsifter.errors import DataError, MemSifterError
from memsifter.ranker.checkpoint import read_spec
from memsifter.ranker.coarse_prior import fuse_tensor, row_orders
from memsifter.ranker.first_token import (
    HeadTrunk,
    frozen_trunk,
    gumbel_topk,
    head_scores,
    pl_place_log_probs,
    pl_prefix_kl,
    ranking_text,
)
from memsifter.rewards.marginal_utility import marginal_utility_to_go
from memsifter.rewards.tiers import fibonacci_tiers
from memsifter.training.config import SCALE_REWARDS
from memsifter.training.distributed import Processes
from memsifter.training.mean_scale import mean_divisor
from memsifter.training.sharding import (
    adapter_into,
    check_launch,
    full_optimizer_state,
    full_state,
    load_full_optimizer_state,
    load_full_state,
    optimizer_state_for,
    shard,
)
from memsifter.training.time_budget import TimeBudget

Log = Callable[[str], None]
# Steps in a row with a non-finite gradient (each skipped) before a run stops.
MAX_NONFINITE_STEPS = 3


def group_advantages(rewards: Any, scale: str) -> Any:
    """``[B, G]`` rewards to advantages: minus the group mean, divided by the group's std
    (``group``), the whole batch's (``batch``) or nothing (``none``), as TRL's GRPO does, or by
    the group's mean reward (``mean``: the gradient of log E[R], rewards >= 0;
    :mod:`memsifter.training.mean_scale`)."""
    return (rewards - rewards.mean(1, keepdim=True)) / _spread(rewards, scale)


def best_of_group_advantages(rewards: Any) -> Any:
    """``[B, G]`` rewards to ``grpo.pl_advantage: best_of_group``'s advantages: ``G w - 1``
    with ``w`` uniform over each group's best rewards (equal within float noise), so the mean
    over the group of ``A ∇log π`` is the cross-entropy step on the best rankings minus the
    group's mean score function (zero in expectation). A group whose rankings all tie gets 0."""
    top = rewards.max(1, keepdim=True).values
    best = (rewards >= top - 1e-9 * top.abs().clamp_min(1.0)).float()
    return rewards.shape[1] * best / best.sum(1, keepdim=True) - 1.0


def _spread(rewards: Any, scale: str) -> Any:
    """What ``scale_rewards`` divides a ``[B, G]`` batch's advantages by: ``[B, 1]`` (group,
    mean), a scalar (batch) or 1 (none)."""
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale!r}")
    if scale == "group":
        return rewards.std(1, keepdim=True) + 1e-4
    if scale == "mean":
        return mean_divisor(rewards)
    if scale == "batch":
        return rewards.std() + 1e-4
    return 1.0


def place_advantages(to_go: Any, rewards: Any, scale: str, spread: Any = None) -> Any:
    """``[B, G, k]`` per-place rewards (what each place can still change: :func:`tier_credit`)
    to advantages: each place minus its own group mean, divided by the spread
    :func:`group_advantages` divides by (the whole reward's). The first place's to-go is the
    reward itself, so its advantage is exactly GRPO's; a deeper place loses the tiers it cannot
    move, and their noise with them. ``spread`` is that divisor when it was taken over more
    than these rows (the whole step's batch, across micro-batches and processes)."""
    spread = _spread(rewards, scale) if spread is None else spread
    if scale in ("group", "mean"):  # [B, 1]: one per group, broadcast over the places
        spread = spread[..., None]
    return (to_go - to_go.mean(1, keepdim=True)) / spread


def tier_credit(
    completions: Sequence[Any], shaping: Any, step: int, config: Any, depth: int
) -> list[list[float]]:
    """Each scored ranking's reward as its first ``depth`` places can still change it
    (``grpo.pl_credit: tiers``): ``alpha * R_ans``'s tiers deeper than the place
    (:func:`memsifter.rewards.marginal_utility.marginal_utility_to_go`) plus ``beta(step) *
    R_ret`` whole (its own depth is the warm-up's, and it is kept on every place: unbiased,
    if not the least noisy). Place 0 gets the reward itself; a reward that is not this sum
    (another term was added) cannot be split and is refused by name, not approximated."""
    out = []
    for i, c in enumerate(completions):
        if c is None or not c.parsed:
            raise DataError(f"ranking {i} has no scored reward to credit by place")
        if c.r_ans is None:  # no R_ans (alpha 0, an excluded category): nothing to split
            out.append([c.reward] * depth)
            continue
        r_ret = 0.0 if c.r_ret is None else c.r_ret
        mu = marginal_utility_to_go(c.tier_scores, depth, config.subtract_s0, config.tier_weights)
        row = [shaping.combine(m, r_ret, step) for m in mu]
        if abs(row[0] - c.reward) > 1e-9 * max(1.0, abs(c.reward)):
            raise DataError(
                f"ranking {i}: its reward {c.reward} is not alpha * R_ans + beta * R_ret "
                f"({row[0]}), so grpo.pl_credit: tiers cannot split it by place; use "
                "grpo.pl_credit: ranking"
            )
        out.append(row)
    return out


def pl_grpo_loss(
    logp: Any, old: Any, adv: Any, mask: Any, epsilon: float, epsilon_high: float
) -> Any:
    """The clipped surrogate with each place a token: ``logp``/``old`` ``[B, G, k]`` per-place
    log-probabilities, ``adv`` ``[B, G]`` (or ``[B, G, k]``: a credit a place), ``mask``
    ``[B, 1 or G, k]`` the places that count. Summed over places (so at ρ = 1 the gradient
    is ``-A ∇log PL(prefix)``, not a depth-scaled fraction of it), averaged over rankings."""
    import torch

    ratio = torch.exp(logp - old)
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
    a = adv if adv.dim() == logp.dim() else adv.unsqueeze(-1)  # per place, or per ranking
    per_place = -torch.minimum(ratio * a, clipped * a)
    return (per_place * mask).sum(-1).mean()


def reward_depth(rcfg: Any, beta: float, n: int, data_source: Any, category: Any) -> int:
    """How many top places of a ranking of ``n`` candidates the reward of ``rcfg``
    (:class:`memsifter.rewards.RewardConfig`) reads for one row, with the warm-up at ``beta``:
    R_ans's deepest tier (unless R_ans is off for the row), R_ret's ``retrieval_k`` while beta
    is above 0. At least 1 (a reward that reads nothing is flat: any depth trains nothing)."""
    depth = 0
    if rcfg.alpha != 0 and not rcfg.answer_excluded(data_source, category):
        depth = fibonacci_tiers(min(rcfg.max_k_for(data_source), n))[-1]
    if beta > 0:
        depth = max(depth, rcfg.retrieval_k)
    return max(1, min(depth, n))


def check_settings(cfg: Any) -> None:
    """Refuse the TRL-only settings that would be silently meaningless for the head."""
    g = cfg.grpo
    if g.per_device_train_batch_size % g.num_generations:
        raise DataError(
            f"grpo.per_device_train_batch_size ({g.per_device_train_batch_size}) must be a "
            f"multiple of grpo.num_generations ({g.num_generations}): whole groups a step",
            field="grpo.per_device_train_batch_size",
        )
    if g.soft_overlong is not None:
        raise DataError(
            "grpo.soft_overlong: the first-token head writes no text, so nothing is overlong",
            field="grpo.soft_overlong",
        )
    if g.use_vllm:
        raise DataError(
            "grpo.use_vllm: the first-token head samples from one forward pass, no generation "
            "engine is involved",
            field="grpo.use_vllm",
        )
    if cfg.sft.enabled:
        from memsifter.training.listwise_sft import check_listwise_settings

        check_listwise_settings(cfg.sft)  # the head's cold start is a listwise cross-entropy
    if g.scale_rewards not in SCALE_REWARDS:
        raise DataError(
            f"grpo.scale_rewards must be one of {SCALE_REWARDS}", field="grpo.scale_rewards"
        )
    if g.pl_advantage == "best_of_group":
        if g.pl_credit != "ranking":
            raise DataError(
                "grpo.pl_advantage: best_of_group imitates whole best rankings, so there is no "
                f"reward to split by place: grpo.pl_credit must be ranking, not {g.pl_credit}",
                field="grpo.pl_credit",
            )
        if g.scale_rewards != "group":
            raise DataError(
                "grpo.pl_advantage: best_of_group weighs each prompt's best rankings by 1, "
                f"unscaled: grpo.scale_rewards ({g.scale_rewards}) does not apply; leave it "
                "at its default (group)",
                field="grpo.scale_rewards",
            )


class _State:
    """The part of ``transformers.TrainerState`` the loop reads, saved the same way."""

    def __init__(self) -> None:
        self.global_step = 0
        self.log_history: list[dict[str, Any]] = []
        self.is_world_process_zero = True

    def save_to_json(self, path: str | Path) -> None:
        data = {"global_step": self.global_step, "log_history": self.log_history}
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> _State:
        data = json.loads(path.read_text(encoding="utf-8"))
        state = cls()
        state.global_step = int(data["global_step"])
        state.log_history = list(data["log_history"])
        return state


class PLGRPOTrainer:
    """One epoch of Plackett–Luce GRPO on the first-token head (see the module doc)."""

    def __init__(
        self,
        cfg: Any,
        model_path: str,
        train_dataset: Any,
        reward_fn: Any,
        output_dir: Path,
        *,
        cuda: bool = False,
        on_save: Sequence[Callable[[Path], None]] = (),
        log: Log = print,
        procs: Processes | None = None,
    ) -> None:
        import torch
        from transformers import get_scheduler

        from memsifter.training.grpo import load_policy, policy_autocast

        check_settings(cfg)
        self.cfg = cfg
        self.g = cfg.grpo
        self.procs = procs or Processes()
        self.sharded = check_launch(self.procs.distributed)  # FSDP2 (memsifter.training.sharding)
        self.reward_fn = reward_fn
        self.reward_config = None
        if self.g.pl_depth == "auto":
            service = getattr(reward_fn, "service", None)
            self.reward_config = getattr(service, "config", None)
            if self.reward_config is None or not hasattr(service, "shaping"):
                raise DataError(
                    f"grpo.pl_depth: auto reads how deep the reward looks from the reward "
                    f"service's config; this reward function ({type(reward_fn).__name__}) has "
                    "none. Set grpo.pl_depth to the number of top places your reward reads, or "
                    "full",
                    field="grpo.pl_depth",
                )
        if self.g.pl_credit == "tiers":
            service = getattr(reward_fn, "service", None)
            if not hasattr(reward_fn, "last_completions") or not hasattr(service, "shaping"):
                raise DataError(
                    f"grpo.pl_credit: tiers credits each place with the tiers of R_ans it can "
                    f"change, read from the reward service's scored rankings; this reward "
                    f"function ({type(reward_fn).__name__}) gives none. Use grpo.pl_credit: "
                    "ranking",
                    field="grpo.pl_credit",
                )
        self.output_dir = Path(output_dir)
        self.on_save = list(on_save)
        self.log = log
        self.rows = [dict(r) for r in train_dataset]
        if not self.rows:
            raise DataError("the first-token trainer has no training prompts")
        self.columns = [c for c in self.rows[0] if c not in ("prompt", "prompt_messages")]
        self.model, self.tok, peft_config = load_policy(cfg, model_path, cuda)
        self.autocast = lambda: policy_autocast(cfg, cuda)
        spec = read_spec(cfg.data)
        self.labels = spec.labels  # the data prompts' labels
        self.read = spec.head_read  # and where the head reads each score
        self.coarse_weight = spec.coarse_weight  # the policy: head + λ · coarse prior
        self.lora = peft_config is not None
        if self.lora:
            from peft import get_peft_model

            # Checkpoints are then adapters; the loop merges them for validation and averaging.
            # Seeded: every process draws the same adapter init (weights are never broadcast,
            # and a shard of one init beside another's would be neither), as does a rerun.
            torch.manual_seed(self.g.seed)
            self.model = get_peft_model(self.model, peft_config)
        if cuda:  # the process's own GPU (accelerate sets it per local rank)
            self.model.to(torch.device("cuda", torch.cuda.current_device()))
        if cfg.model.gradient_checkpointing:
            self.model.config.use_cache = False
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.model.train()
        # LoRA on the top layers leaves a frozen trunk below them: its output is computed once a
        # step, and the KL's reference is the top layers with the adapter off (the start model,
        # exactly), not a second model's whole forward.
        # Sharded, the trunk's hooks would read layers outside their units' forward: no trunk.
        self.trunk = frozen_trunk(self.model) if self.lora and not self.sharded else 0
        # Under LoRA the start model is the policy with its adapter off, sharded or not: only a
        # full fine-tune keeps a frozen copy for the KL's reference.
        self.ref = None
        if self.g.beta > 0 and not self.lora:
            import copy

            self.ref = copy.deepcopy(self.model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        # Sharded: float32 shards (the masters) computing in the loaded dtype; each root unit's
        # call is the head's scores.
        self.root = self.ref_root = None
        if self.sharded:
            compute = next(self.model.parameters()).dtype
            self.root = shard(self.model, compute)
            if self.ref is not None:
                self.ref_root = shard(self.ref, compute)
            self.log(
                f"sharded with FSDP2 over {self.procs.world} processes: each holds "
                f"1/{self.procs.world} of the float32 weights and computes in {compute}"
            )
        self.params = [p for p in (self.root or self.model).parameters() if p.requires_grad]
        # bf16 (or fp16) trainable weights: AdamW steps float32 copies, written back after
        # each step, so its moments and the updates are not rounded to the weights' dtype.
        self.master = (
            [p.detach().float().clone().requires_grad_(True) for p in self.params]
            if any(p.dtype != torch.float32 for p in self.params)
            else None
        )
        self.opt = torch.optim.AdamW(
            self.master or self.params, lr=self.g.learning_rate, weight_decay=self.g.weight_decay
        )
        self.state = _State()
        self.micro = self.g.per_device_train_batch_size // self.g.num_generations
        self.accum = self.g.gradient_accumulation_steps
        self.prompts_per_step = self.micro * self.accum * self.procs.world
        if (self.accum > 1 or self.procs.distributed) and len(self.rows) < self.prompts_per_step:
            raise DataError(
                f"a step takes {self.prompts_per_step} prompts ({self.micro} a micro-batch x "
                f"{self.accum} accumulated x {self.procs.world} processes) but the training "
                f"data has {len(self.rows)}: lower grpo.per_device_train_batch_size or "
                "grpo.gradient_accumulation_steps",
                field="grpo.gradient_accumulation_steps",
            )
        steps = cfg.epochs.max_steps
        if steps <= 0:  # one pass: every prompt once
            steps = math.ceil(len(self.rows) / self.prompts_per_step)
        self.max_steps = steps
        warmup = self.g.warmup_steps
        updates = steps * self.g.num_iterations
        self.sched = get_scheduler(
            self.g.lr_scheduler_type,
            self.opt,
            num_warmup_steps=math.ceil(warmup * updates) if 0 < warmup < 1 else int(warmup),
            num_training_steps=updates,
        )

    # -- the schedule: seeded passes over the prompts, as TRL's sampler shuffles them ----------
    def _batch(self, step: int) -> list[dict[str, Any]]:
        per_pass = max(1, len(self.rows) // self.prompts_per_step)
        epoch, slot = divmod(step, per_pass)
        order = list(range(len(self.rows)))
        random.Random(f"pl-grpo:{self.g.seed}:{epoch}").shuffle(order)
        take = order[slot * self.prompts_per_step : (slot + 1) * self.prompts_per_step]
        return [self.rows[i] for i in take]

    def _rewards(self, rows: list[dict[str, Any]], rankings: list[list[list[int]]]) -> Any:
        import torch

        prompts, completions = [], []
        cols: dict[str, list[Any]] = {c: [] for c in self.columns}
        for row, group in zip(rows, rankings, strict=True):
            for order in group:
                prompts.append(row["prompt"])
                completions.append(ranking_text(order))
                for c in self.columns:
                    cols[c].append(row[c])
        values = self.reward_fn(prompts, completions, trainer_state=self.state, **cols)
        bad = [v for v in values if v is None or not math.isfinite(float(v))]
        if bad:
            raise DataError(f"the reward function returned {len(bad)} unusable rewards: {bad[:3]}")
        return torch.tensor(values, dtype=torch.float32).view(len(rows), -1)

    def _depths(self, rows: list[dict[str, Any]], ns: list[int], step: int) -> list[int]:
        """Each row's prefix depth (``grpo.pl_depth``) at ``step``: on the reward's clock (the
        reward function's run clock at this trainer's step), as the warm-up's beta is."""
        depth = self.g.pl_depth
        if depth == "full":
            return list(ns)
        if isinstance(depth, int):
            return [min(depth, n) for n in ns]
        service = self.reward_fn.service
        clock = getattr(self.reward_fn, "clock", None)
        beta = service.shaping.beta(step if clock is None else clock.at(step))
        return [
            reward_depth(self.reward_config, beta, n, r.get("data_source"), r.get("category"))
            for r, n in zip(rows, ns, strict=True)
        ]

    def _scorer(self, prompts: list[str], ns: list[int]) -> Callable[..., Any]:
        """The policy's fused scores for these prompts (``adapter=False``: the start model's,
        the KL's reference, read from the same frozen trunk when there is one)."""
        if self.root is not None:
            return partial(self.root, self.tok, prompts, ns, self.labels, self.read)
        if self.trunk:
            trunk = HeadTrunk(
                self.model, self.tok, prompts, ns,
                labels=self.labels, read=self.read, cut=self.trunk,
            )  # fmt: skip
            return trunk.scores
        return partial(head_scores, self.model, self.tok, prompts, ns, labels=self.labels,
                       read=self.read)  # fmt: skip

    def _rollout(
        self, rows: list[dict[str, Any]], idx: list[int], depths: list[int], noise: Any, k: int,
        keep: bool,
    ) -> dict[str, Any]:  # fmt: skip
        """One micro-batch's rankings and rewards: its scores (with grad when ``keep``, so the
        update trains on this forward), Gumbel top-``k`` draws from the step's noise, the
        rewards, the old log-probabilities and the KL's reference."""
        import contextlib

        import torch

        g = self.g
        mine = [rows[i] for i in idx]
        prompts = [r["prompt"] for r in mine]
        ns = [int(r["n_candidates"]) for r in mine]
        coarse = row_orders(mine, self.coarse_weight)

        def fused(x: Any) -> Any:
            return fuse_tensor(x, coarse, ns, self.coarse_weight)

        scorer = self._scorer(prompts, ns)
        with contextlib.nullcontext() if keep else torch.no_grad(), self.autocast():
            scores = fused(scorer())
        drawn = gumbel_topk(scores, g.num_generations, k=k, temperature=g.temperature,
                            noise=noise[idx])  # fmt: skip
        mine_depths = [depths[i] for i in idx]
        rankings = [
            [o[:d] for o in group] for group, d in zip(drawn.tolist(), mine_depths, strict=True)
        ]
        rewards = self._rewards(mine, rankings)
        to_go = None
        if g.pl_credit == "tiers" and g.pl_advantage != "best_of_group":
            service = self.reward_fn.service
            credit = tier_credit(
                self.reward_fn.last_completions,
                service.shaping,
                self.reward_fn.last_batch.stats.step,
                service.config,
                drawn.shape[-1],
            )
            to_go = torch.tensor(credit, dtype=torch.float32).view(*rewards.shape, -1)
        places = torch.arange(drawn.shape[-1], device=scores.device)
        depth_t = torch.tensor(mine_depths, device=scores.device)
        mask = (places[None, :] < depth_t[:, None]).float().unsqueeze(1)  # [B, 1, k]
        ref = None
        if g.beta > 0:
            with torch.no_grad(), self.autocast():
                ref = fused(scorer(adapter=False) if self.trunk else self._ref_scores(prompts, ns))
        return {
            "idx": idx, "prompts": prompts, "ns": ns, "fused": fused, "drawn": drawn,
            "rewards": rewards, "to_go": to_go, "mask": mask, "ref": ref,
            "old": pl_place_log_probs(scores, drawn, g.temperature).detach(),
            "scores": scores if keep else None, "scorer": scorer if keep else None,
        }  # fmt: skip

    def _ref_scores(self, prompts: list[str], ns: list[int]) -> Any:
        """The KL reference's scores: under LoRA the policy's with the adapter off (sharded or
        not), else the start model's copy (sharded like the policy)."""
        if self.lora:
            with self.model.disable_adapter():
                return self._scorer(prompts, ns)()
        if self.ref_root is not None:
            return self.ref_root(self.tok, prompts, ns, self.labels, self.read)
        return head_scores(self.ref, self.tok, prompts, ns, labels=self.labels, read=self.read)

    def _advantages(self, rolls: list[dict[str, Any]], rewards: Any) -> list[Any]:
        """Each micro-batch's advantages, from the whole step's rewards ``[P, G]`` (every
        process's, gathered): a group's are its own, ``batch``'s spread is the step's."""
        g = self.g
        by_place = rolls[0]["to_go"] is not None and g.pl_advantage != "best_of_group"
        # Once for the whole step: the spread place credit divides by, or every row's advantage.
        whole = _spread(rewards, g.scale_rewards) if by_place else None
        if not by_place and g.pl_advantage != "best_of_group":
            whole = group_advantages(rewards, g.scale_rewards)
        out = []
        for roll in rolls:
            rows = roll["idx"]  # the rows' places in the step's batch
            if g.pl_advantage == "best_of_group":
                adv = best_of_group_advantages(roll["rewards"])
            elif by_place:
                spread = whole[rows] if g.scale_rewards in ("group", "mean") else whole
                adv = place_advantages(roll["to_go"], roll["rewards"], g.scale_rewards, spread)
            else:
                adv = whole[rows]
            out.append(adv.to(roll["mask"].device))
        return out

    def _optimizer_step(self) -> tuple[Any, bool]:
        """Average the gradients over the processes, clip, and step (on the float32 masters
        when there are any); a non-finite gradient is not applied."""
        import torch

        if self.root is None:  # FSDP's reduce-scatter has averaged them already
            self.procs.average_gradients(self.params)
        target = self.params
        if self.master is not None:
            for m, p in zip(self.master, self.params, strict=True):
                m.grad = None if p.grad is None else p.grad.detach().float()
            target = self.master
        grad_norm = torch.nn.utils.clip_grad_norm_(target, self.g.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # sharded: the norm over every process's shards
            grad_norm = grad_norm.full_tensor()
        # A non-finite gradient is not applied: clipping would spread it over every weight and
        # the policy would be NaN from then on (as a scaler skips an overflowed step). Each
        # skip is logged; a run that keeps skipping stops (train()).
        ok = bool(torch.isfinite(grad_norm))
        if ok:
            self.opt.step()
            if self.master is not None:
                with torch.no_grad():
                    for m, p in zip(self.master, self.params, strict=True):
                        p.copy_(m)
            self.sched.step()  # on the optimizer's clock, as the Trainer steps it
        self.opt.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        return grad_norm, ok

    def _step(self, step: int) -> dict[str, Any]:
        import torch

        g = self.g
        rows = self._batch(step)
        ns = [int(r["n_candidates"]) for r in rows]
        depths = self._depths(rows, ns, step)
        gen = torch.Generator().manual_seed(g.seed * 1_000_003 + step)
        # One draw for the whole step's batch, so a row's rankings are the same wherever it is
        # trained; its width is the widest row's (each row reads only its own candidates).
        noise = torch.rand((len(rows), g.num_generations, max(ns)), generator=gen)
        # The batch's deepest prefix is drawn; each row keeps its own depth. Depths never pass
        # a row's candidate count, so padding (-inf, drawn last) never enters a prefix.
        k = max(depths)
        per_proc = len(rows) // self.procs.world
        base = self.procs.rank * per_proc
        size = per_proc // self.accum
        micro = [list(range(base + a * size, base + (a + 1) * size)) for a in range(self.accum)]
        keep = self.accum == 1  # one micro-batch: the update trains on the rollout's forward
        rolls = [self._rollout(rows, idx, depths, noise, k, keep) for idx in micro]
        rewards = self.procs.gather_rows(torch.cat([r["rewards"] for r in rolls]))
        advs = self._advantages(rolls, rewards)
        losses, kls, clipped_frac, entropies, skipped = [], [], [], [], 0
        grad_norm: Any = 0.0
        for it in range(g.num_iterations):
            for roll, adv in zip(rolls, advs, strict=True):
                if it == 0 and roll["scores"] is not None:
                    scores = roll["scores"]
                else:
                    scorer = roll["scorer"] or self._scorer(roll["prompts"], roll["ns"])
                    with self.autocast():
                        scores = roll["fused"](scorer())
                drawn, old, mask = roll["drawn"], roll["old"], roll["mask"]
                logp = pl_place_log_probs(scores, drawn, g.temperature)
                loss = pl_grpo_loss(logp, old, adv, mask, g.epsilon, g.epsilon_high)
                with torch.no_grad():
                    ratio = torch.exp(logp - old)
                    out = (ratio < 1 - g.epsilon) | (ratio > 1 + g.epsilon_high)
                    clipped_frac.append(
                        float((out.float() * mask).sum() / (mask.sum() * len(drawn[0])))
                    )
                if roll["ref"] is not None:
                    kl = pl_prefix_kl(scores, roll["ref"], drawn, g.temperature) * mask
                    kl = kl.sum(-1).mean()
                    loss = loss + g.beta * kl
                    kls.append(float(kl.detach()))
                (loss / self.accum).backward()
                losses.append(float(loss.detach()))
                if it == g.num_iterations - 1:
                    with torch.no_grad():
                        p = torch.softmax(scores.detach() / g.temperature, -1)
                        entropies.append(float(-(p * torch.log(p.clamp_min(1e-12))).sum(-1).mean()))
            grad_norm, ok = self._optimizer_step()
            skipped += not ok
        mean = self.procs.mean
        entry = {
            "step": self.state.global_step + 1,
            "loss": mean(sum(losses) / len(losses)),
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std(1).mean()),
            "frac_reward_zero_std": float((rewards.std(1) < 1e-6).float().mean()),
            "entropy": mean(sum(entropies) / len(entropies)),
            "grad_norm": float(grad_norm),
            "pl_depth": sum(depths) / len(depths),
            "clip_ratio": mean(sum(clipped_frac) / len(clipped_frac)),
            # The reward service's components under the names the TRL path logs them by
            # (reward/r_ans, reward/parse_rate, …), which the run report reads.
            **{f"reward/{k}": v for k, v in (self.reward_fn.last_metrics or {}).items()},
        }
        if kls:
            entry["kl"] = mean(sum(kls) / len(kls))
        if skipped:
            entry["nonfinite_grad_skipped"] = skipped
        if g.pl_advantage == "best_of_group":  # how many rankings a group's weight is shared by
            entry["best_share"] = mean(float((torch.cat(advs) > -1.0).float().mean()))
        return entry

    # -- the loop's surface ------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | None = None) -> None:
        import torch

        if resume_from_checkpoint:
            self._resume(Path(resume_from_checkpoint))
        torch.manual_seed(self.g.seed + self.state.global_step)
        t0 = time.perf_counter()
        budget = TimeBudget(self.cfg.epochs.max_minutes)
        bad_run = 0
        while self.state.global_step < self.max_steps:
            entry = self._step(self.state.global_step)
            self.state.global_step += 1
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            self.state.log_history.append(entry)
            bad_run = self._count_nonfinite(entry, bad_run)
            if self.procs.is_main and self.state.global_step % max(1, self.g.logging_steps) == 0:
                self.log(
                    f"step {entry['step']}/{self.max_steps}: reward {entry['reward']:.3f}, "
                    f"entropy {entry['entropy']:.3f}, {entry['seconds']:.0f} s"
                )
            # Out of time: this step is saved with its log and optimizer (a resume goes on from
            # it) and the epoch loop validates it as its last.
            # The main process's clock decides for all: one process stopping alone would leave
            # the others waiting in the next step's collectives.
            stop = self.procs.broadcast(
                budget.expired() and self.state.global_step < self.max_steps
            )
            if stop:
                self.log(budget.note(self.state.global_step))
                entry["stopped"] = "max_minutes"
            save = self.cfg.epochs.save_steps
            if stop or (save > 0 and self.state.global_step % save == 0):
                self.save_checkpoint()
            if stop:
                break

    def _count_nonfinite(self, entry: dict[str, Any], bad_run: int) -> int:
        """Steps in a row whose gradient was not finite (each skipped by ``_step``), up to and
        including ``entry``; stops the run at ``MAX_NONFINITE_STEPS``."""
        if not entry.get("nonfinite_grad_skipped"):
            return 0
        bad_run += 1
        self.log(
            f"step {entry['step']}: non-finite gradient (norm {entry['grad_norm']}); its "
            "optimizer step was skipped"
        )
        if bad_run >= MAX_NONFINITE_STEPS:
            raise MemSifterError(
                f"{bad_run} steps in a row ended with a non-finite gradient (the last at step "
                f"{entry['step']}): the run stops rather than train on NaN. Its checkpoints up "
                "to then are intact; lower grpo.learning_rate or look at those steps' prompts"
            )
        return bad_run

    def save_model(self, path: str) -> None:
        """The model (an adapter under LoRA) and tokenizer, written by the main process only.
        Every process calls it: sharded, the weights are first gathered (collective); else
        every process holds the same weights."""
        state = full_state(self.root) if self.root is not None else None
        if not self.procs.is_main:
            return
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if state is None:
            self.model.save_pretrained(str(out))
        else:
            self.model.save_pretrained(str(out), state_dict=state)
        self.tok.save_pretrained(str(out))
        for hook in self.on_save:
            hook(out)

    def save_checkpoint(self) -> Path:
        import torch

        out = self.output_dir / f"checkpoint-{self.state.global_step}"
        self.save_model(str(out))  # every process: collective when sharded
        optimizer = (
            self.opt.state_dict()
            if self.root is None
            else full_optimizer_state(self.root, self.opt)
        )
        if self.procs.is_main:
            torch.save(optimizer, out / "optimizer.pt")
            torch.save(self.sched.state_dict(), out / "scheduler.pt")
            if self.master is not None:  # the float32 weights the saved bf16 ones round
                from memsifter.training.averaging import MASTER_FILE

                torch.save(self._master_state(), out / MASTER_FILE)
            self.state.save_to_json(out / "trainer_state.json")
        self.procs.barrier()  # on disk before any process reads it
        return out

    def _master_state(self) -> dict[str, Any]:
        """The float32 masters by their parameters' names: the names in the saved weights, so
        averaging can read each master in place of its bf16-rounded tensor."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {names[id(p)]: m.detach() for m, p in zip(self.master or [], self.params,
                                                         strict=True)}  # fmt: skip

    def _resume(self, ckpt: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        state_file = ckpt / "trainer_state.json"
        if not state_file.is_file():
            raise DataError(f"cannot resume from {ckpt}: no trainer_state.json", file=str(ckpt))
        if self.root is not None:
            self._resume_sharded(ckpt)
        elif self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"))
        else:
            loaded = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=self.model.dtype)
            self.model.load_state_dict(loaded.state_dict())
        from memsifter.training.averaging import MASTER_FILE

        masters = ckpt / MASTER_FILE
        if self.master is not None:
            saved = torch.load(masters, weights_only=True) if masters.is_file() else {}
            if not saved:  # a checkpoint from before masters were saved: say what it resumes
                self.log(f"{ckpt} holds no {MASTER_FILE}: the float32 masters restart from "
                         "its saved weights")  # fmt: skip
            names = {id(p): n for n, p in self.model.named_parameters()}
            with torch.no_grad():
                for m, p in zip(self.master, self.params, strict=True):
                    m.copy_(saved.get(names[id(p)], p.float()))
        opt = ckpt / "optimizer.pt"
        # Written sharded or not, it is read in this run's form (a run sharded over 8 GPUs
        # resumes on one, and the reverse); a state of other parameters is refused by name.
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        if opt.is_file() and self.root is not None:
            held: dict[str, Any] = {}

            def read_optimizer() -> None:  # the main process's; a failure fails every process
                saved = torch.load(opt, weights_only=True)
                held.update(optimizer_state_for(saved, names, True, str(ckpt)))

            self.procs.run_on_main(read_optimizer, f"reading {opt}")
            load_full_optimizer_state(self.root, self.opt, held)
        elif opt.is_file():
            saved = torch.load(opt, weights_only=True)
            self.opt.load_state_dict(optimizer_state_for(saved, names, False, str(ckpt)))
        sched = ckpt / "scheduler.pt"
        if sched.is_file():
            self.sched.load_state_dict(torch.load(sched, weights_only=True))
        self.state = _State.load(state_file)
        self.log(f"resumed at step {self.state.global_step} from {ckpt}")

    def _resume_sharded(self, ckpt: Path) -> None:
        """The checkpoint's weights read by the main process into the full state it gathers,
        then scattered into every process's shards (collective)."""
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        state = full_state(self.root)  # rank 0's; the others' are empty

        def read() -> None:  # on the main process; a failure there fails every process
            if self.lora:
                adapter = load_file(ckpt / "adapter_model.safetensors")
                adapter_into(state, adapter, self.model.active_adapter)
                return
            saved = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
            weights = saved.state_dict()
            missing = sorted(set(state) - set(weights))
            if missing:
                raise DataError(
                    f"cannot resume from {ckpt}: it has no {missing[0]} "
                    f"({len(missing)} weights missing)",
                    file=str(ckpt),
                )
            state.update((k, weights[k]) for k in list(state))

        self.procs.run_on_main(read, f"reading {ckpt}")
        load_full_state(self.root, state)
