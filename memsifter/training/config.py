"""The training run's typed configuration (``configs/train/*.yaml``).

One dataclass tree holds the whole run: the RL data, the model (full fine-tune or LoRA), the
optional cold-start SFT stage, GRPO (defaults from the paper and the official DAPO script),
dynamic sampling, the epoch loop with checkpoint averaging, the reward (a path to a reward YAML,
see ``configs/rewards/``), and tracking. Loading goes through :func:`memsifter.config.load_config`:
unknown keys and wrong types are errors naming the key.

Hardware is resolved here, once: on a machine without CUDA, ``use_cpu=True`` and ``bf16=False``
(bf16 fails on CPU in the Trainer), and vLLM rollouts are refused (``use_vllm`` needs a GPU).
Whether bf16 pays on a CPU depends on the CPU (AMX units make it ~2.2x faster, their absence
slower): the first-token trainer offers it as ``model.autocast``, chosen, never inferred.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsifter.config import load_config, setting
from memsifter.errors import DataError

LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
# What grpo.scale_rewards divides a group's centred rewards by: the group's std (GRPO's), the
# batch's, nothing, or the group's mean reward (the sampled gradient of log E[R]; rewards >= 0
# only, see memsifter.training.mean_scale). TRL has the first three; mean is ours, on both
# trainers.
SCALE_REWARDS = ("group", "batch", "none", "mean")
SFT_TARGETS = ("coarse", "gold", "random", "rankings")
SELECT_METRICS = ("ndcg@1", "ndcg@5", "reward")
VALIDATION_BACKENDS = ("transformers", "vllm")
PL_DEPTHS = ("auto", "full")
PL_CREDITS = ("ranking", "tiers")
PL_ADVANTAGES = ("grpo", "best_of_group")


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    # Adapt only the last N decoder layers (PEFT's layers_to_transform). Autograd then stops
    # below them, so the backward pass costs N/L of a full one: on 2 CPU cores this is what
    # makes hundreds of steps affordable. None adapts every layer.
    top_layers: int | None = None

    def __post_init__(self) -> None:
        if self.top_layers is not None and self.top_layers < 1:
            raise ValueError(f"model.lora.top_layers must be >= 1, got {self.top_layers}")


AUTOCASTS = ("none", "bf16")


@dataclass
class ModelSettings:
    name: str = "smollm2-135m-instruct"  # a built-in name, a local folder, or a hub id
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16
    # none | bf16: the first-token trainer's forward and backward under torch.autocast, weights
    # and optimizer state kept in dtype. On a CPU with AMX (Sapphire Rapids and later) a SmolLM2
    # step runs ~2.2x faster than in fp32 (eval/bench/bench_cpu_autocast.py); on a CPU without bf16
    # units it is slower. Validation and serving score in dtype, unchanged.
    autocast: str = "none"
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None  # e.g. sdpa on GPU (torch's own flash kernel)
    # The longest sequence the policy sees, prompt + completion (the data recipe's
    # prompt.window_tokens). Sets vLLM's --max-model-len for the rollout server and the sequence
    # length of `memsifter train --plan`.
    context_tokens: int | None = None
    # RoPE scaling for a window beyond the model's native context, applied when the policy loads
    # (onto the config.json's rope parameters) and passed to the rollout server as
    # --hf-overrides '{"rope_parameters": ...}'. Qwen3-4B (32K native) at 128K:
    # {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768, rope_theta: 1e6}.
    # rope_theta is required: vLLM's override replaces the model's whole rope_parameters.
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.autocast not in AUTOCASTS:
            raise ValueError(f"model.autocast must be one of {AUTOCASTS}, got {self.autocast!r}")
        if self.context_tokens is not None and self.context_tokens < 1:
            raise ValueError(f"model.context_tokens must be >= 1, got {self.context_tokens}")
        rope = self.rope_scaling
        if rope is None:
            return
        missing = [k for k in ("rope_type", "rope_theta") if k not in rope]
        if rope.get("rope_type") == "yarn":
            missing += [k for k in ("factor", "original_max_position_embeddings") if k not in rope]
        if missing:
            raise ValueError(
                f"model.rope_scaling needs {missing} (e.g. {{rope_type: yarn, factor: 4.0, "
                "original_max_position_embeddings: 32768, rope_theta: 1000000}}; rope_theta is "
                "the model's own, from its config.json)"
            )
        if rope.get("rope_type") == "yarn" and self.context_tokens is not None:
            reach = int(rope["factor"] * rope["original_max_position_embeddings"])
            if self.context_tokens > reach:
                raise ValueError(
                    f"model.context_tokens {self.context_tokens} is beyond what rope_scaling "
                    f"reaches (factor x original_max_position_embeddings = {reach})"
                )


@dataclass
class SoftOverlongSettings:
    """DAPO's soft overlong punishment (TRL's reward), added to the outcome reward."""

    cache_tokens: int = 64  # the last this-many tokens before max_completion_length ramp to -1


@dataclass
class GRPOSettings:
    num_generations: int = 6
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 512
    epsilon: float = 0.2
    epsilon_high: float = 0.28  # clip-higher
    beta: float = 0.0  # no KL term, no reference model
    loss_type: str = "dapo"  # token-mean over the generation batch
    scale_rewards: str = setting(
        "group",
        help="what each group's centred rewards (r - the group's mean) are divided by. group: "
        "the group's std (GRPO's); batch: the batch's std; none: nothing; mean: the group's "
        "mean reward, so the advantage is the sampled gradient of log E[R] and a rare success "
        "keeps its full weight where the std would shrink it (eval/probes/gym_pg_probe.py). mean "
        "needs rewards >= 0: refused with subtract_s0, a negative format_reward (generate "
        "mode) or soft_overlong.",
    )
    learning_rate: float = 1e-6
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "constant"
    warmup_steps: float = 0  # an int is steps, a float < 1 a fraction of the run
    per_device_train_batch_size: int = 6  # completions per device per micro-step
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None
    num_iterations: int = 1
    mask_truncated_completions: bool = True
    soft_overlong: SoftOverlongSettings | None = None
    use_vllm: bool = False  # GPU only
    vllm_mode: str = "colocate"  # colocate | server
    vllm_server_host: str | None = None
    vllm_server_port: int = 8000
    vllm_gpu_memory_utilization: float = 0.3
    vllm_tensor_parallel_size: int = 1
    logging_steps: int = 1
    log_completions: bool = False
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # passed to GRPOConfig as is
    pl_depth: str | int = setting(
        "auto",
        help="ranking_head first_token only: how many places of each Plackett-Luce ranking "
        "are drawn, scored and trained. auto: the run's reward's own depth, per row and step "
        "(R_ans's deepest tier, R_ret's retrieval_k while the warm-up weighs it), since places "
        "below it cannot change the reward and only add noise to the gradient; an int: that "
        "many places; full: every candidate (the estimator before the prefix).",
    )
    pl_credit: str = setting(
        "ranking",
        help="ranking_head first_token only: what each place of a ranking is credited with. "
        "ranking: the whole ranking's advantage on every place (GRPO's); tiers: each place "
        "only the tiers of R_ans it can still change (those reading deeper than it, each with "
        "its group's baseline; PL-Rank style reward-to-go), R_ret whole. Both estimate the "
        "same gradient; tiers drops the terms a place cannot move "
        "(eval/probes/gym_pl_variance.py).",
    )
    pl_advantage: str = setting(
        "grpo",
        help="ranking_head first_token only: what the rankings of a group are weighted by. "
        "grpo: the reward minus the group's mean, scaled by scale_rewards (the policy gradient "
        "of the expected reward, which reaches a candidate in proportion to its probability); "
        "best_of_group: the group's best-rewarded rankings (ties shared) imitated with weight 1 "
        "a prompt against the group's mean log-probability (RAFT/ReST style: the reward chooses, "
        "the step is a cross-entropy's size however unlikely the best ranking was; no "
        "scale_rewards, no pl_credit). It assumes a reward whose best is worth copying: a noisy "
        "reward's luckiest draw is copied too.",
    )

    def __post_init__(self) -> None:
        if self.pl_credit not in PL_CREDITS:
            raise ValueError(f"grpo.pl_credit must be one of {PL_CREDITS}, got {self.pl_credit!r}")
        if self.pl_advantage not in PL_ADVANTAGES:
            raise ValueError(
                f"grpo.pl_advantage must be one of {PL_ADVANTAGES}, got {self.pl_advantage!r}"
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"grpo.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"grpo.scale_rewards must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}"
            )
        if self.num_generations < 2:
            raise ValueError("grpo.num_generations must be >= 2: GRPO's baseline is the group")
        depth = self.pl_depth
        if isinstance(depth, str) and depth not in PL_DEPTHS:
            raise ValueError(
                f"grpo.pl_depth must be one of {PL_DEPTHS} or an int >= 1, got {depth!r}"
            )
        if isinstance(depth, int) and depth < 1:
            raise ValueError(f"grpo.pl_depth must be >= 1, got {depth}")
        if "max_prompt_length" in self.extra:
            raise ValueError(
                "grpo.extra.max_prompt_length: GRPOConfig no longer accepts it; prompts are "
                "bounded by the prompt builder (the RL data recipe's window_tokens)"
            )


@dataclass
class DynamicSamplingSettings:
    """DAPO's filter groups: drop groups whose rewards do not vary (no gradient signal) and
    refill the batch from fresh prompts, for at most ``max_extra_rounds`` extra generations."""

    enabled: bool = True
    max_extra_rounds: int = 2
    min_std: float = 1e-6  # a group with reward std <= this carries no signal


@dataclass
class SFTSettings:
    """Cold-start SFT (our addition to the paper's recipe): teach the output format on the
    training split before GRPO. Targets are a short reasoning line plus a ranking taken from the
    coarse order or the gold sessions."""

    enabled: bool = False
    target: str = "coarse"  # coarse | gold (gold first, then the coarse order) | random | rankings
    # target rankings: a rankings file (memsifter.training.rldata.curriculum's format: one
    # {"qid", "ranking": [prompt positions]} a line) of every train prompt, written by another
    # ranker on this data build, e.g. a head's own order taught to the written form.
    rankings: str | None = None
    # How many ids a target names (its first ones); None: every candidate. A short ranking is a
    # short completion: GRPO's advantage then falls on the ids that the top tiers score.
    target_ids: int | None = None
    epochs: float = 1.0
    learning_rate: float = 2e-5
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_examples: int | None = None

    def __post_init__(self) -> None:
        if self.target not in SFT_TARGETS:
            raise ValueError(f"sft.target must be one of {SFT_TARGETS}, got {self.target!r}")
        if self.target_ids is not None and self.target_ids < 1:
            raise ValueError(f"sft.target_ids must be >= 1 or null, got {self.target_ids}")
        if (self.target == "rankings") != (self.rankings is not None):
            raise ValueError(
                "sft.rankings names the rankings file that sft.target: rankings teaches, and "
                f"only that target reads it (got target {self.target!r}, rankings "
                f"{self.rankings!r})"
            )


@dataclass
class EpochSettings:
    """The paper's epoch loop: train, save every ``save_steps``, validate every checkpoint on
    the held-out split, average the ``top_k`` best (fp32, LoRA merged first), start the next
    epoch from the average."""

    epochs: int = 1
    max_steps: int = -1  # optimiser steps per epoch; -1: one pass over the selected data
    save_steps: int = 50
    # A wall-clock budget per epoch (memsifter.training.time_budget): stop and save after the
    # first step that ends past it. max_steps stays the plan (it sizes the schedules).
    max_minutes: float | None = None
    top_k: int = 3
    select_metric: str = "ndcg@5"  # ndcg@1 | ndcg@5 | reward
    validation_max_questions: int | None = None  # a seeded sample of the held-out split
    validation_max_new_tokens: int | None = None  # default: grpo.max_completion_length
    validate_start: bool = True  # also validate the model each epoch starts from
    # The average is validated too; when the start model scores strictly higher on
    # ``select_metric`` the next epoch (and the run) keeps the start: an epoch that made the
    # policy worse on the held-out split is not carried forward. Needs ``validate_start``.
    keep_start_if_better: bool = True
    # Between epochs, rank the whole train pool with the next epoch's start model and let the
    # curriculum select that epoch's prompts from those rankings (the paper's re-scoring with
    # the current policy). Costs one greedy pass over the pool per epoch boundary.
    rescore_curriculum: bool = True
    # Once an epoch is validated and averaged, nothing resumes from its checkpoints: their
    # optimizer states (tens of GB a checkpoint for a 4B full fine-tune under ZeRO-3) are
    # deleted, the weights kept. false keeps them.
    prune_optimizer_states: bool = True
    # How the main process generates for validation and the re-score. transformers: greedy,
    # batched, in the training process (CPU runs, tests). vllm: an in-process vllm.LLM built per
    # model folder on the main process's GPU after the epoch's trainer is freed, and shut down
    # after it (the GPU recipes: hours with transformers become minutes). The model folder's
    # config.json carries the policy's rope scaling, so validation reads the trained window.
    validation_backend: str = "transformers"  # transformers | vllm
    # vllm engine arguments (gpu_memory_utilization, enforce_eager, dtype, ...);
    # max_model_len defaults to model.context_tokens.
    validation_engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.validation_backend not in VALIDATION_BACKENDS:
            raise ValueError(
                f"epochs.validation_backend must be one of {VALIDATION_BACKENDS}, got "
                f"{self.validation_backend!r}"
            )
        if self.validation_engine_args and self.validation_backend != "vllm":
            raise ValueError("epochs.validation_engine_args are vllm engine arguments")
        if self.select_metric not in SELECT_METRICS:
            raise ValueError(
                f"epochs.select_metric must be one of {SELECT_METRICS}, got {self.select_metric!r}"
            )
        if self.top_k < 1:
            raise ValueError("epochs.top_k must be >= 1")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"epochs.max_minutes must be > 0 or null, got {self.max_minutes}")
        if self.keep_start_if_better and not self.validate_start:
            raise ValueError(
                "epochs.keep_start_if_better compares the average with the start model, so it "
                "needs epochs.validate_start: true"
            )


@dataclass
class PlanSettings:
    """What ``memsifter train CONFIG --plan`` sizes the run against: the hardware and the
    distribution strategy. The run itself ignores these (accelerate's own config decides)."""

    # Its ZeRO stage (or FSDP sharding), offload and mixed precision shape the memory plan;
    # train_multinode.sh's STRATEGY picks the same file.
    accelerate_config: str = "configs/accelerate/ddp.yaml"
    gpus: int = 1  # training processes (NNODES x NPROC_PER_NODE)
    gpu_memory_gb: float = 80.0  # per GPU, decimal GB (an "80 GB" card has 85.5e9 bytes)
    # The model's config.json (or its folder) for its shape: hidden size, layers, heads, vocab.
    # Default: model.name when that is a local folder. Nothing is downloaded.
    model_config: str | None = None
    # CUDA context, NCCL buffers and allocator fragmentation, which the plan does not model.
    reserve_gb: float = 4.0
    # Which trainer's memory: generate (TRL's GRPO) or first_token (the head's Plackett-Luce
    # GRPO), as the data recipe's prompt.ranking_head says.
    ranking_head: str = "generate"
    # A one-node layout: every role on one machine of node_gpus GPUs: the training processes
    # (gpus), the rollout server (rollout_gpus, vllm_mode server) and the reward's working LLM
    # and judge (answerer_gpus). The run refuses to start where they do not add up to the GPUs
    # it sees. null: roles on other machines (train_multinode.sh).
    node_gpus: int | None = None
    rollout_gpus: int = 0
    answerer_gpus: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"plan.gpus must be >= 1, got {self.gpus}")
        if self.gpu_memory_gb <= 0:
            raise ValueError(f"plan.gpu_memory_gb must be > 0, got {self.gpu_memory_gb}")
        if self.ranking_head not in ("generate", "first_token"):
            raise ValueError(
                f"plan.ranking_head must be generate or first_token, got {self.ranking_head!r}"
            )
        if min(self.rollout_gpus, self.answerer_gpus) < 0:
            raise ValueError("plan.rollout_gpus and plan.answerer_gpus must be >= 0")
        if self.node_gpus is not None and self.node_gpus < self.role_gpus:
            raise ValueError(
                f"plan: the roles need {self.role_gpus} GPUs ({self.gpus} training + "
                f"{self.rollout_gpus} rollout + {self.answerer_gpus} answerer) but "
                f"plan.node_gpus is {self.node_gpus}"
            )

    @property
    def role_gpus(self) -> int:
        """GPUs the roles take on a one-node layout."""
        return self.gpus + self.rollout_gpus + self.answerer_gpus


@dataclass
class TrackingSettings:
    backend: str = "trackio"  # trackio | wandb | none
    project: str = "memsifter"
    offline: bool = True


@dataclass
class TrainConfig:
    output_dir: str = "outputs/train"
    data: str = "data/rl/locomo_smollm2"  # a folder written by `memsifter data rl`
    reward: str = "configs/rewards/default.yaml"
    model: ModelSettings = field(default_factory=ModelSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    dynamic_sampling: DynamicSamplingSettings = field(default_factory=DynamicSamplingSettings)
    epochs: EpochSettings = field(default_factory=EpochSettings)
    tracking: TrackingSettings = field(default_factory=TrackingSettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    threads: int | None = None  # torch CPU threads; None leaves torch's default
    # Multi-process runs: how long the other processes wait at a barrier (the process group's
    # timeout) while the main process validates, averages and re-scores the curriculum alone.
    barrier_timeout_s: int = 4 * 3600
    # Where this config was loaded from; relative paths resolve against the repo root (cwd).
    source: str | None = None
    overrides: list[str] = field(default_factory=list)  # `memsifter train --set`, in order


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """A training config, with ``KEY=VALUE`` overrides (``memsifter train --set``) applied
    before validation, so an override is checked like a line of the file."""
    cfg = load_config(TrainConfig, path, overrides)
    cfg.source = str(path)
    cfg.overrides = list(overrides)
    return cfg


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_hardware(cfg: TrainConfig, cuda: bool | None = None) -> None:
    cuda = has_cuda() if cuda is None else cuda
    if cfg.grpo.use_vllm and not cuda:
        raise DataError(
            "grpo.use_vllm needs a CUDA GPU; on CPU the policy generates with transformers "
            "(set grpo.use_vllm: false)",
            field="grpo.use_vllm",
        )
    if cfg.grpo.use_vllm:
        from memsifter.training.gpu_env import check_vllm, installed

        check_vllm(installed("vllm"), installed("trl"))
    if cfg.model.dtype == "bfloat16" and not cuda:
        raise DataError(
            "model.dtype bfloat16 on CPU: the Trainer's bf16 fails there; use auto or float32 "
            "(the first-token trainer takes model.autocast: bf16, fp32 weights with bf16 "
            "matmuls)",
            field="model.dtype",
        )
