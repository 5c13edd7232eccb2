"""What the epoch loop does differently for each ranking head, in one place, so the loop never
branches on the head itself:

* **generate** (``ranking_head: generate``): TRL's GRPO on written rankings
  (:mod:`memsifter.training.grpo`), with a format SFT as its optional cold start;
* **first_token**: the head's Plackett–Luce GRPO (:mod:`memsifter.training.pl_grpo`), with
  FIRST's listwise cross-entropy as its cold start (:mod:`memsifter.training.listwise_sft`).

Each head has three parts:

* ``check``: its refusals, before any stage runs;
* ``cold_start``: the SFT stage;
* ``trainer``: one epoch's trainer, with the ``train(resume_from_checkpoint)``, ``state`` and
  ``save_model`` surface the loop drives.

:func:`head_of` picks the head from the data's prompt spec.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from memsifter.errors import DataError

Log = Callable[[str], None]


class Head(Protocol):
    name: str

    def check(self, cfg: Any, spec: Any, rcfg: Any, procs: Any) -> None: ...

    def cold_start(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, out: Path, *, cuda: bool,
        log: Log,
    ) -> Path: ...  # fmt: skip

    def trainer(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, reward_fn: Any, out: Path, *,
        cuda: bool, procs: Any, log: Log, vllm_server_host: str | None,
    ) -> Any: ...  # fmt: skip


class GenerateHead:
    """TRL's GRPO on rankings the policy writes."""

    name = "generate"

    def check(self, cfg: Any, spec: Any, rcfg: Any, procs: Any) -> None:
        from memsifter.training.grpo import check_head_only
        from memsifter.training.mean_scale import check_mean_scale

        check_head_only(cfg, False)
        check_mean_scale(cfg, rcfg, False)  # before any model loads: mean needs rewards >= 0
        g = cfg.grpo
        if g.max_completion_length > spec.completion_tokens:
            raise DataError(
                f"grpo.max_completion_length ({g.max_completion_length}) exceeds the prompt "
                f"spec's completion budget ({spec.completion_tokens}): prompts were cut to leave "
                "only that much room in the window",
                field="grpo.max_completion_length",
            )
        val_tokens = cfg.epochs.validation_max_new_tokens or g.max_completion_length
        if val_tokens < g.max_completion_length:
            # A thinking answer that training lets run to the cap fails to parse at validation's
            # shorter cap and scores 0: checkpoint choice (and keep-start-if-better) would then
            # favour whichever model thinks less, not whichever ranks better.
            raise DataError(
                f"epochs.validation_max_new_tokens ({val_tokens}) is below "
                f"grpo.max_completion_length ({g.max_completion_length}): validation and "
                "the curriculum's re-score would cut answers that training lets finish; leave it "
                "unset (it follows the training length) or lower both",
                field="epochs.validation_max_new_tokens",
            )

    def cold_start(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, out: Path, *, cuda: bool,
        log: Log,
    ) -> Path:  # fmt: skip
        """The format SFT (the train pool's gold-first rankings as completions)."""
        from transformers import AutoConfig

        from memsifter.training.grpo import lora_config, precision, tracking_kwargs
        from memsifter.training.sft import run_sft

        n_layers = AutoConfig.from_pretrained(model_path).num_hidden_layers
        return run_sft(
            model_path, rows, cfg.sft, out, use_cpu=not cuda, bf16=precision(cfg, cuda)[0],
            tracking=tracking_kwargs(cfg, "sft"), seed=cfg.grpo.seed, think=spec.ask_think,
            peft_config=lora_config(cfg, n_layers),
        )  # fmt: skip

    def trainer(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, reward_fn: Any, out: Path, *,
        cuda: bool, procs: Any, log: Log, vllm_server_host: str | None,
    ) -> Any:  # fmt: skip
        from memsifter.training.grpo import build_trainer, spec_callback
        from memsifter.training.time_budget import time_budget_callback

        callbacks = [spec_callback(spec)]
        if cfg.epochs.max_minutes is not None:
            callbacks.append(time_budget_callback(cfg.epochs.max_minutes, log=log))
        return build_trainer(
            cfg, model_path, rows, reward_fn, out, cuda=cuda,
            vllm_server_host=vllm_server_host, callbacks=callbacks, clock=reward_fn.clock,
        )  # fmt: skip


class FirstTokenHead:
    """The head's Plackett–Luce GRPO over one forward pass's scores."""

    name = "first_token"

    def check(self, cfg: Any, spec: Any, rcfg: Any, procs: Any) -> None:
        from memsifter.training.grpo import check_head_only
        from memsifter.training.mean_scale import check_mean_scale
        from memsifter.training.pl_grpo import check_settings

        check_head_only(cfg, True)
        check_mean_scale(cfg, rcfg, True)
        check_settings(cfg)  # before any stage runs: SFT, LoRA, vLLM mean nothing here
        from memsifter.training.sharding import check_launch

        check_launch(procs.distributed)  # FSDP2 shards it; DeepSpeed and FSDP1 are refused
        if procs.distributed and cfg.sft.enabled:
            raise DataError(
                "ranking_head: first_token's cold start (its listwise SFT) runs in one process: "
                "run it alone first (memsifter train CONFIG --until sft, without accelerate), "
                "then launch the GRPO epochs with accelerate",
                field="sft.enabled",
            )

    def cold_start(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, out: Path, *, cuda: bool,
        log: Log,
    ) -> Path:  # fmt: skip
        """FIRST's listwise cross-entropy at the ranking position, not a format lesson."""
        from memsifter.training.listwise_sft import run_listwise_sft

        return run_listwise_sft(cfg, model_path, rows, out, cuda=cuda, log=log)

    def trainer(
        self, cfg: Any, spec: Any, model_path: str, rows: Any, reward_fn: Any, out: Path, *,
        cuda: bool, procs: Any, log: Log, vllm_server_host: str | None,
    ) -> Any:  # fmt: skip
        from memsifter.ranker.checkpoint import save_spec
        from memsifter.training.pl_grpo import PLGRPOTrainer

        return PLGRPOTrainer(
            cfg, model_path, rows, reward_fn, out, cuda=cuda,
            on_save=[partial(save_spec, spec)], log=log, procs=procs,
        )  # fmt: skip


HEADS: dict[str, Head] = {h.name: h for h in (GenerateHead(), FirstTokenHead())}


def head_of(spec: Any) -> Head:
    """The head the data's prompt spec names (``ranking_head``)."""
    return HEADS[spec.ranking_head]


__all__ = ["FirstTokenHead", "GenerateHead", "HEADS", "Head", "head_of"]
