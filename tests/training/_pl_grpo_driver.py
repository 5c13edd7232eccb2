"""Run by ``tests/training/test_pl_grpo_distributed.py`` under ``accelerate launch`` (gloo on CPU):
the first-token head's Plackett–Luce GRPO trainer for a few steps on the memory gym, as the epoch
loop builds it (its processes from :func:`memsifter.training.distributed.start_processes`).
The main process writes the trained weights and the step log to ``OUT``.

Usage: ``accelerate launch ... tests/training/_pl_grpo_driver.py DATA PROXY OUT [KEY=VALUE ...]``;
``resume=CHECKPOINT`` among them resumes from that checkpoint. Under FSDP the weights written are
the gathered full ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import torch
    from datasets import load_dataset

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.config import load_train_config
    from memsifter.training.distributed import start_processes
    from memsifter.training.pl_grpo import PLGRPOTrainer

    data, proxy, out, *overrides = sys.argv[1:]
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    overrides = [o for o in overrides if not o.startswith("resume=")]
    root = Path(__file__).resolve().parents[2]
    cfg = load_train_config(
        root / "configs/train/gym_pl_outcome.yaml",
        [f"output_dir={out}/run", f"data={data}", f"model.name={proxy}", *overrides],
    )
    procs = start_processes(cfg.barrier_timeout_s)
    train = load_dataset("parquet", data_files=f"{data}/train.parquet", split="train")
    fn = make_reward_function(RewardService.from_config(load_reward_config(root / cfg.reward)))
    fn.set_total_steps(cfg.epochs.max_steps)
    trainer = PLGRPOTrainer(cfg, proxy, train, fn, Path(cfg.output_dir), log=lambda _: None,
                            procs=procs)  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    if trainer.root is not None:  # sharded: gathered (collective)
        from memsifter.training.sharding import full_state

        weights = full_state(trainer.root)
    else:
        weights = {n: p.detach() for n, p in trainer.model.named_parameters()}
    if procs.is_main:
        torch.save(weights, f"{out}/w.pt")
        Path(f"{out}/log.json").write_text(json.dumps(trainer.state.log_history))
        local = {n: type(p).__name__ for n, p in trainer.model.named_parameters()}
        facts = {"world": procs.world, "sharded": trainer.root is not None, "params": local,
                 "reference_copy": trainer.ref is not None}  # fmt: skip
        Path(f"{out}/run.json").write_text(json.dumps(facts))
    procs.barrier()


if __name__ == "__main__":
    main()
