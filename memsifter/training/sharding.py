"""Fully sharded data parallelism (PyTorch FSDP2) for the first-token head's trainer.

``accelerate launch --config_file configs/accelerate/fsdp.yaml`` sets ``ACCELERATE_USE_FSDP``; the
head's trainer (:mod:`memsifter.training.pl_grpo`) then shards its model the ZeRO-3 way instead
of holding a whole copy per process: every decoder layer is its own FSDP2 unit (all-gathered for
its forward and backward, resharded after), and a :class:`ScoringRoot` around the model holds the
rest (embeddings, final norm, the LM head, tied or not). The head's forward reads the LM head's
label rows directly (``memsifter.ranker.first_token``), outside the model's own ``forward``; the
root unit's forward is that read, so those weights are whole while it runs and their gradients
are reduce-scattered with the rest.

What sharding changes in the trainer, and why:

* the parameters are float32 shards, and ``MixedPrecisionPolicy(param_dtype=<the config's
  dtype>, reduce_dtype=float32)`` computes in the config's dtype: the shards *are* the float32
  masters, so AdamW steps them directly (no separate copies);
* gradients are averaged by FSDP's reduce-scatter, not by the trainer's all-reduce;
* checkpoints are gathered to full (rank 0 writes ``model.safetensors`` or the adapter, and a
  full optimizer state), so averaging, ``memsifter merge`` and vLLM read them as before, and a
  resume scatters them again;
* the frozen-trunk shortcut (LoRA on the top layers) is off: its hooks read layers outside any
  unit's forward. Every step runs the whole forward, as without LoRA.

Refused by name, before any model loads: FSDP1 (``fsdp_version: 1``), parameter offload, and
DeepSpeed (its engine owns the optimizer step this trainer takes itself; FSDP2 is the sharded
path).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from memsifter.errors import DataError


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def fsdp_requested() -> bool:
    """Whether this process was launched for FSDP (accelerate's ``distributed_type: FSDP``)."""
    return _flag("ACCELERATE_USE_FSDP")


def check_launch(distributed: bool) -> bool:
    """Whether the head's trainer shards its model in this launch; refuses what it cannot do,
    naming the accelerate setting."""
    if not distributed:
        return False
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        raise DataError(
            "ranking_head: first_token's trainer takes its own optimizer step, which DeepSpeed's "
            "engine would own; for a sharded model launch it with --config_file "
            "configs/accelerate/fsdp.yaml (FSDP2, the same ZeRO-3 sharding), or "
            "configs/accelerate/ddp.yaml",
            field="plan.accelerate_config",
        )
    if not fsdp_requested():
        return False
    version = os.environ.get("FSDP_VERSION", "1")  # accelerate's default
    if version != "2":
        raise DataError(
            f"ranking_head: first_token's trainer shards with FSDP2; this launch asks for "
            f"fsdp_version {version}: set fsdp_version: 2 (configs/accelerate/fsdp.yaml)",
            field="plan.accelerate_config",
        )
    if _flag("FSDP_OFFLOAD_PARAMS"):
        raise DataError(
            "ranking_head: first_token's trainer does not offload parameters to the CPU: set "
            "fsdp_offload_params: false (configs/accelerate/fsdp.yaml)",
            field="plan.accelerate_config",
        )
    return True


@functools.cache  # one class, however many models are sharded (the policy and its reference)
def _root_class() -> type:
    import torch

    class ScoringRoot(torch.nn.Module):
        """The root FSDP unit: its forward is the head's scores (every read of the model's
        weights happens inside it)."""

        def __init__(self, lm: Any) -> None:
            super().__init__()
            self.lm = lm

        def forward(
            self, tokenizer: Any, prompts: Sequence[str], ns: Sequence[int], labels: str, read: str
        ) -> Any:
            from memsifter.ranker.first_token import head_scores

            return head_scores(self.lm, tokenizer, prompts, ns, labels=labels, read=read)

    return ScoringRoot


def shard(model: Any, compute_dtype: Any) -> Any:
    """``model`` (a causal LM, PEFT-wrapped or not) sharded in place, float32 shards computing in
    ``compute_dtype``; returns the root unit whose call gives the head's scores."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from memsifter.ranker.first_token import decoder_layers

    model.float()
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # fsdp_reshard_after_forward: false keeps each layer gathered until its backward (ZeRO-2's
    # memory, less communication).
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    root = _root_class()(model)
    fully_shard(root, mp_policy=policy)
    return root


PREFIX = "lm."


def full_state(root: Any) -> dict[str, Any]:
    """The whole model's weights on the CPU, by the model's own names (collective: every process
    calls it; rank 0 gets the tensors, the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(root, options=options)
    return {k.removeprefix(PREFIX): v for k, v in state.items()}


def load_full_state(root: Any, state: Mapping[str, Any]) -> None:
    """Rank 0's full weights (by the model's names; the others pass anything) broadcast and
    scattered into every process's shards (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(root, {PREFIX + k: v for k, v in state.items()}, options=options)


def full_optimizer_state(root: Any, optimizer: Any) -> dict[str, Any]:
    """AdamW's state gathered to full, by parameter names (collective; rank 0 gets it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(root, optimizer, options=options)


def load_full_optimizer_state(root: Any, optimizer: Any, state: Mapping[str, Any]) -> None:
    """Rank 0's full optimizer state scattered into every process's (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(root, optimizer, optim_state_dict=dict(state), options=options)


def optimizer_state_for(
    saved: Mapping[str, Any], names: Sequence[str], sharded: bool, where: str
) -> dict[str, Any]:
    """A checkpoint's ``optimizer.pt`` in the form this run loads, whichever run wrote it. A
    sharded run writes the full state by parameter name (``PREFIX`` + the model's names); an
    unsharded one writes torch's own, by position among its trainable parameters, whose names
    in order are ``names``. So a run sharded over 8 GPUs resumes on one, and the reverse; a
    state that names other parameters is refused by name."""
    groups = list(saved.get("param_groups") or ())
    state = dict(saved.get("state") or {})
    keys = [*state, *(p for g in groups for p in g.get("params", ()))]
    by_name = any(isinstance(k, str) for k in keys)
    if len(groups) != 1:
        raise DataError(
            f"cannot resume from {where}: its optimizer state has {len(groups)} parameter "
            "groups, and this trainer's AdamW has one"
        )
    want = [PREFIX + n for n in names] if by_name else list(range(len(names)))
    have = list(groups[0].get("params", ()))
    if sorted(map(str, have)) != sorted(map(str, want)):
        missing = sorted(set(map(str, want)) - set(map(str, have)))
        raise DataError(
            f"cannot resume from {where}: its optimizer state holds {len(have)} parameters and "
            f"this run trains {len(names)}"
            + (f" (not there: {missing[0].removeprefix(PREFIX)})" if missing else "")
            + ": a checkpoint of another model, adapter or set of trained layers"
        )
    if by_name == sharded:
        return dict(saved)
    if by_name:  # a sharded run's, into torch's positions
        position = {PREFIX + n: i for i, n in enumerate(names)}
        return {
            "state": {position[k]: v for k, v in state.items()},
            "param_groups": [{**groups[0], "params": list(range(len(names)))}],
        }
    named = [PREFIX + n for n in names]  # an unsharded run's, by name for the scatter
    return {
        "state": {named[int(i)]: v for i, v in state.items()},
        "param_groups": [{**groups[0], "params": named}],
    }


def adapter_into(state: dict[str, Any], adapter: Mapping[str, Any], name: str) -> None:
    """A saved PEFT adapter's tensors (its file's names carry no adapter name) written into a
    full state by the model's names (``….lora_A.<name>.weight``); refuses one that does not fit."""
    by_file = {k.replace(f".{name}.", "."): k for k in state if f".{name}." in k}
    missing = sorted(set(adapter) - set(by_file))
    if missing:
        raise DataError(
            f"the saved adapter has {len(missing)} tensors this model has no place for "
            f"(first: {missing[0]})"
        )
    for key, value in adapter.items():
        state[by_file[key]] = value


__all__ = [
    "adapter_into",
    "check_launch",
    "fsdp_requested",
    "full_optimizer_state",
    "full_state",
    "load_full_optimizer_state",
    "load_full_state",
    "optimizer_state_for",
    "shard",
]
