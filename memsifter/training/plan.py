"""The per-GPU memory plan of a training config (``memsifter train CONFIG --plan``), without a GPU
and without loading weights.

Everything comes from the config, the accelerate config it names (``plan.accelerate_config``: the
ZeRO stage or FSDP sharding, optimizer offload, mixed precision) and the numbers of the model's
``config.json`` (hidden size, layers, heads, intermediate size, vocabulary). Bytes per GPU:

* **Weights** ``P x w``, with ``w`` = 2 for a bf16 policy (4 for fp32); sharded over the GPUs
  under ZeRO-3 / FSDP full sharding. ZeRO-3 also holds the layers it has gathered to compute:
  two decoder layers (the current one and the prefetched next) and the embedding (the lm_head
  of a tied model), in 16-bit.
* **Gradients** ``T x w`` for the ``T`` trainable parameters (all of them, or the LoRA
  matrices); sharded from ZeRO-2 on.
* **Optimizer states** (AdamW): DeepSpeed keeps an fp32 master copy plus the two moments, 12
  bytes per trainable parameter; plain torch (DDP, FSDP) keeps the two moments in the parameters'
  dtype, ``2 x w``. Sharded from ZeRO-1 on; nothing on the GPU when offloaded to the CPU.
* **Activations** of one forward pass: ``b`` sequences (``per_device_train_batch_size``) of
  ``S`` tokens (``model.context_tokens``, prompt + completion). With gradient checkpointing
  each decoder layer keeps only its input, ``b S H L a`` bytes (``a`` = 2 in bf16), and the
  backward pass recomputes one layer at a time, ``b S A a`` with ``A = 6H + 3q + 3kv + 4I``
  values per token (``q`` = heads x head_dim, ``kv`` = key-value heads x head_dim, ``I`` the MLP
  width): the norms' inputs and outputs, q/k/v before and after rotation, the attention output,
  the residual, the MLP's gate, up, activation and product. The attention scores are never held
  (sdpa / flash kernels). Without checkpointing every layer keeps its ``A``: ``b S A L a``.
* **Logits** of the completion tokens only (TRL asks the model for ``logits_to_keep``):
  ``b C V a x 3`` for the lm_head's output, its temperature-scaled copy and their gradient.
* **vLLM's share**: in colocate mode vLLM takes ``vllm_gpu_memory_utilization`` of every
  training GPU; in server mode it runs on the rollout node, not here.
* **Reserve** (``plan.reserve_gb``): the CUDA context, NCCL buffers and fragmentation.

It is an estimate of the peak, meant to catch a recipe that cannot fit (six 128K sequences per
forward pass is ~150 GB of checkpoints alone), not to replace a profile on the real GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memsifter.errors import DataError
from memsifter.training.config import TrainConfig

GB = 1e9
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer's ``config.json`` the plan needs."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    qk_norm: bool = False  # Qwen3 normalises q and k per head (two head_dim-sized weights)

    @classmethod
    def from_config_json(cls, path: str | Path) -> ModelShape:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise DataError(f"no model config.json at {p}", field="plan.model_config")
        c = json.loads(p.read_text())
        try:
            heads = int(c["num_attention_heads"])
            hidden = int(c["hidden_size"])
            return cls(
                hidden_size=hidden,
                num_hidden_layers=int(c["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or hidden // heads),
                intermediate_size=int(c["intermediate_size"]),
                vocab_size=int(c["vocab_size"]),
                tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                max_position_embeddings=c.get("max_position_embeddings"),
                rope_theta=c.get("rope_theta")
                or (c.get("rope_parameters") or {}).get("rope_theta"),
                qk_norm=str(c.get("model_type", "")).startswith("qwen3"),
            )
        except KeyError as e:
            raise DataError(f"{p} has no {e.args[0]!r}", field="plan.model_config") from e

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_parameters(self) -> int:
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return sum(a * b for a, b in self.linear_shapes().values()) + norms

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def parameters(self) -> int:
        """Every parameter: embeddings, decoder layers, the final norm, an untied lm_head."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return (
            self.embedding_parameters
            + self.num_hidden_layers * self.layer_parameters
            + self.hidden_size
            + head
        )

    @property
    def activation_values_per_token(self) -> int:
        """``A``: values one decoder layer keeps per token for its backward pass."""
        h = self.hidden_size
        return 6 * h + 3 * self.q_dim + 3 * self.kv_dim + 4 * self.intermediate_size


@dataclass(frozen=True)
class Strategy:
    """What the accelerate config says about memory."""

    name: str  # ddp | deepspeed | fsdp
    stage: int  # 0: replicated; 1: optimizer sharded; 2: + gradients; 3: + weights
    offload_optimizer: bool = False
    offload_params: bool = False
    mixed_precision: str = "bf16"

    @classmethod
    def from_accelerate_config(cls, path: str | Path) -> Strategy:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"no accelerate config at {p}", field="plan.accelerate_config")
        c: dict[str, Any] = yaml.safe_load(p.read_text()) or {}
        kind = c.get("distributed_type", "NO")
        mp = str(c.get("mixed_precision", "no"))
        if kind == "DEEPSPEED":
            ds = c.get("deepspeed_config") or {}
            return cls(
                "deepspeed",
                int(ds.get("zero_stage", 0)),
                offload_optimizer=ds.get("offload_optimizer_device", "none") not in ("none", None),
                offload_params=ds.get("offload_param_device", "none") not in ("none", None),
                mixed_precision=mp,
            )
        if kind == "FSDP":
            f = c.get("fsdp_config") or {}
            sharding = str(f.get("fsdp_sharding_strategy", "FULL_SHARD"))
            if f.get("fsdp_version") == 2:
                stage = 3 if f.get("fsdp_reshard_after_forward", True) else 2
            else:
                stage = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2}.get(sharding, 0)
            offload = bool(f.get("fsdp_offload_params", False))
            return cls("fsdp", stage, offload, offload, mp)
        return cls("ddp", 0, mixed_precision=mp)


@dataclass(frozen=True)
class PlanLine:
    name: str
    bytes: float
    how: str


@dataclass(frozen=True)
class MemoryPlan:
    lines: tuple[PlanLine, ...]
    budget_bytes: float
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> float:
        return sum(line.bytes for line in self.lines)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    def get(self, name: str) -> float:
        for line in self.lines:
            if line.name == name:
                return line.bytes
        raise KeyError(name)

    def render(self) -> str:
        width = max(len(line.name) for line in self.lines)
        out = [
            f"{line.name:<{width}}  {line.bytes / GB:8.2f} GB  {line.how}" for line in self.lines
        ]
        out.append(f"{'total':<{width}}  {self.total_bytes / GB:8.2f} GB")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        out.append(f"{'budget':<{width}}  {self.budget_bytes / GB:8.2f} GB  {verdict}")
        return "\n".join(out + list(self.notes))


def lora_parameters(cfg: TrainConfig, shape: ModelShape) -> int:
    """Trainable parameters of ``model.lora``: r x (in + out) per adapted linear layer."""
    lo = cfg.model.lora
    assert lo is not None
    targets = LINEARS if lo.target_modules == "all-linear" else tuple(lo.target_modules)
    unknown = [t for t in targets if t not in LINEARS]
    if unknown:
        raise DataError(
            f"the plan knows the linear layers {LINEARS}, not {unknown}",
            field="model.lora.target_modules",
        )
    shapes = shape.linear_shapes()
    per_layer = sum(lo.r * (shapes[t][0] + shapes[t][1]) for t in targets)
    layers = shape.num_hidden_layers if lo.top_layers is None else lo.top_layers
    return per_layer * layers


def model_shape_for(cfg: TrainConfig, root: Path = Path(".")) -> ModelShape:
    """The shape from ``plan.model_config``, else from ``model.name`` when it is a folder."""
    where = cfg.plan.model_config
    if where is None:
        if not (Path(cfg.model.name) / "config.json").is_file():
            raise DataError(
                f"the plan needs the model's config.json numbers, and model.name "
                f"{cfg.model.name!r} is not a local folder: set plan.model_config to a copy of "
                "its config.json (nothing is downloaded)",
                field="plan.model_config",
            )
        where = cfg.model.name
    p = Path(where)
    return ModelShape.from_config_json(p if p.is_absolute() or p.exists() else root / p)


def memory_plan(cfg: TrainConfig, shape: ModelShape, strategy: Strategy) -> MemoryPlan:
    """Peak bytes per training GPU for ``cfg`` (see the module docstring)."""
    if cfg.model.context_tokens is None:
        raise DataError(
            "the plan needs model.context_tokens: the longest prompt + completion (the data "
            "recipe's prompt.window_tokens)",
            field="model.context_tokens",
        )
    g, world = cfg.grpo, cfg.plan.gpus
    dtype = cfg.model.dtype
    half = dtype in ("auto", "bfloat16")  # auto is bf16 on a GPU
    w = 2 if half else 4
    deepspeed = strategy.name == "deepspeed"
    head = cfg.plan.ranking_head == "first_token"
    if head and deepspeed:
        raise DataError(
            f"plan.ranking_head first_token: the head's trainer takes its own optimizer step, "
            f"which DeepSpeed's engine would own (stage {strategy.stage}); plan and launch it "
            "with configs/accelerate/fsdp.yaml (FSDP2, the ZeRO-3 sharding) or "
            "configs/accelerate/ddp.yaml",
            field="plan.accelerate_config",
        )
    # The head's trainer under FSDP2 keeps float32 shards (its masters), float32 gradients and
    # moments, and computes in 16-bit from the gathered layers (memsifter.training.sharding).
    head_fsdp = head and strategy.name == "fsdp"
    total = shape.parameters
    trainable = total if cfg.model.lora is None else lora_parameters(cfg, shape)

    def shard(n: float, from_stage: int) -> float:
        return n / world if strategy.stage >= from_stage else n

    w_held = 4 if head_fsdp else w
    weights = 0.0 if strategy.offload_params else shard(total * w_held, 3)
    if cfg.model.lora is not None and not head_fsdp:
        weights += trainable * w  # the LoRA matrices, beside the frozen base
    lines = [
        PlanLine(
            "weights", weights, f"{total / 1e9:.3f}B params x {w_held} B, stage {strategy.stage}"
        ),
    ]
    if strategy.stage >= 3 and not strategy.offload_params:
        gathered = w * (2 * shape.layer_parameters + shape.embedding_parameters)
        lines.append(PlanLine("gathered weights", gathered, "2 layers + embedding, 16-bit"))
    lines.append(
        PlanLine("gradients", shard(trainable * w_held, 2), f"{trainable / 1e9:.3f}B trainable")
    )
    # DeepSpeed, and the head's DDP trainer for 16-bit weights, keep a float32 master copy
    # beside AdamW's two float32 moments; under FSDP2 the head's shards are the masters, so
    # only the moments; plain torch keeps the moments in the parameters' dtype.
    per_param = 8 if head_fsdp else 12 if deepspeed or (head and half) else 2 * w
    optim = 0.0 if strategy.offload_optimizer else shard(trainable * per_param, 1)
    lines.append(PlanLine("optimizer states", optim, f"AdamW, {per_param} B per trainable param"))

    b, s, c = g.per_device_train_batch_size, cfg.model.context_tokens, g.max_completion_length
    if head:  # a forward reads prompts, one per group of rankings, and writes nothing
        b, c = max(1, b // g.num_generations), 0
    a = w  # activations in the model's dtype
    h, n_layers = shape.hidden_size, shape.num_hidden_layers
    if (
        head
        and not head_fsdp
        and cfg.model.lora is not None
        and cfg.model.lora.top_layers is not None
    ):
        # The frozen trunk below the adapter runs without grad (HeadTrunk): only the adapted
        # layers keep activations for the backward (sharded, the trunk shortcut is off).
        n_layers = cfg.model.lora.top_layers
    per_token = shape.activation_values_per_token
    if cfg.model.gradient_checkpointing:
        lines.append(
            PlanLine(
                "checkpointed activations",
                b * s * h * n_layers * a,
                f"{b} x {s} tokens x {n_layers} layer inputs",
            )
        )
        lines.append(
            PlanLine(
                "recomputed layer",
                b * s * per_token * a,
                f"one layer, {per_token} values per token",
            )
        )
    else:
        lines.append(
            PlanLine(
                "activations",
                b * s * per_token * n_layers * a,
                f"{b} x {s} tokens x {n_layers} layers, no checkpointing",
            )
        )
    if head:
        lines.append(PlanLine("logits", 0.0, "the head reads its labels at one position"))
    else:
        lines.append(
            PlanLine(
                "logits",
                3 * b * c * shape.vocab_size * a,
                f"{b} x {c} completion tokens x {shape.vocab_size} vocab x 3",
            )
        )
    vllm = 0.0
    how = "not used"
    if g.use_vllm:
        if g.vllm_mode == "colocate":
            vllm = g.vllm_gpu_memory_utilization * cfg.plan.gpu_memory_gb * GB
            how = f"colocated, {g.vllm_gpu_memory_utilization} of the GPU"
        else:
            how = "server mode: on the rollout node"
    lines.append(PlanLine("vLLM", vllm, how))
    lines.append(PlanLine("reserve", cfg.plan.reserve_gb * GB, "CUDA context, NCCL, fragmentation"))

    notes = []
    native = shape.max_position_embeddings
    if native is not None and s > native and cfg.model.rope_scaling is None:
        notes.append(
            f"warning: model.context_tokens {s} is beyond the model's "
            f"max_position_embeddings {native} and model.rope_scaling is not set"
        )
    if native is not None and s <= native and cfg.model.rope_scaling is not None:
        notes.append(
            f"warning: model.rope_scaling is set, but the model's max_position_embeddings "
            f"{native} already holds model.context_tokens {s}: YaRN is not needed here and "
            "changes every position the model was trained with"
        )
    return MemoryPlan(tuple(lines), cfg.plan.gpu_memory_gb * GB, tuple(notes))


def batch_lines(cfg: TrainConfig) -> list[str]:
    """Completions, prompts and tokens per optimiser step and per generation round."""
    g, world = cfg.grpo, cfg.plan.gpus
    per_step = g.per_device_train_batch_size * g.gradient_accumulation_steps * world
    spg = g.steps_per_generation or g.gradient_accumulation_steps
    per_round = g.per_device_train_batch_size * spg * world
    s = cfg.model.context_tokens
    return [
        f"processes: {world} training GPU(s), strategy from {cfg.plan.accelerate_config}",
        f"optimiser step: {per_step} completions = {per_step / g.num_generations:g} prompts x "
        f"{g.num_generations}, up to {per_step * (s or 0):,} tokens",
        f"generation round: {per_round} completions ({spg} micro-steps of "
        f"{g.per_device_train_batch_size} per GPU)",
    ]


def base_line(cfg: TrainConfig, shape: ModelShape) -> str:
    """Which base the plan assumed (the config.json it read) and whether its positions reach the
    window natively or through the recipe's rope scaling."""
    where = cfg.plan.model_config or cfg.model.name
    native, s = shape.max_position_embeddings, cfg.model.context_tokens
    theta = f", rope_theta {shape.rope_theta:,.0f}" if shape.rope_theta else ""
    rope = cfg.model.rope_scaling
    if rope is not None:
        reach = (
            f"{rope['rope_type']} x{rope.get('factor', 1):g} from "
            f"{rope.get('original_max_position_embeddings', native)} positions"
        )
    elif native is not None and s is not None and s <= native:
        reach = "natively, no rope scaling"
    else:
        reach = "NOT reached: no rope scaling is set"
    return (
        f"base: {cfg.model.name} (config {where}: max_position_embeddings {native}{theta}); "
        f"the {s}-token window is reached {reach}"
    )


# The cards a plan is read against: an H100 / A100 80 GB and an H200 141 GB.
CARDS_GB = (80.0, 141.0)


def layout_lines(cfg: TrainConfig) -> list[str]:
    """The roles on a one-node layout and the GPUs they take."""
    p = cfg.plan
    if p.node_gpus is None:
        return ["layout: roles on separate machines (scripts/train_multinode.sh)"]
    return [
        f"layout: one node of {p.node_gpus} GPUs: {p.gpus} training + {p.rollout_gpus} rollout "
        f"+ {p.answerer_gpus} answerer = {p.role_gpus}"
    ]


def check_layout(cfg: TrainConfig, processes: int, visible: int) -> None:
    """A one-node layout's roles against what this run sees: as many training processes as
    planned, and every role's GPUs on the node. Refused with the arithmetic, before any model
    loads."""
    p = cfg.plan
    if p.node_gpus is None:
        return
    if processes != p.gpus:
        raise DataError(
            f"the one-node layout plans {p.gpus} training processes (plan.gpus) but "
            f"{processes} were launched: launch accelerate with --num_processes {p.gpus}",
            field="plan.gpus",
        )
    if visible < p.role_gpus:
        raise DataError(
            f"the one-node layout needs {p.role_gpus} GPUs ({p.gpus} training + "
            f"{p.rollout_gpus} rollout + {p.answerer_gpus} answerer) but this machine shows "
            f"{visible}",
            field="plan.node_gpus",
        )


def plan_report(cfg: TrainConfig, root: Path = Path(".")) -> tuple[str, MemoryPlan]:
    """The text ``memsifter train --plan`` prints, and the plan."""
    shape = model_shape_for(cfg, root)
    accel = Path(cfg.plan.accelerate_config)
    strategy = Strategy.from_accelerate_config(accel if accel.is_absolute() else root / accel)
    plan = memory_plan(cfg, shape, strategy)
    cards = ", ".join(
        f"{gb:g} GB: {'fits' if plan.total_bytes <= gb * GB else 'does NOT fit'}" for gb in CARDS_GB
    )
    head = (
        batch_lines(cfg)
        + layout_lines(cfg)
        + [
            f"trainer: {cfg.plan.ranking_head} head",
            f"model: {cfg.model.name}, {shape.parameters / 1e9:.3f}B parameters, "
            f"{cfg.model.context_tokens} tokens per sequence"
            + (f", rope {cfg.model.rope_scaling['rope_type']}" if cfg.model.rope_scaling else ""),
            base_line(cfg, shape),
            f"memory per GPU ({strategy.name}, stage {strategy.stage}):",
        ]
    )
    text = "\n".join(head) + "\n" + plan.render() + f"\nper card: {cards}"
    return text, plan
