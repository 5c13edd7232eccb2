"""Run by ``tests/training/test_pl_grpo_distributed.py`` under ``accelerate launch`` (gloo on CPU):
the first-token head's Plackett–Luce GRPO trainer for a few steps on the memory gym, as the epoch
loop builds it (its processes from :func:`memsifter.training.distributed.start_processes`).
The main process writes the trained weights and the step log to ``OUT``.

Usage: ``accelerate launch ... tests/training/_pl_grpo_driver.py DATA PROXY OUT [KEY=VALUE ...]``.
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
    trainer.train()
    if procs.is_main:
        torch.save({n: p.detach() for n, p in trainer.model.named_parameters()}, f"{out}/w.pt")
        Path(f"{out}/log.json").write_text(json.dumps(trainer.state.log_history))
    procs.barrier()


if __name__ == "__main__":
    main()
