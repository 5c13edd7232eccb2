"""The reading gym's ladder: does a pretrained proxy learn to *read* a world built so that only
reading pays (level ``read``: several attributes a user, misleading cues, held-out phrasings and
values, two-session questions, s_0 > 0 on a stated share)?

    python -m eval.probes.gym_reading --size small                  # every stage of one rung
    python -m eval.probes.gym_reading --size small --stage probe    # the supervised pointing probe
    only
    python -m eval.probes.gym_reading --size small --recipe outcome --max-steps 120

One rung = one world size (``configs/gym/read_<size>.yaml``). Stages, each resumable (outputs
under ``outputs/gym_reading/<size>/``; a killed run picks up at the last checkpoint):

1. ``data``: ``configs/data/gym_read_first_token.yaml`` on the rung's world, rendered for
   SmolLM2-135M-Instruct, candidates in chronological order, labelled ``A``… (the first-token
   head's letters: one prefill ranks the whole window);
2. ``probe``: supervised pointing, the noiseless upper bound on what the budget allows:
   cross-entropy of the head's first place against the useful session(s), on train users,
   validation NDCG@1 by step. It uses the useful label, so it is a probe (how many steps
   pointing needs, at which learning rate and layers), never a row of the table.
   ``--probe-read`` reads the scores at the label or at each closer; ``--probe-warm-marker N``
   trains the closers first and the label read after them (can the last position copy the
   label of a closer that already knows its relevance, as a written ranking must?);
3. ``train``: each recipe of :data:`RECIPES` with ``memsifter train`` from SmolLM2 (the head's
   Plackett–Luce GRPO), R_ans (``outcome``), R_ret on the annotator labels (``labels``) and R_ans
   without s_0 (``outcome_absolute``). ``--ranking-head generate`` is the paper's form on its own
   rung (``<size>-generate``, data ``configs/data/gym_read_generate.yaml``): the proxy writes
   ``<ranking>3, 0, 7</ranking>`` and TRL's GRPO trains the written ids (recipe ``generate``,
   a format SFT on BM25's order first; evaluated against that SFT start as ``generate_sft``);
4. ``eval``: every ranker on the **test users** (they never choose anything): BM25, each
   shortcut rule of the audit (``eval/probes/gym_shortcuts.py``), the start model, each trained
   model
   and the oracle; NDCG@1 against the useful session(s) and answer accuracy from the top 1 and
   3 (the gym's reader); seen vs unseen phrasing/value; the s_0 > 0 share; cluster-bootstrap
   CIs that resample **users** (their questions share one history).

Writes the rung into ``eval/results/gym_reading/gym_reading.json`` (one entry per size under
``rungs``) and
regenerates ``eval/results/gym_reading/gym_reading.md`` from that JSON; each run's training log
goes to
``eval/results/gym_reading/runs/<size>/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from memsifter.machine import cpu_bf16_units, emulated_bf16_text
from memsifter.ranker.messages import LAYOUTS, MARKED_LAYOUTS

ROOT = Path(__file__).resolve().parents[2]

MODEL = "smollm2-135m-instruct"
DATA_RECIPE = "configs/data/gym_read_first_token.yaml"
# The paper's form, the proxy writing its ranking (TRL's GRPO on the generated ids): its own rung
# (``--ranking-head generate``, suffix ``-generate``), on its own data (digits, the parser's ids).
GENERATE_DATA_RECIPE = "configs/data/gym_read_generate.yaml"
RANKING_HEADS = ("first_token", "generate")
RECIPES: dict[str, str] = {
    "outcome": "configs/train/gym_read_pl_outcome.yaml",
    "outcome_kl": "configs/train/gym_read_pl_outcome_kl.yaml",
    "labels": "configs/train/gym_read_pl_labels.yaml",
    "outcome_absolute": "configs/train/gym_read_pl_outcome_absolute.yaml",
    "generate": "configs/train/gym_read_generate.yaml",
}
# The recipes that train a written ranking: only on a generate rung, and only they there.
GENERATE_RECIPES = ("generate",)
SIZES = ("ci", "small", "medium", "locomo")
STAGES = ("data", "probe", "train", "eval")
# validation NDCG@1 (useful session) a run must reach for "steps to learn": the goal
LEARNED = 0.8
RESULTS = ROOT / "eval/results/gym_reading"
RUNS = RESULTS / "runs"  # each rung's logs, validation and rankings, committed


def recipe_of(name: str) -> str:
    """A run's recipe: its name up to the first ``+``. ``outcome_kl+b32`` is a variant of
    ``outcome_kl`` trained under its own name; its ``--set`` overrides are in its run record."""
    return name.split("+", 1)[0]


def without_notes(argv: list[str]) -> list[str]:
    """The command line as recorded: the ``--note`` texts are the rung's notes already."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--note":
            skip = True
        elif not arg.startswith("--note="):
            out.append(arg)
    return out


# Fields that place a run (where it writes, which copy of the rung's data, how many CPU threads)
# or record where its values came from, rather than shape what it learns; with the reward, the
# rest must be equal for two runs to be a reward ablation.
PLACEMENT = ("output_dir", "data", "threads", "reward", "source", "overrides")


def learning_settings(record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A run's reward config and every other setting that shapes what it learns, from its
    record in the rung (its recipe and the overrides it was trained with)."""
    from memsifter.training.config import load_train_config

    cfg = dataclasses.asdict(load_train_config(ROOT / record["config"], record["overrides"]))
    # A recipe selects checkpoints by its own reward's metric (a labels run cannot select by
    # the outcome it is the ablation of): part of the reward, not of the settings compared.
    cfg["epochs"].pop("select_metric")
    settings = {k: v for k, v in cfg.items() if k not in PLACEMENT}
    # which copy of the data is placement, but the order its train prompts show is learnt
    settings["train_shuffle_share"] = record.get("train_shuffle_share", 0.0)
    return str(cfg["reward"]), settings


def ablations(records: dict[str, dict[str, Any]], names: list[str]) -> dict[str, dict[str, str]]:
    """Each outcome-reward run among ``names`` -> its ``labels`` and ``outcome_absolute`` runs:
    those trained with the same learning settings and the other reward. Paired by what was
    trained, not by name: ``outcome_kl`` (the recipe) pairs with ``labels+kl`` (the labels
    recipe with the KL recipe's values set), and a labels run with another learning rate or step
    budget pairs with nothing."""
    from memsifter.training.config import load_train_config

    reward_of = {
        str(load_train_config(ROOT / RECIPES[r], []).reward): r
        for r in ("outcome", "labels", "outcome_absolute")
    }
    kinds: dict[str, tuple[str, dict[str, Any]]] = {}
    for name in names:
        if "config" in records.get(name, {}):
            reward, settings = learning_settings(records[name])
            if reward in reward_of:
                kinds[name] = (reward_of[reward], settings)
    pairs: dict[str, dict[str, str]] = {}
    for name, (kind, settings) in kinds.items():
        if kind != "outcome":
            continue
        for other, (other_kind, other_settings) in kinds.items():
            if other_kind != "outcome" and other_settings == settings:
                pairs.setdefault(name, {})[other_kind] = other
    return pairs


def order_twins(records: dict[str, dict[str, Any]], names: list[str]) -> dict[str, str]:
    """Each run among ``names`` trained with shuffled train orders (``--train-shuffle``) -> its
    date-order twin: the run with the same reward and every other learning setting, trained on
    the date-ordered prompts. Paired by what was trained, as :func:`ablations`."""
    kinds: dict[str, tuple[str, dict[str, Any], float]] = {}
    for name in names:
        if "config" in records.get(name, {}):
            reward, settings = learning_settings(records[name])
            kinds[name] = (reward, settings, settings.pop("train_shuffle_share"))
    return {
        name: other
        for name, (reward, settings, share) in kinds.items()
        if share
        for other, (other_reward, other_settings, other_share) in kinds.items()
        if not other_share and (other_reward, other_settings) == (reward, settings)
    }


def run_name(value: str) -> str:
    if recipe_of(value) not in RECIPES:
        raise typer.BadParameter(
            f"{value!r}: a run is a recipe ({', '.join(RECIPES)}) or RECIPE+VARIANT",
            param_hint="--recipe",
        )
    return value


@contextlib.contextmanager
def rung_lock(out: Path) -> Any:
    """Runs of one rung trained side by side (on a lent GPU) each add their record to the
    rung's file; the read-modify-write of that file and of the results is one at a time."""
    import fcntl

    with (out / "rung.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def world_config(size: str) -> str:
    return f"configs/gym/read_{size}.yaml"


def code_version() -> str:
    from memsifter.provenance import code_version as version

    return version()


# -- 1. data ---------------------------------------------------------------------------------


def recipe_layout() -> str:
    from memsifter.training.rldata.build import load_rl_data_config

    return load_rl_data_config(ROOT / DATA_RECIPE).prompt.layout


# A rung's candidate order other than the dates' (PromptSpec.order), as its name's suffix.
ORDER_SUFFIX = {"newest_first": "newest"}
ORDERS = ("chronological", *ORDER_SUFFIX)


def rung_name(
    size: str,
    layout: str,
    read: str = "label",
    order: str = "chronological",
    head: str = "first_token",
) -> str:
    """The rung's folder and key: the size, the layout when it is not the recipe's, the
    head's read when it is the marker read (which implies layout marked, or names restated),
    the candidate order when it is not the dates' (``-newest``: newest first), and
    ``-generate`` when the proxy writes its ranking instead of the first-token head's."""
    if read == "marker":
        name = f"{size}-marker" if layout == "marked" else f"{size}-{layout}-marker"
    else:
        name = size if layout == recipe_layout() else f"{size}-{layout}"
    name = name if order == "chronological" else f"{name}-{ORDER_SUFFIX[order]}"
    return name if head == "first_token" else f"{name}-generate"


def build_data(
    world: str,
    out: Path,
    layout: str,
    read: str = "label",
    train_shuffle: float = 0.0,
    order: str = "chronological",
    head: str = "first_token",
    labels: str | None = None,
) -> Path:
    """The rung's RL data, its candidates in ``order``; with ``train_shuffle``, a copy beside it
    whose train prompts show that share of their candidates in a random order (validation and
    test are the rung's). ``head: generate`` renders the paper's form (a written ranking).
    ``labels``: another labelling than the recipe's, in a copy beside the rung's data (a probe's
    prompts: the head's closers under a written ranking's digits, say)."""
    from memsifter.models import resolve_model
    from memsifter.training.rldata.build import load_rl_data_config, prepare_rl_data

    data = out / ("data" if not train_shuffle else f"data-train_shuffle{train_shuffle:g}")
    data = data if labels is None else data.with_name(f"{data.name}-labels_{labels}")
    if not (data / "prompt_spec.json").is_file():
        cfg = load_rl_data_config(
            ROOT / (GENERATE_DATA_RECIPE if head == "generate" else DATA_RECIPE)
        )
        cfg = dataclasses.replace(
            cfg,
            prompt=dataclasses.replace(
                cfg.prompt,
                model=MODEL,
                layout=layout,
                head_read=read,
                order=order,
                labels=labels or cfg.prompt.labels,
            ),
            sources=[dataclasses.replace(s, path=str(ROOT / world)) for s in cfg.sources],
            train_shuffle_share=train_shuffle,
        )
        resolve_model(MODEL)  # converts the GGUF once, before any worker needs it
        prepare_rl_data(cfg, data)
    return data


def load_split(data: Path, split: str) -> list[dict[str, Any]]:
    from datasets import load_dataset

    path = data / f"{split}.parquet"
    return list(load_dataset("parquet", data_files=str(path), split="train"))


# -- 2. the supervised pointing probe -----------------------------------------------------


class FrozenPrefix:
    """Train the top ``top`` layers on cached inputs. With LoRA on the top layers only, the
    hidden state entering layer ``L - top`` is a fixed function of the prompt: computed once a
    prompt (no grad), the steps then run the top layers alone, through the model's own forward
    on that slice fed as ``inputs_embeds``. One prompt at a time, so no padding and no mask.
    Exact, not an approximation: :meth:`check` compares it with the full model's scores."""

    def __init__(self, model: Any, top: int, device: str, autocast: bool) -> None:
        self.model = model
        self.inner = model.get_base_model().model  # the decoder stack under the LM head
        self.all = self.inner.layers
        self.cut = len(self.all) - top
        self.device = device
        self.autocast = autocast

    def _amp(self) -> Any:
        import torch

        return torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast)

    def _swap(self, part: Any) -> Any:
        from memsifter.ranker.first_token import only_layers

        return only_layers(self.inner, part)

    def prefix(self, ids: list[int]) -> Any:
        """The hidden state entering layer ``cut``, ``[T, H]``, fp32 on the CPU (bf16 storage
        would round the residual stream: 1e-2 in the logits)."""
        import torch

        got: dict[str, Any] = {}

        def keep(_m: Any, _a: Any, out: Any) -> None:
            got["h"] = out[0] if isinstance(out, tuple) else out

        hook = self.all[self.cut - 1].register_forward_hook(keep)
        try:
            with torch.no_grad(), self._swap(self.all[: self.cut]), self._amp():
                self.inner(input_ids=torch.tensor([ids], device=self.device))
        finally:
            hook.remove()
        return got["h"][0].to(torch.float32).cpu()

    def logits(self, h: Any) -> Any:
        """The last position's logits from a cached prefix (differentiable in the top layers)."""
        import torch

        dtype = next(self.model.parameters()).dtype
        with self._swap(self.all[self.cut :]), self._amp():
            out = self.model(inputs_embeds=h[None].to(self.device, dtype), logits_to_keep=1)
        return out.logits[0, -1].to(torch.float32)

    def logits_at(self, h: Any, positions: list[int]) -> Any:
        """The logits ``[len(positions), V]`` at those positions, from a cached prefix."""
        import torch

        dtype = next(self.model.parameters()).dtype
        keep = torch.tensor(positions, device=self.device)
        with self._swap(self.all[self.cut :]), self._amp():
            out = self.model(inputs_embeds=h[None].to(self.device, dtype), logits_to_keep=keep)
        return out.logits[0].to(torch.float32)

    def check(
        self,
        tok: Any,
        prompt: str,
        label_ids: list[int],
        marker: tuple[int, str] | None = None,
    ) -> float:
        """Largest difference between the cached path's scores and the full model's on
        ``prompt``, both in fp32 (it must be float noise): the label logits at the last
        position, or with ``marker`` (the candidate count, the labelling) the read token's
        logit at each closer, the full model's through the library's ``head_scores``."""
        import torch

        from memsifter.ranker.first_token import head_scores, marker_positions, marker_token_id

        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        was, self.autocast = self.autocast, False
        try:
            with torch.no_grad():
                if marker is None:
                    full = self.model(input_ids=torch.tensor([ids], device=self.device))
                    a = full.logits[0, -1, label_ids].float()
                    b = self.logits(self.prefix(ids))[label_ids]
                else:
                    n, labels = marker
                    a = head_scores(self.model, tok, [prompt], [n], labels=labels, read="marker")
                    where = marker_positions(tok, prompt, n, labels)
                    b = self.logits_at(self.prefix(ids), where)[:, marker_token_id(tok)]
                    a = a[0]
        finally:
            self.autocast = was
        return float((a - b).abs().max())


def probe(
    data: Path,
    out: Path,
    steps: int,
    lr: float,
    top_layers: int,
    batch: int,
    autocast: str = "bf16",
    log: Any = print,
    pool: int = 0,
    target: str = "useful",
    read: str | None = None,
    warm_marker: int = 0,
    copy_from: str = "useful",
) -> dict[str, Any]:
    """Cross-entropy of the head's first place against the useful set (log of the summed
    probability of the useful labels), LoRA on the top ``top_layers`` layers as the recipes
    train, validation NDCG@1 every ``steps // 6`` steps on 40 validation memory questions, one
    a user (the recipes' validation size); ``target: last`` trains and scores the newest
    candidate instead, a positive control of the machinery. ``pool > 0``: a seeded pool of
    that many training prompts, their frozen layers' output cached once
    (:class:`FrozenPrefix`), and the steps drawn from it: the same updates at a fraction of the
    cost a step, so many more steps (and passes over the pool) fit the budget.

    ``warm_marker > 0`` (label read only): the first that many steps train the marker read
    alone, so each closer learns whether its session answers; the label read is trained after
    them, the marker read's loss kept beside it, and validation scores both reads. It asks
    whether the last position can learn to copy the label of a closer that already knows
    its relevance (the written ranking must point exactly so). ``copy_from: marker`` trains
    the label read on the marker read's own first choice instead of the useful label (the
    marker loss beside it keeps the label): can the model teach its written first id from
    its own closers, as a recipe with no label would have to?"""
    import random

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.models import resolve_model
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.ranker.first_token import (
        MARKER_TOKEN,
        head_scores,
        marker_positions,
        marker_token_id,
    )

    spec = read_spec(data)
    read = read or spec.head_read  # the data's own read unless the probe overrides it
    # Refused before the model loads: a warm phase needs closers and the cached pool, and
    # leaves steps for the label read.
    if warm_marker and (read != "label" or spec.layout not in MARKED_LAYOUTS or not pool):
        raise ValueError(
            f"--probe-warm-marker trains the marker read before the label read: it needs the "
            f"label read, closing markers and the cached pool (got read {read!r}, layout "
            f"{spec.layout!r}, --probe-pool {pool})"
        )
    if copy_from not in ("useful", "marker") or (copy_from == "marker" and not warm_marker):
        raise ValueError(
            f"--probe-copy-from {copy_from!r}: useful, or marker (the marker read's own first "
            f"choice, which needs --probe-warm-marker to have trained it; got {warm_marker})"
        )
    if not 0 <= warm_marker < steps:
        raise ValueError(
            f"--probe-warm-marker {warm_marker}: a number of steps in [0, {steps}) (--probe-steps "
            f"{steps}), so the label read trains after it"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a lent GPU runs the same probe
    if autocast == "bf16" and device == "cpu" and not cpu_bf16_units():
        log(emulated_bf16_text("--probe-autocast bf16", "--probe-autocast none runs float32"))
    path = resolve_model(MODEL).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    layers = model.config.num_hidden_layers
    torch.manual_seed(0)  # LoRA's A is drawn at random: two probes start from the same adapter
    model = get_peft_model(
        model,
        LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
            layers_to_transform=list(range(layers - top_layers, layers)),
            task_type="CAUSAL_LM",
        ),
    )
    model.to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)

    def targeted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``useful``: the useful sessions; ``last``: the newest candidate, whatever it says
        (the positive control: a position the head can learn without reading)."""
        if target == "useful":
            return rows
        return [{**r, "useful_positions": [int(r["n_candidates"]) - 1]} for r in rows]

    train = targeted([r for r in load_split(data, "train") if r["useful_positions"]])
    # One question from each of 40 users: users, not questions, are the independent unit.
    val = sample_per_user([r for r in load_split(data, "validation") if r["useful_positions"]], 1)
    val = targeted(val[:40])
    coarse_first = sum(r["coarse_order"][0] in r["useful_positions"] for r in val) / len(val)
    rng = random.Random(0)

    if read == "marker" or warm_marker:
        read_id = marker_token_id(tok)
    positions: dict[str, list[int]] = {}

    def where(r: dict[str, Any]) -> list[int]:
        key = r["prompt"]
        if key not in positions:
            positions[key] = marker_positions(tok, key, int(r["n_candidates"]), spec.labels)
        return positions[key]

    def scores(rows: list[dict[str, Any]], how: str = read) -> Any:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast == "bf16"):
            return head_scores(
                model,
                tok,
                [r["prompt"] for r in rows],
                [int(r["n_candidates"]) for r in rows],
                labels=spec.labels,
                read=how,
            )

    def evaluate(how: str = read) -> float:
        model.eval()
        hits = 0
        with torch.no_grad():
            for i in range(0, len(val), 8):
                rows = val[i : i + 8]
                top = scores(rows, how).argmax(-1).tolist()
                hits += sum(t in r["useful_positions"] for t, r in zip(top, rows, strict=True))
        model.train()
        return hits / len(val)

    marker_curve: list[tuple[int, float]] = []

    def evaluated(step: int) -> str:
        """Validation at ``step``: the probe's read, and the marker read beside it when the
        marker read was trained first."""
        curve.append((step, evaluate()))
        if not warm_marker:
            return f"validation NDCG@1 {curve[-1][1]:.3f}"
        marker_curve.append((step, evaluate("marker")))
        return (
            f"validation NDCG@1 label read {curve[-1][1]:.3f}, "
            f"marker read {marker_curve[-1][1]:.3f}"
        )

    curve: list[tuple[int, float]] = []
    log(f"probe step 0: {evaluated(0)} (n = {len(val)})")
    every = max(1, steps // 6)
    frozen = None
    if pool and top_layers >= layers:
        raise ValueError(
            f"--probe-pool caches the frozen layers below the adapted ones; with "
            f"--probe-layers {top_layers} of {layers} nothing is frozen (drop --probe-pool)"
        )
    if pool:
        from memsifter.ranker.first_token import label_token_ids

        frozen = FrozenPrefix(model, top_layers, device, autocast == "bf16")
        labels_all = label_token_ids(tok, max(int(r["n_candidates"]) for r in train), spec.labels)
        diff = frozen.check(tok, val[0]["prompt"], labels_all)
        if read == "marker" or warm_marker:
            n0 = int(val[0]["n_candidates"])
            diff = max(diff, frozen.check(tok, val[0]["prompt"], [], (n0, spec.labels)))
        if diff > 1e-3:
            raise RuntimeError(f"the cached top layers differ from the full model by {diff}")
        log(f"frozen prefix: cached path = full model to {diff:.1e} on a validation prompt")
        t_cache = time.perf_counter()
        train = random.Random(1).sample(train, min(pool, len(train)))
        cached = [frozen.prefix(tok(r["prompt"], add_special_tokens=False)["input_ids"])
                  for r in train]  # fmt: skip
        log(f"cached {len(train)} prompts in {time.perf_counter() - t_cache:.0f} s")

    def pointing_loss(logits: Any, r: dict[str, Any], size: int) -> Any:
        logp = torch.log_softmax(logits, -1)
        return -torch.logsumexp(logp[list(r["useful_positions"])], -1) / size

    def cached_loss(rows: list[int], reads: tuple[str, ...]) -> Any:
        """The batch's loss from cached prefixes (summed over ``reads``), backpropagated a
        prompt at a time; the first read's alone is returned, the one the log follows."""
        total = 0.0
        for i in rows:
            r = train[i]
            n = int(r["n_candidates"])
            logits = {
                how: frozen.logits_at(cached[i], where(r))[:, read_id]  # type: ignore[union-attr]
                if how == "marker"
                else frozen.logits(cached[i])[labels_all[:n]]  # type: ignore[union-attr]
                for how in reads
            }
            # The label read's target: the useful set, or the closers' own first choice.
            copied = (
                {**r, "useful_positions": [int(logits["marker"].argmax())]}
                if copy_from == "marker" and "marker" in logits
                else r
            )
            losses = [
                pointing_loss(logits[how], copied if how == "label" else r, len(rows))
                for how in reads
            ]
            sum(losses).backward()
            total += float(losses[0].detach())
        return total

    t0 = time.perf_counter()
    window: list[float] = []
    # The loss of always answering uniformly: log(n / |useful|) a prompt, averaged.
    chance = sum(math.log(r["n_candidates"] / len(r["useful_positions"])) for r in train)
    log(f"uniform-guess loss on the train prompts: {chance / len(train):.3f}")
    for step in range(1, steps + 1):
        opt.zero_grad()
        if frozen is not None:
            if step <= warm_marker:
                reads: tuple[str, ...] = ("marker",)
            else:
                reads = (read, "marker") if warm_marker else (read,)
            window.append(cached_loss(rng.sample(range(len(train)), batch), reads))
        else:
            rows = rng.sample(train, batch)
            logp = torch.log_softmax(scores(rows).clamp_min(-1e4), -1)
            useful = torch.zeros_like(logp, dtype=torch.bool)
            for i, r in enumerate(rows):
                useful[i, list(r["useful_positions"])] = True
            loss = -torch.logsumexp(logp.masked_fill(~useful, float("-inf")), -1).mean()
            loss.backward()
            window.append(float(loss))
        opt.step()
        if step % every == 0 or step == steps or step == warm_marker:
            which = "marker read" if step <= warm_marker else f"{read} read"
            if copy_from == "marker" and step > warm_marker:
                which += " against the marker read's first choice"
            log(
                f"probe step {step}: mean train loss ({which}) "
                f"{sum(window) / len(window):.3f} over the last {len(window)} steps, "
                f"{evaluated(step)}, {time.perf_counter() - t0:.0f} s"
            )
            window = []
    return {
        "what": "supervised pointing probe (uses the useful label: not a recipe)",
        "device": device,
        "target": target,
        "read": read if read == "label" else f"marker ({MARKER_TOKEN!r} logit at each closer)",
        "uniform_loss": round(chance / len(train), 3),
        "pool": len(train) if pool else None,
        "passes_over_pool": round(steps * batch / len(train), 2) if pool else None,
        "lr": lr,
        "lora_top_layers": top_layers,
        "batch": batch,
        "autocast": autocast,
        "steps": steps,
        "split": "validation",
        "n_questions": len(val),
        "curve": curve,
        # The coarse filter's first session on the same questions: the bar a recipe must pass.
        **({"coarse_ndcg@1": round(coarse_first, 3)} if target == "useful" else {}),
        **({"warm_marker_steps": warm_marker, "marker_curve": marker_curve} if warm_marker else {}),
        **({"copy_from": copy_from} if copy_from != "useful" else {}),
        "seconds": round(time.perf_counter() - t0),
    }


# -- 3. training -----------------------------------------------------------------------------


def train(
    name: str,
    data: Path,
    out: Path,
    max_steps: int | None,
    log: Any = print,
    sets: list[str] | None = None,
    until: str | None = None,
) -> dict[str, Any]:
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    run_dir = out / "train" / name
    over = [f"output_dir={run_dir}", f"data={data}", f"model.name={MODEL}"]
    if max_steps is not None:
        over.append(f"epochs.max_steps={max_steps}")
    over += sets or []
    cfg = load_train_config(ROOT / RECIPES[recipe_of(name)], over)
    if until == "sft" and not cfg.sft.enabled:
        raise typer.BadParameter(
            f"{name}: its recipe has no format SFT to stop after (sft.enabled is false)",
            param_hint="--until-sft",
        )
    t0 = time.perf_counter()
    result = run_training(cfg, log=log, until=until)
    return {
        "model": str(result["model"]),
        **({"stage": result["stage"]} if "stage" in result else {}),
        "config": RECIPES[recipe_of(name)],
        "overrides": over[3:],
        "seconds": round(time.perf_counter() - t0),
    }


def teacher_of(value: str, world_path: str) -> tuple[Path, Path]:
    """``RUNG/RUN``: a first-token head's run trained on a rung of the same world, here in
    ``outputs/``; its model and that rung's data."""
    rung, _, run = value.partition("/")
    their = ROOT / "outputs/gym_reading" / rung
    if not (rung and run and (their / "rung.json").is_file()):
        raise typer.BadParameter(
            f"{value!r}: RUNG/RUN of a rung trained here", param_hint="--teacher"
        )
    record = json.loads((their / "rung.json").read_text())
    if record.get("ranking_head", "first_token") != "first_token":
        raise typer.BadParameter(
            f"{value!r}: the teacher is a first-token head", param_hint="--teacher"
        )
    if record["world_config"] != world_path:
        raise typer.BadParameter(
            f"{value!r} was trained on {record['world_config']}, not this rung's {world_path}: "
            "its train users are not these",
            param_hint="--teacher",
        )
    runs = record.get("runs", {})
    model = runs.get(run, {}).get("model")
    if model is None or not Path(model).is_dir():
        raise typer.BadParameter(
            f"{value!r}: rung {rung} has no trained run {run!r} here (runs: {sorted(runs)})",
            param_hint="--teacher",
        )
    return Path(model), their / "data"


def useful_hits(rows: list[dict[str, Any]], rankings: Sequence[Sequence[int]]) -> list[float]:
    """Per row, 1.0 where its ranking puts a useful session first (NDCG@1 of the useful
    session, binary relevance), else 0.0; an empty ranking counts as a miss."""
    return [
        float(bool(r) and r[0] in row["useful_positions"])
        for row, r in zip(rows, rankings, strict=True)
    ]


def useful_first(rows: list[dict[str, Any]], rankings: Sequence[Sequence[int]]) -> float:
    """The share of ``rows`` whose ranking puts a useful session first, 3 decimals."""
    hits = useful_hits(rows, rankings)
    return round(sum(hits) / max(len(hits), 1), 3)


TEACHER_READS = ("own", "pen")


def teacher_rankings(
    model: str | Path, their_data: Path, data: Path, path: Path, reads: str = "own"
) -> dict[str, Any]:
    """A trained head's rankings of this rung's train pool, written to ``path`` for a written
    ranking's format start to copy (``sft.target: rankings``). Train users only.

    ``reads: own``: the head reads its own rung's prompts (its layout, read and labels), and
    each ranking is carried to this rung's prompts by session id. ``reads: pen``: the head's
    marker read on this rung's own prompts, under this rung's labels (:func:`closer_rankings`):
    with the teacher's weights as the pen's start, the lesson is then what the pen's own
    closers say on the very prompt it is taught on, the one thing its first id can copy.

    Returns the record: the carry's counts and how often the teacher's first session is useful
    on these prompts (the lesson's quality, not a result)."""
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.training.rldata.curriculum import carry_rankings, write_rankings

    rows = load_split(data, "train_pool")
    if reads == "pen":
        ranked = closer_rankings(model, rows, read_spec(data))
        lesson = {str(r["qid"]): order for r, order in zip(rows, ranked, strict=True)}
        dropped = unranked = 0
    else:
        theirs = load_split(their_data, "train_pool")
        ranked = rank_with(model, theirs, read_spec(their_data))
        qids = [str(r["qid"]) for r in theirs]
        carried = carry_rankings(dict(zip(qids, ranked, strict=True)), theirs, rows)
        lesson, dropped, unranked = carried.rankings, carried.dropped, carried.unranked
    write_rankings(path, ((str(r["qid"]), lesson[str(r["qid"])]) for r in rows))
    memory = [r for r in rows if r["useful_positions"]]
    return {
        "rankings": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "reads": reads,
        "n_prompts": len(rows),
        "dropped_sessions": dropped,
        "unranked_sessions": unranked,
        "train_useful_first": useful_first(memory, [lesson[str(r["qid"])] for r in memory]),
        "n_memory_prompts": len(memory),
    }


def closer_rankings(
    model: str | Path, rows: list[dict[str, Any]], spec: Any, batch_size: int = 4
) -> list[list[int]]:
    """A model's marker read on a written ranking's prompts, best first: the marker token's
    logit at each candidate's closer (``spec.labels``), read in one forward pass a prompt.
    The prompt is extended by ``<ranking>``, the written form's own opening, where its first id
    is written; a causal model's closers do not see it, so it changes no score. Needs the
    closers of a marked layout (refused by name otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.ranker.first_token import rank_prompts

    if spec.layout not in MARKED_LAYOUTS:
        raise ValueError(f"layout {spec.layout!r} has no closing markers to read")
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.pad_token = tok.pad_token or tok.eos_token
    net = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net.to(device)
    return rank_prompts(
        net,
        tok,
        [str(r["prompt"]) + "<ranking>" for r in rows],
        [int(r["n_candidates"]) for r in rows],
        batch_size,
        labels=spec.labels,
        read="marker",
    )


def curve_of(run_dir: Path) -> list[tuple[int, float]]:
    """Validation NDCG@1 (useful session) by step, from the loop's validation file."""
    vfile = run_dir / "epoch-0" / "validation.json"
    if not vfile.is_file():
        return []
    points = []
    for key, res in json.loads(vfile.read_text()).items():
        if res.get("ndcg_1_useful") is None:
            continue
        if key == "start":
            points.append((0, res["ndcg_1_useful"]))
        elif key.startswith("checkpoint-"):
            points.append((int(key.split("-")[1]), res["ndcg_1_useful"]))
    return sorted(points)


def steps_to_learn(curve: list[tuple[int, float]]) -> int | None:
    return next((s for s, v in curve if v >= LEARNED), None)


def _write_history(path: Path, history: list[dict[str, Any]]) -> str:
    """A trainer's log history as JSONL, one entry a line; the path as committed."""
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in history))
    return str(path.relative_to(ROOT))


def copy_logs(name: str, run_dir: Path, size: str) -> list[str]:
    """The run's log history (per step: reward, entropy, loss, seconds), its SFT start's when
    it has one, and its validation, committed beside the table."""
    dest = RUNS / size
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    states = sorted(
        run_dir.glob("epoch-0/checkpoint-*/trainer_state.json"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    if states:
        log_history = json.loads(states[-1].read_text())["log_history"]
        written.append(_write_history(dest / f"{name}_log.jsonl", log_history))
    sft = run_dir / "sft" / "trainer_state.json"
    if sft.is_file():  # the format start of a written ranking's recipe
        history = json.loads(sft.read_text())["log_history"]
        written.append(_write_history(dest / f"{name}_sft_log.jsonl", history))
    vfile = run_dir / "epoch-0" / "validation.json"
    if vfile.is_file():
        path = dest / f"{name}_validation.json"
        shutil.copyfile(vfile, path)
        written.append(str(path.relative_to(ROOT)))
    return written


# What a training run commits under its rung (``copy_logs``, the lesson, a tagged run record).
RECORD_FILES = ("_log.jsonl", "_sft_log.jsonl", "_validation.json", "_teacher_rankings.jsonl",
                "_run.json")  # fmt: skip


def committed_records(rung: str, run: str) -> list[str]:
    """The records of ``run`` kept under ``rung`` in the results folder, as committed paths: a
    retrain under that name would replace them."""
    folder = RUNS / rung
    found = [folder / f"{run}{suffix}" for suffix in RECORD_FILES]
    return [str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in found if p.is_file()]


# -- 4. evaluation on test users -----------------------------------------------------------


def rank_with(model: str | Path, rows: list[dict[str, Any]], spec: Any) -> list[list[int]]:
    from memsifter.ranker.parse import parse_ranking
    from memsifter.training.validation import ValidationEngine, generate_completions

    engine = ValidationEngine.for_spec(spec, batch_size=8, device=None)  # device: a GPU if any
    # The head's one position, or a written ranking's whole budget (as validation gives it).
    budget = spec.completion_tokens if spec.ranking_head == "generate" else 1
    texts = generate_completions(model, rows, max_new_tokens=budget, engine=engine)
    return [
        list(parse_ranking(t, int(r["n_candidates"])).ids) for r, t in zip(rows, texts, strict=True)
    ]


def question_facts(size: str) -> dict[str, dict[str, Any]]:
    """World question id -> its record (kind, unseen, s0_prior, user)."""
    from memsifter.data.gym import load_world

    world = load_world(ROOT / world_config(size))
    return {q["id"]: q for q in world.questions}


def sample_per_user(rows: list[dict[str, Any]], per_user: int | None) -> list[dict[str, Any]]:
    """At most ``per_user`` memory questions a test user, drawn by a seeded shuffle of each
    user's questions (their ids only: no ranker's result chooses), kept in file order. Each
    ranker costs a forward pass a question on 2 cores; users, not questions, are the unit the
    CIs resample, so the sample keeps every user."""
    if per_user is None:
        return rows
    import random

    by_user: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_user.setdefault(str(r["conversation"]), []).append(i)
    keep: set[int] = set()
    for user, idx in by_user.items():
        random.Random(f"gym-reading/{user}").shuffle(idx)
        keep.update(idx[:per_user])
    return [r for i, r in enumerate(rows) if i in keep]


def shuffled_positions(seed: int, question: str, haystack: Any, shown: Any) -> list[int]:
    """A seeded random order of the shown candidates ``shown`` (ids, in their shown order):
    ``order[j]`` is the shown position put at j. Each of the user's sessions draws a number
    seeded by the question and the whole haystack, and the candidates go by it, high first (the
    order every committed permuted ranking was made on)."""
    import random

    rng = random.Random(f"{seed}/{question}/{','.join(s.id for s in haystack)}")
    score = {s.id: rng.random() for s in haystack}
    return sorted(range(len(shown)), key=lambda j: -score[shown[j]])


def permuted_rows(
    size: str, rows: list[dict[str, Any]], spec: Any, seed: int
) -> list[dict[str, Any]]:
    """The same test questions with the same candidates (what the coarse filter cut stays cut)
    shown in a seeded random order, with the useful sessions' new positions."""
    from transformers import AutoTokenizer

    from memsifter.coarse import build_filter
    from memsifter.data.gym import load_gym
    from memsifter.models import resolve_model
    from memsifter.training.rldata.build import shown_in_order

    dataset = load_gym(ROOT / world_config(size))
    queries = {f"gym/{q.qid}": q for q in dataset.queries}
    tok = AutoTokenizer.from_pretrained(resolve_model(spec.model).path)
    coarse = build_filter(spec.coarse)
    builder = spec.builder(tok, coarse)
    out = []
    for r in rows:
        q = queries[str(r["qid"])]
        built = builder.build_query(q)
        if built.text != r["prompt"]:
            raise RuntimeError(f"{r['qid']}: the rung's data was built with another prompt")
        order = shuffled_positions(seed, q.question, q.haystack, built.candidate_ids)
        built = shown_in_order(built, q, builder, coarse, order)
        useful = set(q.meta["useful_session_ids"])
        out.append(
            {
                "prompt": built.text,
                "n_candidates": built.num_candidates,
                "useful_positions": [
                    i for i, sid in enumerate(built.candidate_ids) if sid in useful
                ],
                "candidate_ids": list(built.candidate_ids),
            }
        )
    return out


def same_first_session(
    permuted: list[list[int]],
    date_order: list[list[int]],
    prow: list[dict[str, Any]],
    rows: list[dict[str, Any]],
) -> list[bool]:
    """Content, not position: for each question, whether a ranker put the same *session* first
    with the candidates in a random order (``permuted``, positions of ``prow``'s
    ``candidate_ids``) as in date order (``date_order``, positions of ``rows``' candidates). An
    empty ranking agrees with nothing."""
    from memsifter.rewards.columns import sessions_from_column

    return [
        bool(k and o) and p["candidate_ids"][k[0]] == sessions_from_column(r["candidates"])[o[0]].id
        for k, o, p, r in zip(permuted, date_order, prow, rows, strict=True)
    ]


def rankings_of(
    name: str, qids: list[str], cache: Path, kept: Path, make: Any
) -> list[list[int]] | None:
    """A ranker's rankings of the questions ``qids``, and its committed record beside the logs.
    From this machine's cache, else made by ``make`` (the model is here), else the committed
    record's when it ranked exactly these questions (the model is not here: ranked on a lent
    GPU, or its checkpoint is gone); None when there is none of the three. The committed
    rankings never stand in for a model that is here: a retrained run is ranked again."""
    path = cache / f"{name}.json"
    was = kept / f"{name}.json"
    old = json.loads(was.read_text()) if was.is_file() else None
    if path.is_file():
        rankings = json.loads(path.read_text())
    elif make:
        rankings = make()
        path.write_text(json.dumps(rankings) + "\n")
    elif old is not None and old["qids"] == qids:
        return old["rankings"]
    else:
        return None
    record = {"qids": qids, "rankings": rankings, "code_version": code_version()}
    # Rankings read back from the cache keep the version that made them.
    if old is not None and (old["qids"], old["rankings"]) == (qids, rankings):
        record["code_version"] = old["code_version"]
    was.write_text(json.dumps(record) + "\n")
    return rankings


def subset(values: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in values.items()}


def evaluate(
    size: str,
    data: Path,
    out: Path,
    names: list[str],
    per_user: int | None,
    records: dict[str, dict[str, Any]] | None = None,
    against: tuple[str, Path] | None = None,
) -> dict[str, Any]:
    """The rung's test table. ``against``: another rung of the same world (its name and data,
    another layout), whose committed rankings of the same questions pair each ranker with its
    namesake there (``outcome_kl-outcome_kl@small-marker``), clustered by user as the rest."""
    from eval.probes.gym_shortcuts import shortcut_rankings
    from memsifter.data.gym import load_world
    from memsifter.evaluation.bootstrap import paired_bootstrap
    from memsifter.evaluation.gym import means, score_rankings
    from memsifter.ranker.checkpoint import read_spec

    spec = read_spec(data)
    rows = sample_per_user([r for r in load_split(data, "test") if r["useful_positions"]], per_user)
    facts = question_facts(size)
    qfacts = [facts[str(r["qid"]).split("/", 1)[1]] for r in rows]
    users = [q["user"] for q in qfacts]
    cache = out / "eval"
    cache.mkdir(parents=True, exist_ok=True)
    # Every ranker's rankings are committed beside the logs, by question id, so the table and
    # its CIs can be recomputed without the checkpoints (outputs/ is not committed).
    kept = RUNS / out.name / "rankings"
    kept.mkdir(parents=True, exist_ok=True)
    qids = [str(r["qid"]) for r in rows]

    def cached(name: str, make: Any) -> list[list[int]] | None:
        return rankings_of(name, qids, cache, kept, make)

    runs: dict[str, list[list[int]]] = {"bm25": [list(r["coarse_order"]) for r in rows]}
    world = load_world(ROOT / world_config(size))
    shortcuts = shortcut_rankings(world, rows, positions=True)
    runs["start"] = cached("start", lambda: rank_with(MODEL, rows, spec))
    # A trained run is ranked by its model when its folder is here; else by the rankings it
    # made elsewhere (a lent GPU, a checkpoint since deleted), committed for these questions.
    trained: dict[str, Path | None] = {}
    for name in names:
        final = out / "train" / name / "final"
        meta = out / "train" / name / "result.json"
        if meta.is_file():
            final = Path(json.loads(meta.read_text())["model"])
        model = final if final.is_dir() else None
        make = None if model is None else (lambda f=model: rank_with(f, rows, spec))
        ranked = cached(name, make)
        if ranked is not None:
            trained[name], runs[name] = model, ranked
    # A run that began with an SFT (the written ranking's format start; no label) is measured
    # against that start too: the untrained model writes no ranking, so GRPO moved the SFT's.
    for name in list(trained):
        sft = out / "train" / name / "sft" / "final"
        make = (lambda f=sft: rank_with(f, rows, spec)) if sft.is_dir() else None
        ranked = cached(f"{name}_sft", make)
        if ranked is not None:
            trained[f"{name}_sft"] = sft if sft.is_dir() else None
            runs[f"{name}_sft"] = ranked
    runs["oracle"] = [
        list(r["useful_positions"])
        + [i for i in range(int(r["n_candidates"])) if i not in r["useful_positions"]]
        for r in rows
    ]
    # Content, not position: the trained rankers again, on the same questions with their
    # candidates shown in a seeded random order.
    permuted: dict[str, Any] = {}
    permuted_values: dict[str, dict[str, np.ndarray]] = {}
    if trained:
        prow = permuted_rows(size, rows, spec, seed=1)
        kinds = np.array([str(q.get("kind")) for q in qfacts])
        # The start too: what a ranker keeps out of date order is measured against it.
        for name, model in {"start": MODEL, **trained}.items():
            make = None if model is None else (lambda m=model: rank_with(m, prow, spec))
            rk = cached(f"{name}_permuted", make)
            if rk is None:
                continue
            permuted_values[name] = permuted_scores(rk, runs[name], prow, rows)
            hit, same = (
                permuted_values[name]["ndcg@1_useful"],
                permuted_values[name]["same_first_session"],
            )
            firsts = [k[0] for k in rk if k]
            # Where the first choice moves: by question kind, and among the questions the
            # ranker answered right in date order (a content ranker keeps those first).
            right = np.array([bool(k) and k[0] in r["useful_positions"] for k, r in
                              zip(runs[name], rows, strict=True)])  # fmt: skip
            permuted[name] = {
                "ndcg@1_useful": float(np.mean(hit)),
                "same_first_session": float(np.mean(same)),
                "n": len(hit),
                "most_common_first_share": max(np.bincount(firsts)) / len(firsts)
                if firsts
                else None,
                "same_first_session_if_right_in_date_order": {
                    "share": float(np.mean(same[right])) if right.any() else None,
                    "n": int(right.sum()),
                },
                "by_kind": {
                    kind: {
                        "ndcg@1_useful_date_order": float(np.mean(right[kinds == kind])),
                        "ndcg@1_useful": float(np.mean(hit[kinds == kind])),
                        "same_first_session": float(np.mean(same[kinds == kind])),
                        "n": int((kinds == kind).sum()),
                    }
                    for kind in sorted(set(kinds))
                },
            }
    # A fixed habit shows as one label put first on most prompts (LoCoMo's trained rankers
    # answered label 0 first on 283 of 283).
    habit = {}
    for name in ["start", *trained]:
        firsts = [k[0] for k in runs[name] if k]
        habit[name] = max(np.bincount(firsts)) / len(firsts) if firsts else None
    values = {n: score_rankings(rows, rk) for n, rk in runs.items()}
    short_values = {n: score_rankings(rows, rk) for n, rk in shortcuts.items()}
    headline = ("ndcg@1_useful", "answer_acc@1", "answer_acc@3")
    rankers: dict[str, Any] = {
        n: {k: v for k, v in means(values[n]).items() if k in headline} for n in runs
    }
    rankers["shortcuts"] = {
        n: {"ndcg@1_useful": means(v)["ndcg@1_useful"]} for n, v in short_values.items()
    }
    best_shortcut = max(short_values, key=lambda n: means(short_values[n])["ndcg@1_useful"])
    unseen = np.array([bool(q.get("unseen")) for q in qfacts])
    prior = np.array([bool(q.get("s0_prior")) for q in qfacts])
    two = np.array([len(r["useful_positions"]) > 1 for r in rows])

    def ci(a: dict[str, np.ndarray], b: dict[str, np.ndarray], mask: Any = None) -> Any:
        keep = np.ones(len(rows), bool) if mask is None else mask
        cl = [u for u, k in zip(users, keep, strict=True) if k]
        return paired_bootstrap(subset(a, keep), subset(b, keep), clusters=cl)

    pairs: dict[str, Any] = {}
    for name in trained:  # each recipe against the start, the best shortcut and BM25
        pairs[f"{name}-start"] = ci(values[name], values["start"])
        pairs[f"{name}-best_shortcut"] = ci(values[name], short_values[best_shortcut])
        pairs[f"{name}-bm25"] = ci(values[name], values["bm25"])
        if f"{name}_sft" in values:
            pairs[f"{name}-{name}_sft"] = ci(values[name], values[f"{name}_sft"])
    # The outcome reward against the labels and the absolute score: runs trained with the same
    # learning settings and the other reward (``ablations``), so only the reward differs.
    for name, other in ablations(records or {}, list(trained)).items():
        if other.get("labels") in values:
            pairs[f"{name}-{other['labels']}"] = ci(values[name], values[other["labels"]])
        absolute = other.get("outcome_absolute")
        if absolute in values and prior.any():
            pairs[f"{name}-{absolute} (s_0 > 0 share)"] = ci(values[name], values[absolute], prior)
    # Order augmentation against its date-order twin: in date order, and in the random order
    # (there also whether the same session comes first: reading, not position).
    for name, twin in order_twins(records or {}, list(trained)).items():
        pairs[f"{name}-{twin}"] = ci(values[name], values[twin])
        if name in permuted_values and twin in permuted_values:
            pairs[f"{name}-{twin} (random order)"] = ci(
                permuted_values[name], permuted_values[twin]
            )
    if against is not None:
        pairs.update(
            layout_pairs(against, ["start", *trained], rows, values, ci, size, permuted_values)
        )
    split_rows = {}
    for name in runs:
        if name in ("oracle",):
            continue
        split_rows[name] = {
            part: {
                "ndcg@1_useful": float(np.nanmean(values[name]["ndcg@1_useful"][mask]))
                if mask.any()
                else None,
                "answer_acc@3": float(np.mean(values[name]["answer_acc@3"][mask]))
                if mask.any()
                else None,
                "n": int(mask.sum()),
            }
            for part, mask in (
                ("unseen", unseen),
                ("seen", ~unseen),
                ("s0_prior", prior),
                ("two_session", two),
            )
        }
    curves = {n: curve_of(out / "train" / n) for n in dict.fromkeys([*RECIPES, *names])}
    return {
        "split": "test",
        "n_questions": len(rows),
        "n_users": len(set(users)),
        "n_candidates_mean": float(np.mean([int(r["n_candidates"]) for r in rows])),
        "n_unseen": int(unseen.sum()),
        "n_s0_prior": int(prior.sum()),
        "n_two_session": int(two.sum()),
        "rankers": rankers,
        "best_shortcut": best_shortcut,
        "by_subset": split_rows,
        "unseen_phrasing_or_value": {
            n: {"ndcg@1_useful": v["unseen"]["ndcg@1_useful"], "n": v["unseen"]["n"]}
            for n, v in split_rows.items()
        },
        "seen": {
            n: {"ndcg@1_useful": v["seen"]["ndcg@1_useful"], "n": v["seen"]["n"]}
            for n, v in split_rows.items()
        },
        "cluster_ci95": {
            p: {m: d[m]["ci95"] for m in (*headline, "same_first_session") if m in d}
            for p, d in pairs.items()
        },
        "cluster_mean": {
            p: {m: d[m]["mean"] for m in (*headline, "same_first_session") if m in d}
            for p, d in pairs.items()
        },
        "bootstrap": "cluster bootstrap over test users, 10,000 resamples",
        "sample": (
            f"at most {per_user} memory questions a test user (seeded by user id)"
            if per_user
            else "every memory question of the test users"
        ),
        "permuted_order": permuted,
        "most_common_first_share": habit,
        "curves": {n: c for n, c in curves.items() if c},
        "steps_to_learn": steps_to_learn(curves["outcome"]) if curves.get("outcome") else None,
        "steps_to_learn_by_recipe": {n: steps_to_learn(c) for n, c in curves.items() if c},
        "models": {
            n: (str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p))
            if p is not None
            else "not here: its committed rankings"
            for n, p in trained.items()
        },
    }


def permuted_scores(
    permuted: list[list[int]],
    date_order: list[list[int]],
    prow: list[dict[str, Any]],
    rows: list[dict[str, Any]],
) -> dict[str, np.ndarray]:
    """A ranker's random-order scores: whether its first place there is useful, and whether it
    is the session it put first in the rung's own order."""
    hits = [bool(k) and k[0] in r["useful_positions"] for k, r in zip(permuted, prow, strict=True)]
    same = same_first_session(permuted, date_order, prow, rows)
    return {"ndcg@1_useful": np.array(hits, float), "same_first_session": np.array(same, float)}


def layout_pairs(
    against: tuple[str, Path],
    names: list[str],
    rows: list[dict[str, Any]],
    values: dict[str, dict[str, np.ndarray]],
    ci: Any,
    size: str | None = None,
    permuted_values: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Each ranker here against its namesake on another rung of the same world: the same test
    questions (by id, in the same order), each scored on its own rung's candidates and prompt,
    from the rankings that rung committed. A ranker that rung never ranked on these questions
    has no pair. With ``size`` and this rung's ``permuted_values``, each ranker is also paired
    in the random order (a seeded order of the candidate set, so two rungs that show the same
    candidates in another order are shown the same random-order prompt), there also whether
    the same session comes first as in the rung's own order."""
    from memsifter.evaluation.gym import score_rankings
    from memsifter.ranker.checkpoint import read_spec

    other, data = against
    qids = [str(r["qid"]) for r in rows]
    theirs = {str(r["qid"]): r for r in load_split(data, "test")}
    missing = [q for q in qids if q not in theirs]
    if missing:
        raise typer.BadParameter(
            f"rung {other}'s test split lacks {len(missing)} of these {len(qids)} questions "
            f"(first {missing[0]}): not the same world",
            param_hint="--against-layout / --against-order",
        )
    their_rows = [theirs[q] for q in qids]
    cache, kept = ROOT / "outputs/gym_reading" / other / "eval", RUNS / other / "rankings"
    their_prow = None
    pairs: dict[str, Any] = {}
    for name in names:
        ranked = rankings_of(name, qids, cache, kept, None)
        if ranked is None:
            print(f"no pair for {name}: rung {other} has no rankings of these questions")
            continue
        pairs[f"{name}-{name}@{other}"] = ci(values[name], score_rankings(their_rows, ranked))
        shuffled = rankings_of(f"{name}_permuted", qids, cache, kept, None)
        if size is None or name not in (permuted_values or {}) or shuffled is None:
            continue
        if their_prow is None:
            their_prow = permuted_rows(size, their_rows, read_spec(data), seed=1)
        pairs[f"{name}-{name}@{other} (random order)"] = ci(
            permuted_values[name],  # type: ignore[index]
            permuted_scores(shuffled, ranked, their_prow, their_rows),
        )
    return pairs


# What one evaluation wrote into a rung (the rest of a rung is its world, probes and runs).
EVAL_KEYS = (
    "split", "n_questions", "n_users", "n_candidates_mean", "n_unseen", "n_s0_prior",
    "n_two_session", "rankers", "best_shortcut", "by_subset", "unseen_phrasing_or_value", "seen",
    "cluster_ci95", "cluster_mean", "bootstrap", "sample", "permuted_order",
    "most_common_first_share", "models", "model", "code_version", "command", "machine",
)  # fmt: skip


def fold_earlier(before: dict[str, Any], rung: dict[str, Any]) -> None:
    """Keep what an earlier evaluation of the rung measured for recipes this one did not rank
    (their checkpoints may be gone): on the same sample of questions, their rows join this
    table (named in ``carried`` with the code version that ranked them; their pairs keep that
    run's start, which is the same model on the same questions); on another sample, the earlier
    evaluation is kept whole, as its own table under ``earlier``."""
    # Training curves do not depend on the test sample: a run not retrained keeps its curve.
    for name, curve in before.get("curves", {}).items():
        rung.setdefault("curves", {}).setdefault(name, curve)
    learned = {n: steps_to_learn(c) for n, c in rung.get("curves", {}).items()}
    rung["steps_to_learn_by_recipe"] = learned
    rung["steps_to_learn"] = learned.get("outcome")
    if not before.get("rankers"):
        return
    rung["earlier"] = list(before.get("earlier", []))
    rung["carried"] = dict(before.get("carried", {}))
    same = before.get("sample") == rung["sample"] and before["n_questions"] == rung["n_questions"]
    gone = [n for n in before["rankers"] if n not in rung["rankers"] and n != "shortcuts"]
    if not same:
        rung["earlier"].append({k: before[k] for k in EVAL_KEYS if k in before})
        rung["carried"] = {}
        return
    for name in gone:
        rung["rankers"][name] = before["rankers"][name]
        rung["carried"].setdefault(name, before["code_version"])
        for key in ("by_subset", "unseen_phrasing_or_value", "seen", "permuted_order"):
            if name in before.get(key, {}):
                rung.setdefault(key, {})[name] = before[key][name]
        if name in before.get("most_common_first_share", {}):
            rung["most_common_first_share"][name] = before["most_common_first_share"][name]
        for key in ("cluster_ci95", "cluster_mean"):
            for pair, v in before.get(key, {}).items():
                if pair.startswith(f"{name}-") and pair not in rung[key]:
                    rung[key][pair] = v


# -- the report --------------------------------------------------------------------------------


def _f(x: Any) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    return f"{x:.3f}"


# Rungs measured before the layout existed: the paper layout, and a letters prompt that still
# showed an example answer (its first id became the untrained head's prior; docs/gym.md).
_OLD_PROMPT = "paper, with the format line's example answer (before a8c7cfe)"


_TARGETS = {
    "useful": "useful session's label",
    "last": "newest candidate's label, a positive control that needs no reading",
}


def _title(rung: dict[str, Any]) -> str:
    if rung["world_config"] == world_config(rung["size"]):
        return f"Rung `{rung['size']}`"
    return "A simpler world (probes only)"


def _key(rung: dict[str, Any]) -> tuple[str, str, str, str, str, str]:
    read, order = rung.get("head_read", "label"), rung.get("order", "chronological")
    head = rung.get("ranking_head", "first_token")
    return rung["size"], rung.get("layout", _OLD_PROMPT), rung["world_config"], read, order, head


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The reading gym: does a pretrained proxy learn to read?",
        "",
        "Generated from `eval/results/gym_reading/gym_reading.json` by "
        "`python -m eval.probes.gym_reading` (never typed by "
        "hand). One rung per world size and prompt layout; every number is on **test users** "
        "(they choose nothing), NDCG@1 against the useful session(s); CIs are cluster bootstraps "
        "over users; probes are on validation users.",
        "",
    ]
    for rung in results["rungs"]:
        lines += [
            f"## {_title(rung)}, layout {_key(rung)[1]}, "
            + (
                "a written ranking (the paper's form, TRL GRPO)"
                if _key(rung)[5] == "generate"
                else f"head read {_key(rung)[3]}"
            )
            + ("" if _key(rung)[4] == "chronological" else f", candidates {_key(rung)[4]}")
            + f" (`{rung['world_config']}`, "
            f"level `{rung['level']}`)",
            "",
            f"`{rung['command']}` at code version `{rung['code_version']}`; {rung['machine']}.",
        ]
        if rung.get("split"):
            lines += _rung_table(rung)
        for name, version in sorted(rung.get("carried", {}).items()):
            lines += ["", f"Row `{name}` carried from the evaluation at `{version}` (same sample)."]
        for old in rung.get("earlier", []):
            lines += [
                "",
                f"### Earlier evaluation: `{old['command']}` at `{old['code_version']}` "
                f"({old['sample']})",
            ]
            lines += _rung_table({k: v for k, v in old.items() if k != "curves"})
        for name, p in sorted(rung.get("probes", {}).items()):
            text = ", ".join(f"{s}: {v:.3f}" for s, v in p["curve"])
            warm = ""
            if p.get("warm_marker_steps"):
                marker = ", ".join(f"{s}: {v:.3f}" for s, v in p["marker_curve"])
                warm = (
                    f"; steps 1-{p['warm_marker_steps']} trained the marker read alone, the "
                    "later ones the label read"
                    + (
                        " on the marker read's own first choice (not the label)"
                        if p.get("copy_from") == "marker"
                        else ""
                    )
                    + " with the marker read's loss beside it; the "
                    f"marker read's validation NDCG@1 at the same steps: {marker}"
                )
            lines += [
                "",
                f"Supervised pointing probe `{name}` (a probe, not a recipe: it trains on the "
                f"{_TARGETS[p.get('target', 'useful')]}; scores read "
                f"{'at each closing marker' if 'marker' in str(p.get('read')) else 'at the label'}"
                f"): LoRA top {p['lora_top_layers']} "
                f"layers, lr {p['lr']}, batch {p['batch']}, autocast "
                f"{p.get('autocast', 'none')}; validation NDCG@1 against that target, one "
                f"question a user, n = {p['n_questions']}: {text} ({p['seconds']} s; loss by "
                f"step in `{p.get('log', '-')}`){warm}"
                + (
                    f"; the coarse filter's first session on the same questions: "
                    f"{p['coarse_ndcg@1']:.3f}"
                    if "coarse_ndcg@1" in p
                    else ""
                )
                + ".",
            ]
            if p.get("command") and p["command"] != rung["command"]:
                lines += [
                    "",
                    f"`{p['command']}` at code version `{p['code_version']}`; {p['machine']}.",
                ]
        if rung.get("notes"):
            lines += [""] + [f"- {n}" for n in rung["notes"]]
        lines.append("")
    return "\n".join(lines)


def _rung_table(rung: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Model {rung['model']}; split {rung['split']}, n = {rung['n_questions']} memory "
        f"questions from {rung['n_users']} users, {rung['n_candidates_mean']:.1f} candidates "
        f"a prompt on average ({rung['n_two_session']} two-session, {rung['n_unseen']} with "
        f"an unseen phrasing or value, {rung['n_s0_prior']} with s_0 > 0).",
        "",
        "| ranker | NDCG@1 useful | answer acc@1 | answer acc@3 |",
        "|---|---|---|---|",
    ]
    for name, m in rung["rankers"].items():
        if name == "shortcuts":
            continue
        lines.append(
            f"| {name} | {_f(m.get('ndcg@1_useful'))} | {_f(m.get('answer_acc@1'))} | "
            f"{_f(m.get('answer_acc@3'))} |"
        )
    shortcuts = rung["rankers"].get("shortcuts", {})
    for name, m in shortcuts.items():
        if not name.startswith("position "):
            lines.append(f"| shortcut: {name} | {_f(m['ndcg@1_useful'])} | - | - |")
    positions = {n: m for n, m in shortcuts.items() if n.startswith("position ")}
    if positions:
        best = max(positions, key=lambda n: positions[n]["ndcg@1_useful"])
        lines.append(
            f"| shortcut: best single position ({best}; every one in the JSON) | "
            f"{_f(positions[best]['ndcg@1_useful'])} | - | - |"
        )
    if rung.get("cluster_ci95"):
        lines += ["", "| pair (A − B) | metric | mean | 95% CI (users) |", "|---|---|---|---|"]
        for pair, cis in rung["cluster_ci95"].items():
            for metric, (lo, hi) in cis.items():
                mean = rung["cluster_mean"][pair][metric]
                lines.append(f"| {pair} | {metric} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] |")
    if rung.get("by_subset"):
        lines += [
            "",
            "| ranker | unseen NDCG@1 (n) | seen NDCG@1 (n) | s_0 > 0 acc@3 (n) | "
            "two-session acc@3 (n) |",
            "|---|---|---|---|---|",
        ]
        for name, parts in rung["by_subset"].items():
            cells = [
                f"{_f(parts['unseen']['ndcg@1_useful'])} ({parts['unseen']['n']})",
                f"{_f(parts['seen']['ndcg@1_useful'])} ({parts['seen']['n']})",
                f"{_f(parts['s0_prior']['answer_acc@3'])} ({parts['s0_prior']['n']})",
                f"{_f(parts['two_session']['answer_acc@3'])} ({parts['two_session']['n']})",
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if rung.get("most_common_first_share"):
        shares = ", ".join(f"`{n}` {_f(v)}" for n, v in rung["most_common_first_share"].items())
        lines += [
            "",
            f"Share of prompts whose first label is the ranker's most common: {shares}.",
        ]
    if rung.get("permuted_order"):
        lines += [
            "",
            "Candidates in a seeded random order instead of by date (same questions):",
            "",
        ]
        for name, v in rung["permuted_order"].items():
            lines.append(
                f"- `{name}`: NDCG@1 {_f(v['ndcg@1_useful'])} (n = {v['n']}); the most "
                f"common first label takes {_f(v['most_common_first_share'])} of the prompts"
                + (
                    f"; the same session first as in date order on {_f(v['same_first_session'])}"
                    if "same_first_session" in v
                    else ""
                )
            )
            kept = v.get("same_first_session_if_right_in_date_order")
            if kept:
                lines.append(
                    f"  - of the {kept['n']} it answered right in date order, the same session "
                    f"first on {_f(kept['share'])}; by kind (NDCG@1 date → random order, the "
                    "same session first): "
                    + "; ".join(
                        f"{kind} {_f(k['ndcg@1_useful_date_order'])} → "
                        f"{_f(k['ndcg@1_useful'])}, {_f(k['same_first_session'])} "
                        f"(n = {k['n']})"
                        for kind, k in v["by_kind"].items()
                    )
                )
    if rung.get("curves"):
        lines += ["", "Validation NDCG@1 (useful) by step (validation users, n as logged):", ""]
        for name, pts in rung["curves"].items():
            text = ", ".join(f"{s}: {v:.3f}" for s, v in pts)
            lines.append(
                f"- `{name}`: {text}; steps to reach {LEARNED}: "
                f"{rung['steps_to_learn_by_recipe'].get(name) or 'not reached'}"
            )
    return lines


def committed(rung: dict[str, Any]) -> dict[str, Any] | None:
    """The committed results' entry for ``rung``'s key (size, layout, world, read), if any."""
    path = RESULTS / "gym_reading.json"
    if not path.is_file():
        return None
    return next((r for r in json.loads(path.read_text())["rungs"] if _key(r) == _key(rung)), None)


def merge(rung: dict[str, Any]) -> dict[str, Any]:
    path = RESULTS / "gym_reading.json"
    results = json.loads(path.read_text()) if path.is_file() else {"rungs": []}
    rungs = [r for r in results["rungs"] if _key(r) != _key(rung)] + [rung]
    results["rungs"] = sorted(rungs, key=lambda r: (SIZES.index(r["size"]), _key(r)))
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    # Rendered from the file as written (keys sorted), so a rung's table reads the same whether
    # it was just run or merged later.
    results = json.loads(path.read_text())
    (RESULTS / "gym_reading.md").write_text(render(results))
    return results


def main(
    size: Annotated[str, typer.Option(help=f"the rung: {' | '.join(SIZES)}")] = "small",
    stage: Annotated[
        list[str] | None,
        typer.Option(help=f"{' | '.join(STAGES)} (repeatable; default: all, in order)"),
    ] = None,
    recipe: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RECIPE[+VARIANT]",
            help=f"one of {', '.join(RECIPES)} (default: all); RECIPE+VARIANT trains the recipe "
            "under its own name, with this command's --set overrides",
        ),
    ] = None,
    max_steps: Annotated[int | None, typer.Option(help="override the recipes' budget")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="another override of the recipes (e.g. grpo.learning_rate=1e-3), recorded in "
            "the rung",
        ),
    ] = None,
    per_user: Annotated[int, typer.Option(help="test questions a user scored (0: every one)")] = 2,
    note: Annotated[
        list[str] | None, typer.Option(help="a line for the rung's notes (repeatable)")
    ] = None,
    probe_steps: Annotated[int, typer.Option(help="the probe's steps")] = 120,
    probe_lr: Annotated[float, typer.Option(help="the probe's learning rate")] = 3e-4,
    probe_layers: Annotated[int, typer.Option(help="LoRA on the top N layers")] = 6,
    probe_batch: Annotated[int, typer.Option(help="prompts a probe step")] = 8,
    probe_autocast: Annotated[str, typer.Option(help="none | bf16")] = "bf16",
    probe_pool: Annotated[
        int, typer.Option(help="cache this many train prompts' frozen layers")
    ] = 0,
    probe_target: Annotated[
        str,
        typer.Option(
            help="useful, or last: the newest candidate, a positive control that needs no reading"
        ),
    ] = "useful",
    probe_warm_marker: Annotated[
        int,
        typer.Option(
            help="label read: train the marker read alone for this many steps first, then the "
            "label read with the marker read's loss beside it (needs --probe-pool)"
        ),
    ] = 0,
    probe_copy_from: Annotated[
        str,
        typer.Option(
            help="useful | marker: after --probe-warm-marker, train the label read on the useful "
            "label, or on the marker read's own first choice (the model teaching its written "
            "first id from its own closers)"
        ),
    ] = "useful",
    probe_read: Annotated[
        str | None,
        typer.Option(
            help="label | marker: read the probe's scores another way than the data's head_read "
            "(marker: at each candidate's closing marker; needs layout marked)"
        ),
    ] = None,
    head_read: Annotated[
        str,
        typer.Option(
            help="label | marker: the head's read (marker: each candidate scored at its own "
            "closing marker; implies layout marked); marker is its own rung"
        ),
    ] = "label",
    world: Annotated[
        str | None, typer.Option(help="another gym world config, for a probe on a simpler world")
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            help=f"{' | '.join(LAYOUTS)}: the prompt layout (default: {DATA_RECIPE}'s, or "
            "marked with --head-read marker); another one is its own rung"
        ),
    ] = None,
    against_layout: Annotated[
        str | None,
        typer.Option(
            help="eval: pair each ranker with its namesake on this layout's rung (same size "
            "and read; its data is built here, its rankings are its committed ones)"
        ),
    ] = None,
    order: Annotated[
        str,
        typer.Option(
            help=f"{' | '.join(ORDERS)}: the candidates' order in every split's prompts "
            "(PromptSpec.order); newest_first is its own rung"
        ),
    ] = "chronological",
    against_order: Annotated[
        str | None,
        typer.Option(
            help="eval: pair each ranker with its namesake on the rung of this order (with "
            "--against-layout, of that layout too)"
        ),
    ] = None,
    ranking_head: Annotated[
        str,
        typer.Option(
            help=f"{' | '.join(RANKING_HEADS)}: the first-token head, or the paper's form (the "
            f"proxy writes its ranking; {GENERATE_DATA_RECIPE}, recipes "
            f"{', '.join(GENERATE_RECIPES)}); generate is its own rung"
        ),
    ] = "first_token",
    train_shuffle: Annotated[
        float,
        typer.Option(
            help="train: this share of the train prompts show their candidates in a seeded "
            "random order (order augmentation; a RECIPE+VARIANT run). Validation and test keep "
            "the date order"
        ),
    ] = 0.0,
    teacher: Annotated[
        str | None,
        typer.Option(
            help="train, --ranking-head generate: RUNG/RUN, a first-token head trained on a rung "
            "of this world; its rankings of the train pool, carried by session id, are the "
            "format start's targets (sft.target rankings) instead of BM25's order (a "
            "RECIPE+VARIANT run)"
        ),
    ] = None,
    teacher_start: Annotated[
        bool,
        typer.Option(
            help="with --teacher: start from the teacher's weights too (its closers, which "
            "learned what answers; finding 30), not SmolLM2's; the rung's layout must be the "
            "teacher's"
        ),
    ] = False,
    teacher_reads: Annotated[
        str,
        typer.Option(
            help="with --teacher: own (the teacher ranks its own rung's prompts, carried by "
            "session id) or pen (the teacher's marker read at the closers of this rung's own "
            "prompts, under its labels: what the pen's closers say at a --teacher-start)"
        ),
    ] = "own",
    records_as: Annotated[
        str | None,
        typer.Option(
            help="train: a retrain of a run with committed records (its logs, validation, "
            "lesson) writes its own beside them as RECIPE_TAG_* and a RECIPE_TAG_run.json, and "
            "leaves the results table's entry for the run as committed; without it such a "
            "retrain is refused"
        ),
    ] = None,
    until_sft: Annotated[
        bool,
        typer.Option(
            help="train: stop each run after its format SFT (the start that gym_copy_probe "
            "reads), with no GRPO step and no validation"
        ),
    ] = False,
) -> None:
    """The reading gym: one rung of the ladder (data, probe, train, eval)."""
    for value, allowed, opt in (
        (size, SIZES, "--size"),
        (probe_autocast, ("none", "bf16"), "--probe-autocast"),
        (probe_target, ("useful", "last"), "--probe-target"),
        (probe_copy_from, ("useful", "marker"), "--probe-copy-from"),
        (probe_read, ("label", "marker", None), "--probe-read"),
        (head_read, ("label", "marker"), "--head-read"),
        (layout, (*LAYOUTS, None), "--layout"),
        (against_layout, (*LAYOUTS, None), "--against-layout"),
        (order, ORDERS, "--order"),
        (against_order, (*ORDERS, None), "--against-order"),
        (ranking_head, RANKING_HEADS, "--ranking-head"),
        *((s, STAGES, "--stage") for s in stage or ()),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"{value!r}: choose from {list(allowed)}", param_hint=opt)
    recipe = [run_name(r) for r in recipe or ()]
    stages = stage or list(STAGES)
    if train_shuffle:
        if not 0.0 < train_shuffle <= 1.0:
            raise typer.BadParameter(
                f"{train_shuffle}: a share in (0, 1]", param_hint="--train-shuffle"
            )
        plain = [r for r in recipe if r == recipe_of(r)]
        if "train" not in stages or not recipe or plain:
            raise typer.BadParameter(
                "the shuffled-order data trains its own runs: --stage train with "
                f"RECIPE+VARIANT names (got {plain or recipe or 'every recipe'}), so a recipe's "
                "date-order run keeps its name",
                param_hint="--train-shuffle",
            )
    generate = ranking_head == "generate"
    wrong = [r for r in recipe if (recipe_of(r) in GENERATE_RECIPES) != generate]
    if wrong:
        raise typer.BadParameter(
            f"{', '.join(wrong)}: "
            + (
                "a first-token head's recipe on the written ranking's rung"
                if generate
                else "trains a written ranking: it needs --ranking-head generate"
            ),
            param_hint="--recipe",
        )
    if generate and (head_read != "label" or "probe" in stages or train_shuffle):
        raise typer.BadParameter(
            "the written ranking has no head to read a marker with, to probe or to train on "
            "shuffled orders: --head-read, --stage probe and --train-shuffle are the head's",
            param_hint="--ranking-head",
        )
    if until_sft and "train" not in stages:
        raise typer.BadParameter(
            "stops a training run: give --stage train", param_hint="--until-sft"
        )
    if teacher_reads not in TEACHER_READS:
        raise typer.BadParameter(
            f"{teacher_reads!r}: one of {', '.join(TEACHER_READS)}", param_hint="--teacher-reads"
        )
    if teacher_reads != "own" and teacher is None:
        raise typer.BadParameter(
            "says how a teacher ranks the lesson: give --teacher", param_hint="--teacher-reads"
        )
    if teacher_start and teacher is None:
        raise typer.BadParameter(
            "starts from a teacher's weights: give --teacher", param_hint="--teacher-start"
        )
    if teacher is not None:
        plain = [r for r in recipe if r == recipe_of(r)]
        if not generate or "train" not in stages or not recipe or plain:
            raise typer.BadParameter(
                "a teacher's rankings start a written ranking's runs: --ranking-head generate, "
                f"--stage train, RECIPE+VARIANT names (got {plain or recipe or 'every recipe'}), "
                "so the recipe's own run keeps its name",
                param_hint="--teacher",
            )
    names = recipe or [r for r in RECIPES if (r in GENERATE_RECIPES) == generate]

    from memsifter.data.gym import load_world
    from memsifter.machine import machine_facts, machine_line

    layout = layout or ("marked" if head_read == "marker" else recipe_layout())
    if head_read == "marker" and layout not in MARKED_LAYOUTS:
        raise typer.BadParameter(
            "--head-read marker reads each session's closing marker: it needs layout marked or "
            "restated",
            param_hint="--layout",
        )
    if against_order is not None and (against_order == order or world):
        raise typer.BadParameter(
            f"{against_order!r} is this rung's own order"
            if not world
            else "the pairs are on the rung's own world, not --world",
            param_hint="--against-order",
        )
    if against_layout is not None:
        if against_layout == layout or world:
            raise typer.BadParameter(
                f"{against_layout!r} is this rung's own layout"
                if not world
                else "the pairs are on the rung's own world, not --world",
                param_hint="--against-layout",
            )
        if head_read == "marker" and against_layout not in MARKED_LAYOUTS:
            raise typer.BadParameter(
                f"{against_layout!r} has no closing markers for --head-read marker: choose "
                f"from {list(MARKED_LAYOUTS)}",
                param_hint="--against-layout",
            )
    name = rung_name(size, layout, head_read, order, ranking_head)
    world_path = world_config(size)
    if world:  # a simpler world for a probe: its own rung, named after its file
        if set(stages) - {"data", "probe"}:
            raise typer.BadParameter(
                "--world is for the data and probe stages (the eval reads the read level)",
                param_hint="--world",
            )
        world_path = world
        name = f"{Path(world).stem}-{layout}"
        name += "-marker" if head_read == "marker" else ""
        name += f"-{ORDER_SUFFIX[order]}" if order != "chronological" else ""
    if records_as is not None and (
        "train" not in stages
        or "eval" in stages
        or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", records_as)
    ):
        raise typer.BadParameter(
            f"{records_as!r}: a tag (letters, digits, '_', '.', '-') for a training run's "
            "records, with --stage train and without --stage eval (an eval row is the "
            "committed run's)",
            param_hint="--records-as",
        )
    if "train" in stages:
        # Committed records describe the run that made them: a retrain writes its own beside
        # them, never over them.
        tagged = [f"{r}_{records_as}" if records_as else r for r in names]
        if taken := [f for r in tagged for f in committed_records(name, r)]:
            raise typer.BadParameter(
                f"{', '.join(taken)}: committed records of this run, which a retrain would "
                "replace; --records-as TAG (a new tag) writes its own beside them",
                param_hint="--records-as",
            )
    # A teacher is checked before anything is built.
    taught = teacher_of(teacher, world_path) if teacher else None
    if taught is not None and teacher_reads == "pen":
        from memsifter.ranker.checkpoint import read_spec

        if read_spec(taught[1]).head_read != "marker" or layout not in MARKED_LAYOUTS:
            raise typer.BadParameter(
                f"reads the teacher's closers on this rung's prompts: a marker-read teacher "
                f"(this one reads {read_spec(taught[1]).head_read!r}) and a layout with closers "
                f"(this rung's is {layout!r})",
                param_hint="--teacher-reads",
            )
    if taught is not None and teacher_start:
        from memsifter.ranker.checkpoint import read_spec

        theirs = read_spec(taught[1]).layout
        if theirs != layout:
            raise typer.BadParameter(
                f"the teacher's closers are in layout {theirs!r}, this rung's is {layout!r}: "
                f"--layout {theirs}",
                param_hint="--teacher-start",
            )
    out = ROOT / "outputs/gym_reading" / name
    out.mkdir(parents=True, exist_ok=True)
    data = build_data(world_path, out, layout, head_read, order=order, head=ranking_head)
    rung_file = out / "rung.json"
    world = load_world(ROOT / world_path)
    rung: dict[str, Any] = {
        "size": size,
        "layout": layout,
        "head_read": head_read,
        **({"order": order} if order != "chronological" else {}),
        **({"ranking_head": ranking_head} if generate else {}),
        "level": world.config.level,
        "world_config": world_path,
        "model": MODEL,
    }
    # A fresh checkout has no outputs/: the rung then grows from its committed entry, so a
    # probe added later never drops the table that an earlier eval wrote.
    rung = json.loads(rung_file.read_text()) if rung_file.is_file() else committed(rung) or rung
    this_run = {
        "code_version": code_version(),
        "command": "python -m eval.probes.gym_reading " + " ".join(without_notes(sys.argv[1:])),
        "machine": machine_line(machine_facts(), run=True),
    }
    # The rung's own provenance is its table's (the eval's); a training run and a probe keep
    # their own, so an eval's rows keep the code version that ranked them.
    before = dict(rung)
    if "eval" in stages or "command" not in rung:
        rung.update(this_run)
    if note is not None:
        rung["notes"] = list(note)
    if "probe" in stages:
        key = f"top{probe_layers}-lr{probe_lr:g}-steps{probe_steps}"
        key += f"-pool{probe_pool}" if probe_pool else ""
        key += "" if probe_target == "useful" else f"-target_{probe_target}"
        key += f"-read_{probe_read}" if probe_read else ""
        key += f"-warm_marker{probe_warm_marker}" if probe_warm_marker else ""
        key += "" if probe_copy_from == "useful" else f"-copy_{probe_copy_from}"
        key += "" if probe_autocast == "bf16" else f"-autocast_{probe_autocast}"
        log_file = RUNS / name / f"probe_{key}_log.txt"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("w", encoding="utf-8") as fh:

            def log(line: str) -> None:
                print(line, flush=True)
                fh.write(line + "\n")
                fh.flush()

            result = probe(
                data,
                out,
                probe_steps,
                probe_lr,
                probe_layers,
                probe_batch,
                probe_autocast,
                log=log,
                pool=probe_pool,
                target=probe_target,
                read=probe_read,
                warm_marker=probe_warm_marker,
                copy_from=probe_copy_from,
            )
        result["log"] = str(log_file.relative_to(ROOT))
        result.update(this_run)
        rung.setdefault("probes", {})[key] = result
        rung_file.write_text(json.dumps(rung, indent=1) + "\n")
    if "train" in stages:
        runs = rung.setdefault("runs", {})
        train_data = (
            build_data(world_path, out, layout, head_read, train_shuffle, order)
            if train_shuffle
            else data
        )
        start = None
        if taught is not None and teacher_start:
            from memsifter.ranker.checkpoint import as_base

            start = as_base(taught[0], out / "teacher" / "base")
        for recipe in names:
            sets, lesson = list(overrides or []), None
            kept_as = f"{recipe}_{records_as}" if records_as else recipe
            if taught is not None:
                path = out / "teacher" / f"{recipe}.jsonl"
                path.parent.mkdir(exist_ok=True)
                lesson = {
                    "run": teacher,
                    "start": "its weights" if start is not None else MODEL,
                    **teacher_rankings(*taught, train_data, path, teacher_reads),
                }
                sets += ["sft.target=rankings", f"sft.rankings={path}"]
                sets += [f"model.name={start}"] if start is not None else []
                kept = RUNS / name / f"{kept_as}_teacher_rankings.jsonl"
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, kept)
                lesson["rankings"] = str(kept.relative_to(ROOT))
            runs[recipe] = {
                **train(
                    recipe,
                    train_data,
                    out,
                    max_steps,
                    sets=sets,
                    until="sft" if until_sft else None,
                ),
                **({"train_shuffle_share": train_shuffle} if train_shuffle else {}),
                **({"teacher": lesson} if lesson else {}),
                **this_run,
            }
            (out / "train" / recipe / "result.json").write_text(json.dumps(runs[recipe]) + "\n")
            runs[recipe]["logs"] = copy_logs(kept_as, out / "train" / recipe, name)
            if records_as:
                record = RUNS / name / f"{kept_as}_run.json"
                record.write_text(json.dumps(runs[recipe], indent=1) + "\n")
            with rung_lock(out):
                fresh = json.loads(rung_file.read_text()) if rung_file.is_file() else rung
                fresh.setdefault("runs", {})[recipe] = runs[recipe]
                rung_file.write_text(json.dumps(fresh, indent=1) + "\n")
    if "eval" in stages:
        against = None
        if against_layout is not None or against_order is not None:
            their_layout, their_order = against_layout or layout, against_order or order
            other = rung_name(size, their_layout, head_read, their_order, ranking_head)
            their_data = build_data(
                world_path,
                out.parent / other,
                their_layout,
                head_read,
                order=their_order,
                head=ranking_head,
            )
            against = (other, their_data)
        rung.update(
            evaluate(size, data, out, names, per_user or None, rung.get("runs", {}), against)
        )
        fold_earlier(before, rung)
        rung_file.write_text(json.dumps(rung, indent=1) + "\n")
    with rung_lock(out):
        if rung_file.is_file():  # with the records of runs trained beside this one
            rung = json.loads(rung_file.read_text())
        if records_as:  # the table keeps the committed runs; the tagged ones have run.json
            kept_runs = (committed(rung) or {}).get("runs", {})
            for r in names:
                rung.setdefault("runs", {}).pop(r, None)
                if r in kept_runs:
                    rung["runs"][r] = kept_runs[r]
        if rung.get("split") or rung.get("probes"):
            print(render(merge(rung)))


if __name__ == "__main__":
    typer.run(main)
