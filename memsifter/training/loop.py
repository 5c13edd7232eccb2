"""The training run: optional cold-start SFT, then the paper's epoch loop.

Each epoch trains GRPO from the current start model and saves a checkpoint every
``epochs.save_steps`` (and at its last step); every checkpoint is validated on the held-out
split; the ``epochs.top_k`` best by ``epochs.select_metric`` are averaged in fp32 (LoRA merged
first; a checkpoint that validated below the epoch's start is left out,
:func:`checkpoints_to_average`) and the next epoch starts from that average, unless the average
scores below the epoch's
start model on validation (``epochs.keep_start_if_better``): then the start is kept. Before each
later epoch the curriculum re-scores the whole train pool with the new start model and selects
that epoch's prompts (``epochs.rescore_curriculum``). The last kept model is the run's model.

Resume: every phase writes its result before the next starts, and ``run_state.json`` records
what is done. A rerun of the same command skips finished phases, resumes GRPO from the epoch's
last full checkpoint (TRL/HF restore optimiser, scheduler, RNG and the position in the seeded
data order), and reuses saved validation results. The training data (after the curriculum's
selection, made by ``memsifter data rl``) is read from its parquet files, so the curriculum
state is the data folder itself.

Layout of ``output_dir``::

    run_state.json  config.yaml  config.effective.yaml  summary.json  curves.png
    sft/final/                      cold-start model (when enabled)
    epoch-0/checkpoint-N/           GRPO checkpoints
    epoch-0/validation.json         one result per checkpoint (and the start model)
    epoch-0/rankings/*.jsonl        validation rankings per checkpoint
    epoch-0/averaged/               the average of the top-k: the next epoch's start (or not)
    epoch-1/curriculum/             rankings of the train pool by epoch 1's start, the selection
                                    (train.parquet) and its curriculum report
    epoch-0/trainer_state.json      log history (reward components, dynamic sampling, loss)

Every model folder it writes (``sft/final``, each checkpoint, each average) carries the RL data's
``prompt_spec.json``, so validation, eval and serving render the prompt it was trained on.

Several processes (``accelerate launch``): SFT and GRPO run on every process; validation,
averaging, the curriculum's re-score and every state, report and config write run on the main
process only, and the others take its decisions (which checkpoints were averaged, which model
starts the next epoch) from a broadcast, then read the files it wrote (see
:mod:`memsifter.training.distributed`). So every process starts each epoch from the same folder
and the same selected prompts, and every file is written once.
"""

from __future__ import annotations

import gc
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from memsifter.errors import DataError
from memsifter.machine import cpu_bf16_units, emulated_bf16_text
from memsifter.training.config import TrainConfig, check_hardware, has_cuda
from memsifter.training.run_report import plot_curves, write_report

if TYPE_CHECKING:
    from memsifter.training.validation import ValidationEngine

Log = Callable[[str], None]


def _checkpoints(folder: Path) -> list[Path]:
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[11:]))


class RunState:
    """``run_state.json``: every process keeps the same copy in memory (``mark`` is called with
    the same values everywhere), only the writer (the main process) writes the file."""

    def __init__(self, path: Path, *, writer: bool = True) -> None:
        self.path = path
        self.writer = writer
        self.data: dict[str, Any] = (
            json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        )

    def done(self, key: str) -> Any:
        return self.data.get(key)

    def mark(self, key: str, value: Any = True) -> None:
        self.data[key] = value
        if not self.writer:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2), encoding="utf-8")
        tmp.replace(self.path)  # atomic: a crash never leaves a half-written state


def load_rl_data(folder: str | Path) -> tuple[Any, Any]:
    from memsifter.training.rldata.build import load_rl_dataset

    if not Path(folder).is_dir():
        raise DataError(
            "RL data folder not found; build it with `memsifter data rl --recipe "
            "configs/data/<recipe>.yaml --out <folder>`",
            file=str(folder),
        )
    data = load_rl_dataset(folder)
    return data["train"], data["validation"]


def total_steps(cfg: TrainConfig, n_train: int) -> int:
    """Optimiser steps over all epochs (sizes the warm-up's decay). With ``max_steps: -1`` an
    epoch is one pass: every prompt once, ``num_generations`` completions each, every generation
    batch trained on ``num_iterations`` times (as TRL's sampler repeats it), per device (a
    multi-process run divides this further; the decay then ends early, never late)."""
    import math

    if cfg.epochs.max_steps > 0:
        return cfg.epochs.epochs * cfg.epochs.max_steps
    g = cfg.grpo
    per_step = g.per_device_train_batch_size * g.gradient_accumulation_steps
    completions = n_train * g.num_generations * g.num_iterations
    return cfg.epochs.epochs * max(1, math.ceil(completions / per_step))


def rank_checkpoints(results: dict[str, Any], metric: str) -> list[str]:
    """An epoch's checkpoint names in ``results`` (its ``validation.json``), best first by
    ``metric``; a tie goes to the later step."""
    return sorted(
        (n for n in results if n.startswith("checkpoint-")),
        key=lambda n: (-results[n][metric], -int(n.split("-")[1])),
    )


def checkpoints_to_average(results: dict[str, Any], metric: str, top_k: int) -> list[str]:
    """The top ``top_k`` checkpoints by ``metric`` (:func:`rank_checkpoints`), leaving out any
    that validated strictly below the epoch's start model when it was validated: averaged in, a
    policy that collapsed after it learned (a format failure on every answer) breaks the good
    checkpoints' weights, so the average can fall below either. When every checkpoint is below
    the start, the best one alone (the start is then kept; :func:`keep_or_advance`)."""
    ranked = rank_checkpoints(results, metric)
    if "start" not in results:
        return ranked[:top_k]
    floor = results["start"][metric]
    return [n for n in ranked[:top_k] if results[n][metric] >= floor] or ranked[:1]


def keep_or_advance(results: dict[str, Any], metric: str, start: str, averaged: str) -> str:
    """The next epoch's start: the average, unless the start model scored strictly higher on
    validation (a tie advances: the paper's loop carries the average forward)."""
    if results["start"][metric] > results["averaged"][metric]:
        return start
    return averaged


def rescore_curriculum(
    data: str | Path,
    model_path: str | Path,
    cdir: Path,
    *,
    max_new_tokens: int,
    engine: ValidationEngine | None = None,
    log: Log = print,
) -> Path:
    """Rank the whole train pool with ``model_path`` (greedy) and let the curriculum select the
    next epoch's prompts from those rankings. Writes ``cdir/rankings.jsonl``,
    ``cdir/train.parquet`` (returned; read it with :func:`read_selection`) and the curriculum
    report; a rerun reuses what exists."""
    from memsifter.training.rldata.build import load_rl_dataset, reselect_train
    from memsifter.training.rldata.curriculum import write_report as write_curriculum_report
    from memsifter.training.validation import rank_rows

    selected = cdir / "train.parquet"
    if not selected.exists():
        cdir.mkdir(parents=True, exist_ok=True)
        rankings = cdir / "rankings.jsonl"
        if not rankings.exists():
            pool = load_rl_dataset(data, pool=True)["train"]
            log(f"curriculum: ranking {len(pool)} train prompts with {model_path}")
            partial = cdir / "rankings.partial.jsonl"
            target = merged_for_eval(Path(model_path), cdir / "merged-for-eval")
            _, parse_rate = rank_rows(
                target, pool, partial, max_new_tokens=max_new_tokens, engine=engine
            )
            partial.replace(rankings)
            log(f"curriculum: parse rate {parse_rate:.2f}")
        train, report = reselect_train(data, rankings)
        write_curriculum_report(report, cdir)
        partial = cdir / "train.partial.parquet"
        train.to_parquet(str(partial))
        partial.replace(selected)
        for sel in report.sources:
            log(
                f"curriculum: {sel.source} NDCG@{report.k} mean {sel.ndcg_mean_before} -> "
                f"{sel.ndcg_mean_after} ({sel.n_selected} of {sel.n_pool})"
            )
    return selected


def read_selection(path: Path) -> Any:
    """An epoch's selected prompts (``rescore_curriculum``'s parquet) as a ``Dataset``."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    return Dataset(pq.read_table(path))  # not from_parquet: that writes to the HF cache


def merged_for_eval(ckpt: Path, scratch: Path) -> Path:
    """A folder transformers can load: LoRA checkpoints are merged into their base first."""
    if not (ckpt / "adapter_config.json").exists():
        return ckpt
    from memsifter.ranker.checkpoint import has_spec, read_spec, save_spec
    from memsifter.training.averaging import average_checkpoints

    out = scratch / ckpt.name
    if not out.exists():
        average_checkpoints([ckpt], out)
        if has_spec(ckpt):
            save_spec(read_spec(ckpt), out)
    return out


def emulated_autocast(cfg: TrainConfig, cuda: bool) -> str | None:
    """What to say, before the first step, when ``model.autocast: bf16`` runs on a CPU without
    bf16 units (kept, not switched)."""
    if cfg.model.autocast != "bf16" or cuda or cpu_bf16_units():
        return None
    return emulated_bf16_text("model.autocast bf16", "--set model.autocast=none runs float32")


def run_training(
    cfg: TrainConfig,
    *,
    vllm_server_host: str | None = None,
    answerer_url: str | None = None,
    judge_url: str | None = None,
    log: Log = print,
    until: str | None = None,
) -> dict[str, Any]:
    import torch

    from memsifter.models import resolve_model
    from memsifter.ranker.checkpoint import read_spec, save_spec
    from memsifter.rewards import load_reward_config
    from memsifter.rewards.config import with_endpoints
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.distributed import start_processes
    from memsifter.training.heads import head_of
    from memsifter.training.time_budget import check_time_budget
    from memsifter.training.validation import ValidationEngine, check_select_metric

    t_start = time.perf_counter()
    cuda = has_cuda()
    check_hardware(cfg, cuda)
    if until not in (None, "sft"):
        raise ValueError(f"until must be sft (or nothing), got {until!r}")
    if until == "sft" and not cfg.sft.enabled:
        raise ValueError("--until sft, but sft.enabled is false in the config")
    # Before any model loads: a source without a scorer would crash the first batch that holds it.
    rcfg = with_endpoints(
        load_reward_config(cfg.reward), answerer_url=answerer_url, judge_url=judge_url
    )
    check_select_metric(cfg, rcfg)
    procs = start_processes(cfg.barrier_timeout_s)
    if not procs.is_main:
        log = _quiet  # one log, the main process's
    if procs.distributed and cuda and cfg.epochs.validation_max_questions is None:
        raise DataError(
            "a multi-GPU run validates on its main process while the others wait: bound it with "
            "epochs.validation_max_questions",
            field="epochs.validation_max_questions",
        )
    check_time_budget(cfg.epochs.max_minutes, procs.world)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    if procs.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if cfg.source and Path(cfg.source).exists():
            shutil.copyfile(cfg.source, out / "config.yaml")
        # What actually ran: the file with every `--set` override applied.
        (out / "config.effective.yaml").write_text(
            yaml.safe_dump(asdict(cfg), sort_keys=False), encoding="utf-8"
        )
    procs.barrier()  # the folder exists, and every process reads the same run_state.json
    state = RunState(out / "run_state.json", writer=procs.is_main)
    procs.barrier()  # ... before the main process writes it again

    train, val = load_rl_data(cfg.data)
    rcfg.check_scorers(data_sources(cfg.data), where=str(cfg.reward))
    spec = read_spec(cfg.data)
    head = head_of(spec)
    head.check(cfg, spec, rcfg, procs)  # before any stage runs or model loads
    if cfg.epochs.validation_max_questions is not None:
        # A seeded sample across the held-out conversations, not the first file's questions.
        n = min(len(val), cfg.epochs.validation_max_questions)
        val = val.shuffle(seed=cfg.grpo.seed).select(range(n))
    log(f"RL data {cfg.data}: {len(train)} training prompts, {len(val)} held-out")
    if (said := emulated_autocast(cfg, cuda)) is not None:
        log(said)
    if procs.distributed:
        log(f"{procs.world} processes; validation, averaging and state writes on the main one")

    if cuda:  # a one-node layout's roles against the GPUs this machine shows
        from memsifter.training.plan import check_layout

        check_layout(cfg, procs.world, torch.cuda.device_count())
    if "chat_template_kwargs" in cfg.grpo.extra:
        raise DataError(
            "grpo.extra.chat_template_kwargs: prompts are rendered by the RL data's PromptSpec "
            "(prompt.chat_template_kwargs in the data recipe), never by the trainer",
            field="grpo.extra.chat_template_kwargs",
        )
    val_tokens = cfg.epochs.validation_max_new_tokens or cfg.grpo.max_completion_length

    model_path = resolve_model(cfg.model.name).path
    if cfg.sft.enabled:
        if not state.done("sft"):
            from memsifter.training.rldata.build import load_rl_dataset

            # SFT reads the whole train split, not the curriculum's selection: it teaches the
            # format and a prior on every training question (the selection is for GRPO).
            sft_train = load_rl_dataset(cfg.data, pool=True)["train"]
            log(f"cold-start SFT on {len(sft_train)} training prompts ({cfg.sft.target} targets)")
            final = head.cold_start(cfg, spec, model_path, sft_train, out / "sft", cuda=cuda,
                                    log=log)  # fmt: skip
            if procs.is_main:
                save_spec(spec, final)
            state.mark("sft", str(final))
            procs.barrier()  # sft/final is complete before any process loads it
        model_path = state.done("sft")
        if until == "sft":
            log(f"stopped after SFT: {model_path}")
            return {"model": model_path, "stage": "sft"}

    service = RewardService.from_config(rcfg)
    reward_fn = make_reward_function(service)
    reward_fn.set_total_steps(total_steps(cfg, len(train)))

    epochs_summary: list[dict[str, Any]] = []
    for epoch in range(cfg.epochs.epochs):
        edir = out / f"epoch-{epoch}"
        key = f"epoch-{epoch}"
        entry = state.done(key) or {}
        if entry.get("averaged"):
            model_path = entry.get("next", entry["averaged"])
            epochs_summary.append(entry)
            continue
        if procs.is_main:
            edir.mkdir(parents=True, exist_ok=True)
        epoch_train = train
        if epoch > 0 and cfg.epochs.rescore_curriculum:
            selected = procs.run_on_main(
                partial(
                    rescore_curriculum, cfg.data, model_path, edir / "curriculum",
                    max_new_tokens=val_tokens,
                    engine=ValidationEngine.from_config(cfg, spec.ranking_head), log=log,
                ),
                "the curriculum's re-score",
            )  # fmt: skip
            epoch_train = read_selection(selected)
            entry["train_data"] = str(selected)

        if not entry.get("trained"):
            procs.barrier()  # every process sees the same checkpoints to resume from
            ckpts = _checkpoints(edir)
            resume = str(ckpts[-1]) if ckpts else None
            log(
                f"epoch {epoch}: GRPO from {model_path}"
                + (f", resuming {resume}" if resume else "")
            )
            reward_fn.clock.start_epoch(
                sum((state.done(f"epoch-{i}") or {}).get("steps", 0) for i in range(epoch))
            )
            trainer = head.trainer(
                cfg, spec, model_path, epoch_train, reward_fn, edir, cuda=cuda, procs=procs,
                log=log, vllm_server_host=vllm_server_host,
            )  # fmt: skip
            trainer.train(resume_from_checkpoint=resume)
            step = trainer.state.global_step
            last = edir / f"checkpoint-{step}"
            procs.barrier()  # the main process's last save is on disk
            # Saving is collective under ZeRO-3/FSDP, so every process takes the main's answer.
            if procs.broadcast(not last.exists()):  # the final step, when save_steps missed it
                trainer.save_model(str(last))
                if procs.is_main:
                    save_spec(spec, last)
            if procs.is_main:
                trainer.state.save_to_json(str(edir / "trainer_state.json"))
            del trainer
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()  # the main process validates next, on this GPU
            entry["trained"] = True
            entry["steps"] = step
            state.mark(key, entry)

        outcome = procs.run_on_main(
            partial(
                _validate_and_average, cfg, epoch, edir, model_path, val, reward_fn, spec,
                val_tokens=val_tokens, log=log,
            ),
            f"epoch {epoch}'s validation and averaging",
        )  # fmt: skip
        if cfg.epochs.prune_optimizer_states and procs.is_main:
            freed = prune_optimizer_states(edir)
            if freed:
                log(f"epoch {epoch}: deleted its checkpoints' optimizer states ({freed:,} bytes)")
        procs.barrier()
        entry.update(outcome)
        state.mark(key, entry)
        epochs_summary.append(entry)
        model_path = outcome["next"]

    summary = {
        "model": model_path,
        "epochs": epochs_summary,
        "wall_s": time.perf_counter() - t_start,
        "config": asdict(cfg),
    }
    if procs.is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str), "utf-8")
        plot_curves(out, cfg.epochs.epochs)
        write_report(out, summary)
    procs.barrier()  # no process leaves (and no launcher reports success) before the report
    log(f"done: {model_path} (report: {out / 'report.md'})")
    return summary


# What a checkpoint holds only for resuming it: optimizer and scheduler states (TRL's, DeepSpeed's
# global_step* shards, FSDP's optimizer folders, the head trainer's float32 masters) and RNG.
RESUME_ONLY = (
    "optimizer*", "scheduler.pt", "scaler.pt", "rng_state*.pth", "global_step*",
)  # fmt: skip


def prune_optimizer_states(epoch_dir: Path) -> int:
    """Delete the resume-only files of every ``checkpoint-*`` under ``epoch_dir`` (weights,
    tokenizer, spec and trainer state stay); the bytes freed."""
    import shutil

    from memsifter.training.averaging import MASTER_FILE  # averaged before this runs

    freed = 0
    for ckpt in sorted(Path(epoch_dir).glob("checkpoint-*")):
        for pattern in (*RESUME_ONLY, MASTER_FILE):
            for path in ckpt.glob(pattern):
                if path.is_dir():
                    freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    shutil.rmtree(path)
                else:
                    freed += path.stat().st_size
                    path.unlink()
    return freed


def _quiet(_: str) -> None:
    pass


def data_sources(folder: str | Path) -> set[str]:
    """The ``data_source`` of every row in the RL data (train pool and held-out split): the
    sources whose task score the reward will need."""
    from memsifter.training.rldata.build import load_rl_dataset

    data = load_rl_dataset(folder, pool=True)
    return {str(s) for split in ("train", "validation") for s in data[split]["data_source"]}


def _validate_and_average(
    cfg: TrainConfig,
    epoch: int,
    edir: Path,
    model_path: str,
    val: Any,
    reward_fn: Any,
    spec: Any,
    *,
    val_tokens: int,
    log: Log,
) -> dict[str, Any]:
    """The main process's part of an epoch's end: validate every checkpoint (and the start
    model), average the top-k, validate the average and choose the next epoch's start. Returns
    the state entry's ``averaged``, ``next``, ``top`` and ``validation``."""
    from memsifter.ranker.checkpoint import save_spec
    from memsifter.training.averaging import average_checkpoints
    from memsifter.training.validation import ValidationEngine, result_dict, validate

    results_path = edir / "validation.json"
    results: dict[str, Any] = (
        json.loads(results_path.read_text(encoding="utf-8")) if results_path.exists() else {}
    )
    candidates = [*(_checkpoints(edir))]
    names = [c.name for c in candidates]
    paths = dict(zip(names, candidates, strict=True))
    if cfg.epochs.validate_start:
        names = ["start", *names]
        paths["start"] = Path(model_path)
    for name in names:
        if name in results:
            continue
        target = merged_for_eval(paths[name], edir / "merged-for-eval")
        r = validate(
            target,
            val,
            reward_fn,
            max_new_tokens=val_tokens,
            rankings_out=edir / "rankings" / f"{name}.jsonl",
            engine=ValidationEngine.from_config(cfg, spec.ranking_head),
        )
        results[name] = result_dict(r)
        log(
            f"epoch {epoch} {name}: NDCG@1 {r.ndcg_1:.3f} NDCG@5 {r.ndcg_5:.3f} "
            f"reward {r.reward:.4f} parse {r.parse_rate:.2f} ({r.seconds:.0f} s)"
        )
        results_path.write_text(json.dumps(results, indent=2), encoding="utf-8")

    # -- average the top-k checkpoints: the next epoch's start -------------------------------
    metric = cfg.epochs.select_metric.replace("ndcg@", "ndcg_")
    top = checkpoints_to_average(results, metric, cfg.epochs.top_k)
    if not top:
        raise RuntimeError(f"epoch {epoch} produced no checkpoints to average in {edir}")
    averaged = edir / "averaged"
    if averaged.exists():
        shutil.rmtree(averaged)  # a crash mid-write; recompute
    average_checkpoints([paths[n] for n in top], averaged)
    save_spec(spec, averaged)
    log(f"epoch {epoch}: averaged {', '.join(top)} (by {cfg.epochs.select_metric})")
    next_model = str(averaged)
    if cfg.epochs.keep_start_if_better:
        r = validate(
            averaged, val, reward_fn, max_new_tokens=val_tokens,
            rankings_out=edir / "rankings" / "averaged.jsonl",
            engine=ValidationEngine.from_config(cfg, spec.ranking_head),
        )  # fmt: skip
        results["averaged"] = result_dict(r)
        results_path.write_text(json.dumps(results, indent=2), encoding="utf-8")
        log(f"epoch {epoch} averaged: NDCG@1 {r.ndcg_1:.3f} NDCG@5 {r.ndcg_5:.3f}")
        next_model = keep_or_advance(results, metric, str(paths["start"]), next_model)
        if next_model != str(averaged):
            log(
                f"epoch {epoch}: the start model scores higher on validation "
                f"({cfg.epochs.select_metric} {results['start'][metric]:.3f} > "
                f"{results['averaged'][metric]:.3f}); the next epoch keeps it"
            )
    return {"averaged": str(averaged), "next": next_model, "top": top, "validation": results}
