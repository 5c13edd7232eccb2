"""Run by ``tests/training/test_train_distributed.py`` under ``accelerate launch``: ``run_training``
with probes that record, per process, what the test compares across processes.

Probes (``PROBES/rank-N.json``, rewritten after every event, so a killed process leaves its
record): the sha256 of every policy the process loads (its in-memory weights, as GRPO starts
from them), every dynamic-sampling decision (the zero-std flags of each gathered batch, each
refill round, and per generation step the plan of which process trains which group, a
fingerprint of every row the process generated in each round and of every row it was handed to
train), and how often the process validated, averaged, re-scored the curriculum and wrote
``run_state.json``. ``--kill-after-step N`` ends every process right after checkpoint-N is saved
(a crash: no clean shutdown), once every process has reached it.

The tiny random model's rankings all get the same reward, so every group would be flat. A second
reward function (``spread_reward``) gives the groups of half the questions (by a hash of the
qid) a spread that depends on the completion text, so steps mix flat and informative groups and
dynamic sampling has real choices to agree on.

Usage: ``accelerate launch ... tests/training/_train_driver.py CONFIG PROBES [--kill-after-step
N]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any


def _weights_sha256(model: Any) -> str:
    """The exact bytes of every tensor, by name: equal only for bit-identical weights."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def spread_reward(completions: list[Any], qid: list[str], **_: Any) -> list[float]:
    """0 for every completion of a question whose qid hashes even (a flat group); otherwise a
    value from a hash of the completion's text (a spread whenever the completions differ)."""
    import zlib

    from memsifter.rewards.trl import completion_text

    return [
        0.0 if zlib.crc32(q.encode()) % 2 == 0 else zlib.crc32(completion_text(c).encode()) / 2**32
        for c, q in zip(completions, qid, strict=True)
    ]


def _fingerprint(batch: dict[str, Any], row: int, pad_id: int) -> str:
    """A row's prompt tokens, completion tokens (trailing padding stripped) and advantage: equal
    for a row and its copy on another process, whatever the padding width."""
    prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
    completion = batch["completion_ids"][row].tolist()
    while completion and completion[-1] == pad_id:
        completion.pop()
    advantage = round(float(batch["advantages"][row]), 5)
    return hashlib.sha256(json.dumps([prompt, completion, advantage]).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("probes")
    parser.add_argument("--kill-after-step", type=int, default=None)
    args = parser.parse_args()

    import memsifter.training.averaging as averaging
    import memsifter.training.dynamic_sampling as ds
    import memsifter.training.grpo as grpo
    import memsifter.training.loop as loop
    import memsifter.training.validation as validation
    from memsifter.training.config import load_train_config

    rank = int(os.environ["RANK"])
    probes = Path(args.probes)
    probes.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "rank": rank,
        "loads": [],
        "zero_std": [],
        "refills": [],
        "steps": [],
        "calls": {"validate": 0, "average": 0, "rescore": 0, "state_writes": 0},
    }

    def dump() -> None:
        path = probes / f"rank-{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        tmp.replace(path)

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            record["calls"][name] += 1
            dump()
            return fn(*a, **k)

        return wrapper

    load_policy = grpo.load_policy

    def hashed_load_policy(cfg: Any, model_path: str, cuda: bool) -> Any:
        model, tok, peft = load_policy(cfg, model_path, cuda)
        record["loads"].append({"model": str(model_path), "sha256": _weights_sha256(model)})
        dump()
        return model, tok, peft

    zero_std_groups = ds.zero_std_groups

    def recorded_zero_std(rewards: Any, num_generations: int, min_std: float) -> Any:
        flat = zero_std_groups(rewards, num_generations, min_std)
        record["zero_std"].append(flat.tolist())
        dump()
        return flat

    refill = ds.DynamicSamplingGRPOTrainer._refill_inputs

    def recorded_refill(self: Any, n_rows: int, round_: int) -> Any:
        rows = refill(self, n_rows, round_)
        record["refills"].append([self.state.global_step, round_, [r["qid"] for r in rows]])
        dump()
        return rows

    reward_funcs = grpo.reward_funcs

    def spread_reward_funcs(cfg: Any, reward_fn: Any) -> Any:
        funcs, weights = reward_funcs(cfg, reward_fn)
        return funcs + [spread_reward], None if weights is None else [*weights, 1.0]

    trainer_cls = ds.DynamicSamplingGRPOTrainer
    generate = trainer_cls._generate_and_score_completions
    score_round = trainer_cls._score_round
    planned_batch = trainer_cls._planned_batch
    assign_groups = ds.assign_groups

    def recorded_generate(self: Any, inputs: Any) -> Any:
        if self.model.training:
            record["steps"].append({"generated": [], "plan": None, "trained": None})
        return generate(self, inputs)

    def recorded_score_round(self: Any, inputs: Any) -> Any:
        rnd = score_round(self, inputs)
        pad = self._tokenizer.pad_token_id
        fps = [_fingerprint(rnd.batch, i, pad) for i in range(len(inputs))]
        record["steps"][-1]["generated"].append(fps)
        dump()
        return rnd

    def recorded_assign(groups: Any, per_process: int, world: int) -> Any:
        plan = assign_groups(groups, per_process, world)
        record["steps"][-1]["plan"] = [[list(ref) for ref in refs] for refs in plan]
        return plan

    def recorded_planned_batch(self: Any, rounds: Any, plan: Any, trained: Any) -> Any:
        batch, keep = planned_batch(self, rounds, plan, trained)
        pad = self._tokenizer.pad_token_id
        rows = range(len(keep))
        record["steps"][-1]["trained"] = [_fingerprint(batch, i, pad) for i in rows]
        record["steps"][-1]["keep"] = keep.tolist()
        dump()
        return batch, keep

    mark = loop.RunState.mark

    def counted_mark(self: Any, key: str, value: Any = True) -> None:
        if self.writer:
            record["calls"]["state_writes"] += 1
            dump()
        mark(self, key, value)

    spec_callback = grpo.spec_callback

    def killing_spec_callback(spec: Any) -> Any:
        from transformers import TrainerCallback

        inner = spec_callback(spec)

        class _KillAfter(TrainerCallback):
            def on_save(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
                inner.on_save(a, state, control, **kwargs)
                if state.global_step == args.kill_after_step:
                    import torch.distributed as dist

                    dist.barrier()  # checkpoint and spec are on disk on every process
                    dump()
                    os._exit(17)  # a crash: no cleanup, no state write

        return _KillAfter()

    grpo.load_policy = hashed_load_policy
    ds.zero_std_groups = recorded_zero_std
    ds.DynamicSamplingGRPOTrainer._refill_inputs = recorded_refill  # type: ignore[method-assign]
    ds.assign_groups = recorded_assign
    trainer_cls._generate_and_score_completions = recorded_generate  # type: ignore[method-assign]
    trainer_cls._score_round = recorded_score_round  # type: ignore[method-assign]
    trainer_cls._planned_batch = recorded_planned_batch  # type: ignore[method-assign]
    grpo.reward_funcs = spread_reward_funcs
    validation.validate = counted("validate", validation.validate)
    averaging.average_checkpoints = counted("average", averaging.average_checkpoints)
    loop.rescore_curriculum = counted("rescore", loop.rescore_curriculum)
    loop.RunState.mark = counted_mark  # type: ignore[method-assign]
    if args.kill_after_step is not None:
        grpo.spec_callback = killing_spec_callback

    dump()
    cfg = load_train_config(args.config)
    summary = loop.run_training(cfg, log=lambda m: print(f"[rank {rank}] {m}", flush=True))
    record["model"] = summary["model"]
    dump()


if __name__ == "__main__":
    main()
