"""GRPO for the first-token ranking head: a Plackett–Luce policy over rankings, scored by the
same reward service.

Per prompt one forward pass gives the head's scores (:mod:`memsifter.ranker.first_token`);
``num_generations`` rankings are drawn from ``PL(softmax(scores / temperature))`` without
replacement by Gumbel top-k. Each ranking is written as the completion ``generate`` mode would
produce (``<ranking>3, 0, 4</ranking>``) and scored by the run's reward function, unchanged:
the R_ret warm-up, R_ans with its tiers and s_0, shaping, the gym's reader or a real answerer.
Advantages are group-relative with GRPO's ``scale_rewards`` choices (``group``: the group's
std; ``batch``: the batch's; ``none``), and the loss is the clipped surrogate
``-min(ρA, clip(ρ, 1-ε, 1+ε_high)A)`` with ``ρ = PL(σ) / PL_old(σ)``: on the first pass over a
batch ρ = 1 and the gradient is exactly ``-A ∇log PL(σ)``; ``num_iterations > 1`` reuses the
batch under the clip, as TRL does. ``beta > 0`` adds the KL of the head's first-place
distribution to the start model's.

There is no decode, no format to learn and nothing to parse, so a step costs one forward and
one backward per prompt rather than per completion. No format SFT is needed; ``sft.enabled``
runs the head's own cold start instead, a listwise cross-entropy on the gold label
(:mod:`memsifter.training.listwise_sft`).

The trainer has the slice of ``transformers.Trainer``'s surface that the epoch loop uses
(``train(resume_from_checkpoint)``, ``state``, ``save_model``) and saves ``checkpoint-N``
folders the loop validates and averages like TRL's. One process only.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memsifter.errors import DataError
from memsifter.ranker.first_token import gumbel_topk, head_scores, pl_log_prob, ranking_text

Log = Callable[[str], None]
SCALES = ("group", "batch", "none")


def group_advantages(rewards: Any, scale: str) -> Any:
    """``[B, G]`` rewards to advantages: minus the group mean, divided by the group's std
    (``group``), the whole batch's (``batch``) or nothing (``none``), as TRL's GRPO does."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {SCALES}, got {scale!r}")
    adv = rewards - rewards.mean(1, keepdim=True)
    if scale == "group":
        adv = adv / (rewards.std(1, keepdim=True) + 1e-4)
    elif scale == "batch":
        adv = adv / (rewards.std() + 1e-4)
    return adv


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
    if g.scale_rewards not in SCALES:
        raise DataError(f"grpo.scale_rewards must be one of {SCALES}", field="grpo.scale_rewards")


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
    ) -> None:
        import torch

        from memsifter.training.grpo import load_policy

        check_settings(cfg)
        self.cfg = cfg
        self.g = cfg.grpo
        self.reward_fn = reward_fn
        self.output_dir = Path(output_dir)
        self.on_save = list(on_save)
        self.log = log
        self.rows = [dict(r) for r in train_dataset]
        if not self.rows:
            raise DataError("the first-token trainer has no training prompts")
        self.columns = [c for c in self.rows[0] if c not in ("prompt", "prompt_messages")]
        self.model, self.tok, peft_config = load_policy(cfg, model_path, cuda)
        self.lora = peft_config is not None
        if self.lora:
            from peft import get_peft_model

            # Checkpoints are then adapters; the loop merges them for validation and averaging.
            self.model = get_peft_model(self.model, peft_config)
        if cuda:
            self.model.to("cuda")
        self.model.train()
        self.ref = None
        if self.g.beta > 0:
            import copy

            self.ref = copy.deepcopy(self.model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.opt = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.g.learning_rate,
            weight_decay=self.g.weight_decay,
        )
        self.state = _State()
        self.prompts_per_step = self.g.per_device_train_batch_size // self.g.num_generations
        steps = cfg.epochs.max_steps
        if steps <= 0:  # one pass: every prompt once
            steps = math.ceil(len(self.rows) / self.prompts_per_step)
        self.max_steps = steps

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

    def _step(self, step: int) -> dict[str, Any]:
        import torch

        g = self.g
        rows = self._batch(step)
        prompts = [r["prompt"] for r in rows]
        ns = [int(r["n_candidates"]) for r in rows]
        gen = torch.Generator().manual_seed(g.seed * 1_000_003 + step)
        scores = head_scores(self.model, self.tok, prompts, ns)
        drawn = gumbel_topk(scores, g.num_generations, temperature=g.temperature, generator=gen)
        # A row with fewer candidates than the batch's widest draws its padding (-inf) last.
        rankings = [[o[:n] for o in group] for group, n in zip(drawn.tolist(), ns, strict=True)]
        rewards = self._rewards(rows, rankings)
        adv = group_advantages(rewards, g.scale_rewards).to(scores.device)
        # Padded places add one constant to a row's log PL, the same for all its rankings:
        # group-relative advantages sum to 0 within the row, so it cancels.
        old = pl_log_prob(scores, drawn, g.temperature).detach()
        losses = []
        for it in range(g.num_iterations):
            if it:
                scores = head_scores(self.model, self.tok, prompts, ns)
            logp = pl_log_prob(scores, drawn, g.temperature)
            ratio = torch.exp(logp - old)
            clipped = ratio.clamp(1 - g.epsilon, 1 + g.epsilon_high)
            loss = -torch.minimum(ratio * adv, clipped * adv).mean()
            if self.ref is not None:
                with torch.no_grad():
                    ref = head_scores(self.ref, self.tok, prompts, ns)
                # Padding as a finite floor: exp() of it is 0, and no -inf - -inf NaN.
                p = torch.log_softmax((scores / g.temperature).clamp_min(-1e4), -1)
                q = torch.log_softmax((ref / g.temperature).clamp_min(-1e4), -1)
                kl = (p.exp() * (p - q)).sum(-1).mean()
                loss = loss + g.beta * kl
            self.opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.requires_grad], g.max_grad_norm
            )
            self.opt.step()
            losses.append(float(loss.detach()))
        with torch.no_grad():
            p = torch.softmax(scores.detach() / g.temperature, -1)
            entropy = float(-(p * torch.log(p.clamp_min(1e-12))).sum(-1).mean())
        return {
            "step": self.state.global_step + 1,
            "loss": sum(losses) / len(losses),
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std(1).mean()),
            "frac_reward_zero_std": float((rewards.std(1) < 1e-6).float().mean()),
            "entropy": entropy,
            "grad_norm": float(grad_norm),
            **{f"rewards/{k}": v for k, v in (self.reward_fn.last_metrics or {}).items()},
        }

    # -- the loop's surface ------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | None = None) -> None:
        import torch

        if resume_from_checkpoint:
            self._resume(Path(resume_from_checkpoint))
        torch.manual_seed(self.g.seed + self.state.global_step)
        t0 = time.perf_counter()
        while self.state.global_step < self.max_steps:
            entry = self._step(self.state.global_step)
            self.state.global_step += 1
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            self.state.log_history.append(entry)
            if self.state.global_step % max(1, self.g.logging_steps) == 0:
                self.log(
                    f"step {entry['step']}/{self.max_steps}: reward {entry['reward']:.3f}, "
                    f"entropy {entry['entropy']:.3f}, {entry['seconds']:.0f} s"
                )
            save = self.cfg.epochs.save_steps
            if save > 0 and self.state.global_step % save == 0:
                self.save_checkpoint()

    def save_model(self, path: str) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out))
        self.tok.save_pretrained(str(out))
        for hook in self.on_save:
            hook(out)

    def save_checkpoint(self) -> Path:
        import torch

        out = self.output_dir / f"checkpoint-{self.state.global_step}"
        self.save_model(str(out))
        torch.save(self.opt.state_dict(), out / "optimizer.pt")
        self.state.save_to_json(out / "trainer_state.json")
        return out

    def _resume(self, ckpt: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        state_file = ckpt / "trainer_state.json"
        if not state_file.is_file():
            raise DataError(f"cannot resume from {ckpt}: no trainer_state.json", file=str(ckpt))
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"))
        else:
            loaded = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=self.model.dtype)
            self.model.load_state_dict(loaded.state_dict())
        opt = ckpt / "optimizer.pt"
        if opt.is_file():
            self.opt.load_state_dict(torch.load(opt, weights_only=True))
        self.state = _State.load(state_file)
        self.log(f"resumed at step {self.state.global_step} from {ckpt}")
