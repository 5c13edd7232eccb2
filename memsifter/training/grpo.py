"""From our typed config to TRL: ``GRPOConfig``, the reward functions and the trainer.

Kept apart from the epoch loop so that a test (and ``memsifter train --dry-run``) can build the
exact ``GRPOConfig`` every shipped YAML asks for without loading a model.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from memsifter.errors import DataError
from memsifter.training.config import GRPOSettings, TrainConfig, has_cuda


def report_to(cfg: TrainConfig) -> list[str]:
    """Trainer ``report_to``; offline tracking is set up through the environment, which is
    how both trackio and wandb read it."""
    import os

    backend = cfg.tracking.backend
    if backend == "none":
        return []
    if backend == "wandb" and cfg.tracking.offline:
        os.environ.setdefault("WANDB_MODE", "offline")
    if backend == "trackio":
        os.environ.setdefault("TRACKIO_PROJECT", cfg.tracking.project)
    if backend == "wandb":
        os.environ.setdefault("WANDB_PROJECT", cfg.tracking.project)
    if backend not in ("trackio", "wandb"):
        raise ValueError(f"tracking.backend must be trackio, wandb or none, got {backend!r}")
    return [backend]


def tracking_kwargs(cfg: TrainConfig, run_name: str) -> dict[str, Any]:
    """TrainingArguments for the tracker: the project, a run name per stage, and (offline)
    no trackio Space or static-Space sync."""
    out: dict[str, Any] = {"report_to": report_to(cfg), "run_name": run_name}
    if cfg.tracking.backend == "trackio":
        out["project"] = cfg.tracking.project
        if cfg.tracking.offline:
            out["trackio_static_space_id"] = False
    return out


def precision(cfg: TrainConfig, cuda: bool) -> tuple[bool, str]:
    """(bf16, torch dtype name) for the trainer and the model."""
    dtype = cfg.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    return dtype == "bfloat16", dtype


def check_head_only(cfg: TrainConfig, head: bool) -> None:
    """The first-token trainers' options; under TRL they would be silent no-ops."""
    if head:
        return
    if cfg.model.autocast != "none":
        raise DataError(
            f"model.autocast: {cfg.model.autocast} is the first-token trainers' option; the TRL "
            "trainer takes its precision from model.dtype (bf16 on a GPU)",
            field="model.autocast",
        )
    defaults = GRPOSettings()  # the settings' own defaults are GRPO's choices
    for name in ("pl_advantage", "pl_credit"):
        value, default = getattr(cfg.grpo, name), getattr(defaults, name)
        if value != default:
            raise DataError(
                f"grpo.{name}: {value} is the first-token head's Plackett-Luce option; the TRL "
                f"trainer (ranking_head: generate) has only GRPO's {default}",
                field=f"grpo.{name}",
            )


def policy_autocast(cfg: TrainConfig, cuda: bool) -> AbstractContextManager[Any]:
    """The head trainers' forward context (``model.autocast``): bf16 matmuls over the weights'
    own dtype, or nothing. The backward runs outside it, as torch.autocast asks."""
    import torch

    if cfg.model.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16)


def build_grpo_config(
    cfg: TrainConfig,
    output_dir: str | Path,
    *,
    cuda: bool | None = None,
    max_steps: int | None = None,
    vllm_server_host: str | None = None,
) -> Any:
    from trl import GRPOConfig

    kwargs = grpo_config_kwargs(
        cfg, output_dir, cuda=cuda, max_steps=max_steps, vllm_server_host=vllm_server_host
    )
    return GRPOConfig(**kwargs)


def grpo_config_kwargs(
    cfg: TrainConfig,
    output_dir: str | Path,
    *,
    cuda: bool | None = None,
    max_steps: int | None = None,
    vllm_server_host: str | None = None,
) -> dict[str, Any]:
    """``GRPOConfig`` arguments for ``cfg`` on a machine with (``cuda``) or without a GPU.
    Separate from building it because ``TrainingArguments`` refuses GPU settings (bf16) on a
    machine without one, and the multi-GPU recipes are checked here, on CPU."""
    cuda = has_cuda() if cuda is None else cuda
    g = cfg.grpo
    bf16, _ = precision(cfg, cuda)
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        num_generations=g.num_generations,
        temperature=g.temperature,
        top_p=g.top_p,
        max_completion_length=g.max_completion_length,
        epsilon=g.epsilon,
        epsilon_high=g.epsilon_high,
        beta=g.beta,
        loss_type=g.loss_type,
        # TRL has no mean scale: it centres (none) and MeanScaledGRPOTrainer divides.
        scale_rewards="none" if g.scale_rewards == "mean" else g.scale_rewards,
        learning_rate=g.learning_rate,
        weight_decay=g.weight_decay,
        max_grad_norm=g.max_grad_norm,
        lr_scheduler_type=g.lr_scheduler_type,
        warmup_steps=g.warmup_steps,
        per_device_train_batch_size=g.per_device_train_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        num_iterations=g.num_iterations,
        mask_truncated_completions=g.mask_truncated_completions,
        logging_steps=g.logging_steps,
        log_completions=g.log_completions,
        seed=g.seed,
        save_strategy="steps",
        save_steps=cfg.epochs.save_steps,
        max_steps=cfg.epochs.max_steps if max_steps is None else max_steps,
        num_train_epochs=1,  # one pass per epoch of the paper's loop; the loop runs epochs
        **tracking_kwargs(cfg, Path(output_dir).name),
        use_cpu=not cuda,
        bf16=bf16,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        use_vllm=g.use_vllm,
    )
    if g.steps_per_generation is not None:
        kwargs["steps_per_generation"] = g.steps_per_generation
    if g.use_vllm and g.vllm_mode == "colocate" and cfg.model.rope_scaling is not None:
        raise ValueError(
            "model.rope_scaling with grpo.vllm_mode colocate: TRL's in-process vLLM engine takes "
            "no rope override, so it would generate with the native context; use vllm_mode "
            "server (train_multinode.sh --role rollout passes --hf-overrides), or a model folder "
            "whose config.json carries the rope scaling (and no model.rope_scaling)"
        )
    if g.use_vllm:
        kwargs.update(
            vllm_mode=g.vllm_mode,
            vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=g.vllm_tensor_parallel_size,
        )
        host = vllm_server_host or g.vllm_server_host
        if g.vllm_mode == "server":
            if not host:
                raise ValueError("grpo.vllm_mode server needs grpo.vllm_server_host (or the flag)")
            kwargs.update(vllm_server_host=host, vllm_server_port=g.vllm_server_port)
    kwargs.update(g.extra)
    return kwargs


def reward_funcs(cfg: TrainConfig, reward_fn: Any) -> tuple[list[Any], list[float] | None]:
    """The outcome reward, plus DAPO's soft overlong punishment when configured."""
    funcs: list[Any] = [reward_fn]
    weights = None
    if cfg.grpo.soft_overlong is not None:
        from trl.rewards import get_soft_overlong_punishment

        funcs.append(
            get_soft_overlong_punishment(
                cfg.grpo.max_completion_length, cfg.grpo.soft_overlong.cache_tokens
            )
        )
        weights = [1.0, 1.0]
    return funcs, weights


def rope_parameters(cfg: TrainConfig, model_config: Any) -> dict[str, Any]:
    """The policy's rope parameters: the model's own (``config.json``) with
    ``model.rope_scaling`` laid over them."""
    own = getattr(model_config, "rope_parameters", None) or {}
    return {**own, **(cfg.model.rope_scaling or {})}


def vllm_serve_args(cfg: TrainConfig) -> list[str]:
    """The arguments the rollout server (``trl vllm-serve``, which hands unknown flags on to
    ``vllm serve``) needs to serve this config's policy: the model, the window
    (``--max-model-len``) and the rope scaling (``--hf-overrides``; vLLM dropped
    ``--rope-scaling`` for it)."""
    import json

    args = ["--model", cfg.model.name]
    if cfg.model.context_tokens is not None:
        args += ["--max-model-len", str(cfg.model.context_tokens)]
    if cfg.model.rope_scaling is not None:
        overrides = {"rope_parameters": dict(cfg.model.rope_scaling)}
        args += ["--hf-overrides", json.dumps(overrides, sort_keys=True)]
    return args


def load_policy(cfg: TrainConfig, model_path: str, cuda: bool) -> tuple[Any, Any, Any]:
    """(model, tokenizer, peft_config) for the policy, with ``model.rope_scaling`` applied to
    its config (so a saved checkpoint's config.json carries it too)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    _, dtype = precision(cfg, cuda)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    if cfg.model.rope_scaling is not None:
        config = AutoConfig.from_pretrained(model_path)
        config.rope_parameters = rope_parameters(cfg, config)
        kwargs["config"] = config
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    positions_from_mask(model)
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok, lora_config(cfg, model.config.num_hidden_layers)


def positions_from_mask(model: Any) -> bool:
    """Give a policy with absolute position embeddings (GPT-2's ``wpe``; no RoPE in its config)
    the position ids ``generate`` gives it. transformers' ``generate`` counts positions from the
    attention mask, so a left-padded prompt starts at 0; TRL's scoring forward passes no
    position ids, and such a model then counts from the first pad. The completions would be
    scored (and trained) in other positions than they were sampled in: off-policy by the pad
    count, which the memory gym found as a collapse. RoPE models see only relative positions,
    for which the two agree, and are left alone. Returns whether the hook was added."""
    config = getattr(model, "config", None)
    if (
        config is None
        or getattr(config, "rope_parameters", None)
        or getattr(config, "rope_theta", None)
    ):
        return False

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mask = kwargs.get("attention_mask")
        cache = kwargs.get("past_key_values")
        if kwargs.get("position_ids") is not None or mask is None or mask.dim() != 2:
            return None
        if cache is not None and getattr(cache, "get_seq_length", lambda: 0)() > 0:
            return None  # decoding with a cache: generate passes its own positions
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return True


def lora_config(cfg: TrainConfig, num_layers: int) -> Any:
    """PEFT ``LoraConfig`` for ``cfg.model.lora`` (None for a full fine-tune)."""
    if cfg.model.lora is None:
        return None
    from peft import LoraConfig

    lo = cfg.model.lora
    layers = None
    if lo.top_layers is not None:
        if lo.top_layers > num_layers:
            raise ValueError(
                f"model.lora.top_layers is {lo.top_layers} but the model has {num_layers} layers"
            )
        if isinstance(lo.target_modules, str):
            raise ValueError(
                "model.lora.top_layers needs target_modules as a list of module names "
                f"(PEFT's layers_to_transform refuses {lo.target_modules!r})"
            )
        layers = list(range(num_layers - lo.top_layers, num_layers))
    return LoraConfig(
        r=lo.r,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=lo.target_modules,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def build_trainer(
    cfg: TrainConfig,
    model_path: str,
    train_dataset: Any,
    reward_fn: Any,
    output_dir: Path,
    *,
    cuda: bool | None = None,
    vllm_server_host: str | None = None,
    callbacks: list[Any] | None = None,
    clock: Any = None,
) -> Any:
    """The GRPO trainer for one epoch; ``clock`` is the run's step clock (the reward
    function's :class:`~memsifter.rewards.shaping.RunClock`: it seeds dynamic sampling's
    refills with the run's step, so epochs draw different prompts).
    ``grpo.scale_rewards: mean`` gets the mean-scaled trainer of either kind
    (:mod:`memsifter.training.mean_scale_trainer`)."""
    from memsifter.training.dynamic_sampling import DynamicSamplingGRPOTrainer

    cuda = has_cuda() if cuda is None else cuda
    args = build_grpo_config(cfg, output_dir, cuda=cuda, vllm_server_host=vllm_server_host)
    funcs, weights = reward_funcs(cfg, reward_fn)
    if weights is not None:
        args.reward_weights = weights
    model, tok, peft_config = load_policy(cfg, model_path, cuda)
    common: dict[str, Any] = dict(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=train_dataset,
        processing_class=tok,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    mean = cfg.grpo.scale_rewards == "mean"
    if mean:
        from memsifter.training.mean_scale_trainer import (
            MeanScaledDynamicSamplingGRPOTrainer,
            MeanScaledGRPOTrainer,
        )
    ds = cfg.dynamic_sampling
    if ds.enabled:
        sampling = MeanScaledDynamicSamplingGRPOTrainer if mean else DynamicSamplingGRPOTrainer
        return sampling(
            **common,
            max_extra_rounds=ds.max_extra_rounds,
            min_std=ds.min_std,
            clock=clock,
        )
    from trl import GRPOTrainer

    return (MeanScaledGRPOTrainer if mean else GRPOTrainer)(**common)


def spec_callback(spec: Any) -> Any:
    """A ``TrainerCallback`` that saves the PromptSpec into every checkpoint TRL saves."""
    from transformers import TrainerCallback

    from memsifter.ranker.checkpoint import save_spec

    class _SaveSpec(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero:
                save_spec(spec, Path(args.output_dir) / f"checkpoint-{state.global_step}")

    return _SaveSpec()
