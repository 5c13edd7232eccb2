"""The whole training run on a tiny random Qwen3 (proxy and working LLM): RL data -> cold-start
SFT -> two GRPO epochs with dynamic sampling -> validation of every checkpoint -> averaging ->
the next epoch starts from the average; then a rerun resumes instead of retraining, and a run
killed after a checkpoint resumes from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from safetensors.torch import load_file  # noqa: E402

from memsifter.training.config import (  # noqa: E402
    DynamicSamplingSettings,
    EpochSettings,
    GRPOSettings,
    ModelSettings,
    SFTSettings,
    TrackingSettings,
    TrainConfig,
)
from memsifter.training.rl_data import RLDataConfig, SourceConfig, prepare_rl_data  # noqa: E402


def _reward_yaml(path: Path, model: Path) -> Path:
    path.write_text(
        "max_k: 3\nbeta0: 0.5\ndecay_steps: 4\n"
        f"answerer:\n  model: {model}\n  window_tokens: 512\n  max_new_tokens: 8\n"
        "  batch_size: 4\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def run(tiny_qwen3: Path, locomo_mini_path: Path, tmp_path_factory: pytest.TempPathFactory):
    from memsifter.training.loop import run_training

    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp("train")
    recipe = RLDataConfig(
        sources=[
            SourceConfig(
                name="locomo",
                path=str(locomo_mini_path),
                count=4,
                train_conversations=[0, 1],
                heldout_conversations=[2],
            )
        ],
        model=str(tiny_qwen3),
        window_tokens=640,
        completion_tokens=32,
        unit="page",
        turns_per_page=2,
    )
    prepare_rl_data(recipe, tmp / "rl")
    cfg = TrainConfig(
        output_dir=str(tmp / "out"),
        data=str(tmp / "rl"),
        reward=str(_reward_yaml(tmp / "reward.yaml", tiny_qwen3)),
        model=ModelSettings(name=str(tiny_qwen3)),
        sft=SFTSettings(enabled=True, epochs=1, per_device_train_batch_size=2),
        grpo=GRPOSettings(
            num_generations=2,
            max_completion_length=12,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
        ),
        dynamic_sampling=DynamicSamplingSettings(enabled=True, max_extra_rounds=1),
        epochs=EpochSettings(
            epochs=2,
            max_steps=2,
            save_steps=1,
            top_k=2,
            select_metric="reward",
            validation_max_questions=2,
        ),
        tracking=TrackingSettings(backend="none"),
        threads=1,
    )
    logs: list[str] = []
    summary = run_training(cfg, log=logs.append)
    return cfg, summary, logs


@pytest.mark.slow
def test_epochs_validate_average_and_chain(run) -> None:
    cfg, summary, logs = run
    out = Path(cfg.output_dir)
    assert (out / "sft" / "final" / "config.json").exists()
    for epoch in (0, 1):
        edir = out / f"epoch-{epoch}"
        assert sorted(p.name for p in edir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
        results = json.loads((edir / "validation.json").read_text())
        assert set(results) == {"start", "checkpoint-1", "checkpoint-2"}
        assert all(r["questions"] == 2 for r in results.values())
        assert (edir / "rankings" / "checkpoint-1.jsonl").exists()
        # The average is the element-wise mean of the two checkpoints (top_k=2 of 2).
        avg = load_file(edir / "averaged" / "model.safetensors")
        a = load_file(edir / "checkpoint-1" / "model.safetensors")
        b = load_file(edir / "checkpoint-2" / "model.safetensors")
        for name in avg:
            torch.testing.assert_close(avg[name], (a[name] + b[name]) / 2)
    # Epoch 0 starts from the SFT model, epoch 1 from epoch 0's average.
    starts = [line for line in logs if "GRPO from" in line]
    assert "sft/final" in starts[0] and "epoch-0/averaged" in starts[1]
    assert summary["model"].endswith("epoch-1/averaged")
    assert (out / "curves.png").stat().st_size > 0
    assert "| 1 | checkpoint-2 |" in (out / "report.md").read_text()
    history = json.loads((out / "epoch-0" / "trainer_state.json").read_text())["log_history"]
    logged = {k for row in history for k in row}
    assert {"reward/beta", "reward/parse_rate", "dynamic_sampling/effective_groups"} <= logged
    # The warm-up decays over the run, not per epoch: beta0 0.5 over 4 steps, 2 steps an epoch.
    betas = []
    for epoch in (0, 1):
        rows = json.loads((out / f"epoch-{epoch}" / "trainer_state.json").read_text())
        betas += [row["reward/beta"] for row in rows["log_history"] if "reward/beta" in row]
    assert betas == pytest.approx([0.5, 0.375, 0.25, 0.125])


@pytest.mark.slow
def test_rerun_resumes_instead_of_retraining(run) -> None:
    from memsifter.training.loop import run_training

    cfg, summary, _ = run
    out = Path(cfg.output_dir)
    logs: list[str] = []
    again = run_training(cfg, log=logs.append)
    assert again["model"] == summary["model"]
    assert not any("GRPO from" in line or "cold-start" in line for line in logs)

    # Kill epoch 1 after its first checkpoint: its state, later checkpoints and results go.
    state = json.loads((out / "run_state.json").read_text())
    del state["epoch-1"]
    (out / "run_state.json").write_text(json.dumps(state))
    edir = out / "epoch-1"
    for name in ("checkpoint-2", "averaged"):
        shutil.rmtree(edir / name)
    (edir / "validation.json").unlink()
    logs.clear()
    resumed = run_training(cfg, log=logs.append)
    assert any("resuming" in line and "checkpoint-1" in line for line in logs), logs
    assert (edir / "checkpoint-2").exists() and resumed["model"] == summary["model"]
    history = json.loads((edir / "trainer_state.json").read_text())
    assert history["global_step"] == 2
