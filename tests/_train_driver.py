"""Run by ``tests/test_train_distributed.py`` under ``accelerate launch``: ``run_training`` with
probes that record, per process, what the test compares across processes.

Probes (``PROBES/rank-N.json``, rewritten after every event, so a killed process leaves its
record): the sha256 of every policy the process loads (its in-memory weights, as GRPO starts
from them), every dynamic-sampling decision (the zero-std flags of each gathered batch, and each
refill round), and how often the process validated, averaged, re-scored the curriculum and wrote
``run_state.json``. ``--kill-after-step N`` ends every process right after checkpoint-N is saved
(a crash: no clean shutdown), once every process has reached it.

Usage: ``accelerate launch ... tests/_train_driver.py CONFIG PROBES [--kill-after-step N]``.
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

    mark = loop.RunState.mark

    def counted_mark(self: Any, key: str, value: Any = True) -> None:
        if self.writer:
            record["calls"]["state_writes"] += 1
            dump()
        mark(self, key, value)

    spec_callback = loop.spec_callback

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
    validation.validate = counted("validate", validation.validate)
    averaging.average_checkpoints = counted("average", averaging.average_checkpoints)
    loop.rescore_curriculum = counted("rescore", loop.rescore_curriculum)
    loop.RunState.mark = counted_mark  # type: ignore[method-assign]
    if args.kill_after_step is not None:
        loop.spec_callback = killing_spec_callback

    dump()
    cfg = load_train_config(args.config)
    summary = loop.run_training(cfg, log=lambda m: print(f"[rank {rank}] {m}", flush=True))
    record["model"] = summary["model"]
    dump()


if __name__ == "__main__":
    main()
