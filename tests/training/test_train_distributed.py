"""The epoch loop with two processes: ``accelerate launch`` (torchrun underneath, gloo on CPU) runs
``tests/training/_train_driver.py`` on a tiny random Qwen3 through cold-start SFT, a GRPO epoch with
dynamic sampling that is killed after its first checkpoint, a relaunch that resumes it,
validation, averaging, the curriculum's re-score and the next epoch.

What it proves: the run finishes and its state says so; validation, averaging, the re-score and
``run_state.json`` writes happened on the main process only (so once); both processes loaded
bit-identical weights at the start of every epoch, the averaged start included (hashes of the
in-memory models, per process); both made the same dynamic-sampling decisions over groups that
differ (a completion-dependent reward double for half the questions), and each trained exactly
the rows the shared plan gave it, including groups the other process generated; the relaunch
resumed from the killed epoch's checkpoint instead of starting it again.

``accelerate launch --cpu`` starts a single process in accelerate 1.x (more CPU processes go
through mpirun), so the test launches ``--multi_gpu`` with no GPU visible: torchrun starts the
processes and accelerate picks gloo."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

pytest.importorskip("trl")

from memsifter.testing.launch import accelerate_launch  # noqa: E402
from memsifter.testing.rl import tiny_locomo_recipe  # noqa: E402
from memsifter.training.config import (  # noqa: E402
    DynamicSamplingSettings,
    EpochSettings,
    GRPOSettings,
    ModelSettings,
    SFTSettings,
    TrackingSettings,
    TrainConfig,
)
from memsifter.training.rldata.build import prepare_rl_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "training" / "_train_driver.py"
WORLD = 2


def _launch(config: Path, probes: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return accelerate_launch(DRIVER, [str(config), str(probes), *extra], processes=WORLD, root=ROOT)


def _probes(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def runs(tiny_qwen3: Path, locomo_mini_path: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("dist")
    recipe = tiny_locomo_recipe(tiny_qwen3, locomo_mini_path, completion_tokens=16)
    prepare_rl_data(recipe, tmp / "rl")
    reward = tmp / "reward.yaml"
    reward.write_text(
        "max_k: 2\nbeta0: 0.5\ndecay_steps: 4\n"
        f"answerer:\n  model: {tiny_qwen3}\n  window_tokens: 384\n  max_new_tokens: 4\n",
        encoding="utf-8",
    )
    cfg = TrainConfig(
        output_dir=str(tmp / "out"),
        data=str(tmp / "rl"),
        reward=str(reward),
        model=ModelSettings(name=str(tiny_qwen3)),
        sft=SFTSettings(enabled=True, epochs=1, per_device_train_batch_size=2, max_examples=4),
        # One group of 2 completions per process and step: the global batch is 2 prompts.
        grpo=GRPOSettings(
            num_generations=2,
            max_completion_length=8,
            per_device_train_batch_size=2,
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
            validation_max_new_tokens=8,
        ),
        tracking=TrackingSettings(backend="none"),
        threads=1,
        barrier_timeout_s=600,
    )
    config = tmp / "train.yaml"
    config.write_text(yaml.safe_dump(asdict(cfg), sort_keys=False), encoding="utf-8")
    killed = _launch(config, tmp / "probes-killed", "--kill-after-step", "1")
    resumed = _launch(config, tmp / "probes-resumed")
    return cfg, killed, resumed, tmp


@pytest.mark.slow
def test_two_processes_finish_and_resume_after_a_kill(runs) -> None:
    cfg, killed, resumed, tmp = runs
    out = Path(cfg.output_dir)
    assert killed.returncode != 0, "the first launch was to be killed after checkpoint-1"
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    # The killed launch got through SFT and epoch 0's first checkpoint, nothing further.
    assert (out / "sft" / "final" / "config.json").is_file()
    lines = resumed.stdout.splitlines()
    assert not any("cold-start SFT" in line for line in lines)  # SFT was not redone
    resuming = [line for line in lines if "resuming" in line]
    assert resuming and "epoch-0/checkpoint-1" in resuming[0], lines
    assert all(line.startswith("[rank 0]") for line in lines if "GRPO from" in line)  # one log
    state = json.loads((out / "run_state.json").read_text())
    assert state["epoch-0"]["steps"] == 2 and state["epoch-1"]["steps"] == 2
    for epoch in (0, 1):
        edir = out / f"epoch-{epoch}"
        assert sorted(p.name for p in edir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
        results = json.loads((edir / "validation.json").read_text())
        assert set(results) == {"start", "checkpoint-1", "checkpoint-2", "averaged"}
        assert all(r["questions"] == 2 for r in results.values())
        assert (edir / "averaged" / "averaging.json").is_file()
    assert (out / "epoch-1" / "curriculum" / "train.parquet").is_file()
    assert (out / "summary.json").is_file() and (out / "report.md").is_file()
    # No half-written leftovers from two writers racing.
    assert not list(out.rglob(".*partial*")) and not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_only_the_main_process_validates_averages_and_writes_state(runs) -> None:
    _, _, _, tmp = runs
    main, other = _probes(tmp / "probes-resumed")
    assert other["calls"] == {"validate": 0, "average": 0, "rescore": 0, "state_writes": 0}
    # Per epoch: start, two checkpoints and the average validated; one average; one re-score
    # (before epoch 1); state written after training and after averaging, per epoch.
    assert main["calls"] == {"validate": 8, "average": 2, "rescore": 1, "state_writes": 4}
    killed_main, killed_other = _probes(tmp / "probes-killed")
    assert killed_other["calls"]["state_writes"] == 0
    assert killed_main["calls"]["state_writes"] == 1  # SFT done; killed before epoch 0's end


@pytest.mark.slow
def test_every_process_starts_each_epoch_from_identical_weights(runs) -> None:
    cfg, _, _, tmp = runs
    out = Path(cfg.output_dir)
    main, other = _probes(tmp / "probes-resumed")
    # Epoch 0 (resumed) from the SFT model, epoch 1 from what epoch 0 carried forward.
    state = json.loads((out / "run_state.json").read_text())
    models = [load["model"] for load in main["loads"]]
    assert models == [str(out / "sft" / "final"), state["epoch-0"]["next"]]
    assert main["loads"] == other["loads"]  # same folders, bit-identical weights
    assert main["loads"][0]["sha256"] != main["loads"][1]["sha256"]  # training changed them
    assert main["model"] == other["model"] == state["epoch-1"]["next"]
    killed_main, killed_other = _probes(tmp / "probes-killed")
    assert killed_main["loads"] == killed_other["loads"] and len(killed_main["loads"]) == 1


@pytest.mark.slow
def test_dynamic_sampling_decisions_agree_across_processes(runs) -> None:
    """Both processes judge the same gathered groups, make the same plan, and each trains
    exactly the rows the plan gives it, generated by whichever process (row fingerprints)."""
    _, _, _, tmp = runs
    mixed = moved = 0
    for probes in ("probes-killed", "probes-resumed"):
        ranks = _probes(tmp / probes)
        main, other = ranks
        assert main["zero_std"], "dynamic sampling judged no batch"
        # Every process saw the same gathered batch: WORLD groups of one prompt each.
        assert all(len(flags) == WORLD for flags in main["zero_std"])
        assert main["zero_std"] == other["zero_std"]
        # The same refill rounds at the same steps; each process draws its own slice.
        assert [r[:2] for r in main["refills"]] == [r[:2] for r in other["refills"]]
        assert len(main["steps"]) == len(other["steps"]) > 0
        flags = iter(main["zero_std"])
        for steps in zip(*(r["steps"] for r in ranks), strict=True):
            if steps[0]["trained"] is None:  # killed before the step finished
                continue
            plan = steps[0]["plan"]
            assert all(s["plan"] == plan for s in steps)
            step_flags = [next(flags) for _ in steps[0]["generated"]]
            mixed += len({f for fl in step_flags for f in fl}) == 2
            per_process = len(plan[0])
            for rank, step in enumerate(steps):
                expected, keep = [], []
                for rnd, group in sorted(map(tuple, plan[rank])):
                    owner, local = divmod(group, per_process)
                    rows = steps[owner]["generated"][rnd]
                    g = len(rows) // per_process
                    expected += rows[local * g : (local + 1) * g]
                    keep += [not step_flags[rnd][group]] * g
                    moved += owner != rank
                assert step["trained"] == expected, (rank, plan)
                assert step["keep"] == keep, (rank, plan, step_flags)
    # The spread reward makes some steps mix flat and informative groups, and at least one
    # process trained a group the other generated (a refill pooled over both processes).
    assert mixed > 0 and moved > 0, (mixed, moved)
