"""The whole training run on a tiny random Qwen3 (proxy and working LLM): RL data -> cold-start
SFT (stopped there with ``until="sft"``, then resumed) -> two GRPO epochs with dynamic sampling
-> validation of every checkpoint -> averaging -> the next epoch starts from the average; every
model folder carries the data's ``prompt_spec.json``; the reward's warm-up is sized to the run
(``total_steps``); then a rerun resumes instead of retraining, and a run killed after a
checkpoint resumes from it. Settings that contradict the data's PromptSpec are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from safetensors.torch import load_file  # noqa: E402

from memsifter.errors import DataError  # noqa: E402
from memsifter.ranker.checkpoint import SPEC_FILE, read_spec  # noqa: E402
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
from memsifter.training.rldata.build import (  # noqa: E402
    load_rl_dataset,
    prepare_rl_data,
)


def _reward_yaml(path: Path, model: Path) -> Path:
    # The warm-up is the whole run: its length comes from total_steps (2 epochs x 2 steps).
    path.write_text(
        "max_k: 3\nbeta0: 0.5\ndecay_steps: null\ndecay_fraction: 1.0\n"
        f"answerer:\n  model: {model}\n  window_tokens: 512\n  max_new_tokens: 8\n"
        "  batch_size: 4\n",
        encoding="utf-8",
    )
    return path


SPEC = dict(window_tokens=640, completion_tokens=32, unit="page", turns_per_page=2)


@pytest.fixture(scope="module")
def rl_data(tiny_qwen3: Path, locomo_mini_path: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("rl")
    recipe = tiny_locomo_recipe(
        tiny_qwen3, locomo_mini_path, completion_tokens=SPEC["completion_tokens"]
    )
    prepare_rl_data(recipe, tmp / "rl")
    return tmp / "rl"


def _config(tiny_qwen3: Path, data: Path, out: Path, **grpo: object) -> TrainConfig:
    return TrainConfig(
        output_dir=str(out),
        data=str(data),
        reward=str(_reward_yaml(out.parent / f"{out.name}-reward.yaml", tiny_qwen3)),
        model=ModelSettings(name=str(tiny_qwen3)),
        sft=SFTSettings(enabled=True, epochs=1, per_device_train_batch_size=2),
        grpo=GRPOSettings(
            **{  # type: ignore[arg-type]
                "num_generations": 2,
                "max_completion_length": 12,
                "per_device_train_batch_size": 4,
                "learning_rate": 1e-3,
                **grpo,
            }
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


@pytest.fixture(scope="module")
def run(tiny_qwen3: Path, rl_data: Path, tmp_path_factory: pytest.TempPathFactory):
    from memsifter.training.loop import run_training

    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp("train")
    cfg = _config(tiny_qwen3, rl_data, tmp / "out")
    # First only the cold start (`memsifter train --until sft`), then the rest resumes from it.
    sft_logs: list[str] = []
    stopped = run_training(cfg, log=sft_logs.append, until="sft")
    epochs_after_sft = sorted(p.name for p in (tmp / "out").glob("epoch-*"))
    logs: list[str] = []
    summary = run_training(cfg, log=logs.append)
    return cfg, summary, logs, (stopped, sft_logs, epochs_after_sft)


@pytest.mark.slow
def test_until_sft_stops_after_the_cold_start(run) -> None:
    cfg, _, logs, (stopped, sft_logs, epochs_after_sft) = run
    out = Path(cfg.output_dir)
    assert stopped == {"model": str(out / "sft" / "final"), "stage": "sft"}
    assert epochs_after_sft == []  # no GRPO yet
    assert any("cold-start SFT" in line for line in sft_logs)
    assert any("stopped after SFT" in line for line in sft_logs)
    assert not any("GRPO from" in line for line in sft_logs)
    # The full run picked up the SFT model instead of training it again.
    assert not any("cold-start" in line for line in logs)
    assert "sft/final" in next(line for line in logs if "GRPO from" in line)


@pytest.mark.slow
def test_every_model_folder_carries_the_prompt_spec(run, rl_data: Path) -> None:
    cfg, summary, _, _ = run
    out = Path(cfg.output_dir)
    spec = read_spec(rl_data)
    assert spec.completion_tokens == SPEC["completion_tokens"] and spec.unit == "page"
    folders = [out / "sft" / "final"]
    for epoch in (0, 1):
        edir = out / f"epoch-{epoch}"
        folders += [*sorted(edir.glob("checkpoint-*")), edir / "averaged"]
    assert len(folders) == 7
    for folder in folders:
        assert (folder / SPEC_FILE).is_file(), folder
        assert read_spec(folder) == spec
    assert read_spec(summary["model"]) == spec


@pytest.mark.slow
def test_epochs_validate_average_and_chain(run) -> None:
    cfg, summary, logs, _ = run
    out = Path(cfg.output_dir)
    assert (out / "sft" / "final" / "config.json").exists()
    for epoch in (0, 1):
        edir = out / f"epoch-{epoch}"
        assert sorted(p.name for p in edir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
        # Validated and averaged: the checkpoints keep their weights, not their optimizer states.
        assert not list(edir.glob("checkpoint-*/optimizer*"))
        assert all((c / "model.safetensors").is_file() for c in edir.glob("checkpoint-*"))
        results = json.loads((edir / "validation.json").read_text())
        # The average is validated too (keep_start_if_better compares it with the start).
        assert set(results) == {"start", "checkpoint-1", "checkpoint-2", "averaged"}
        assert all(r["questions"] == 2 for r in results.values())
        assert (edir / "rankings" / "averaged.jsonl").exists()
        assert (edir / "rankings" / "checkpoint-1.jsonl").exists()
        # The average is the element-wise mean of the checkpoints it chose (top_k=2 of 2, less
        # one that validated below the start).
        from memsifter.training.loop import checkpoints_to_average

        top = json.loads((out / "run_state.json").read_text())[edir.name]["top"]
        assert top == checkpoints_to_average(results, "reward", 2)
        avg = load_file(edir / "averaged" / "model.safetensors")
        parts = [load_file(edir / name / "model.safetensors") for name in top]
        for name in avg:
            torch.testing.assert_close(avg[name], sum(p[name] for p in parts) / len(parts))
    # Epoch 0 starts from the SFT model; epoch 1 from what epoch 0 carried forward: its average
    # unless the start model validated strictly higher.
    from memsifter.training.loop import keep_or_advance

    starts = [line for line in logs if "GRPO from" in line]
    assert "sft/final" in starts[0]
    state = json.loads((out / "run_state.json").read_text())
    for epoch in (0, 1):
        entry = state[f"epoch-{epoch}"]
        expected = keep_or_advance(
            entry["validation"], "reward", _start(out, epoch, state), entry["averaged"]
        )
        assert entry["next"] == expected
    assert f"GRPO from {state['epoch-0']['next']}" in starts[1]
    assert summary["model"] == state["epoch-1"]["next"]
    # Epoch 1's prompts were re-selected by the curriculum from epoch 1's start model's rankings
    # of the whole train pool; epoch 0 trained on the data folder's selection.
    cdir = out / "epoch-1" / "curriculum"
    pool = load_rl_dataset(cfg.data, pool=True)["train"]
    ranked = [json.loads(x) for x in (cdir / "rankings.jsonl").read_text().splitlines()]
    assert sorted(r["qid"] for r in ranked) == sorted(pool["qid"])
    report = json.loads((cdir / "curriculum.json").read_text())
    assert report["rankings_file"] == str(cdir / "rankings.jsonl")
    assert report["scored_by"] == "rankings"
    selected = {e["qid"] for e in report["examples"] if e["selected"]}
    assert len(selected) == 4 and (cdir / "train.parquet").exists()
    assert state["epoch-1"]["train_data"] == str(cdir / "train.parquet")
    assert not (out / "epoch-0" / "curriculum").exists()
    assert (out / "curves.png").stat().st_size > 0
    assert "| 1 | checkpoint-2 |" in (out / "report.md").read_text()
    history = json.loads((out / "epoch-0" / "trainer_state.json").read_text())["log_history"]
    logged = {k for row in history for k in row}
    assert {"reward/beta", "reward/parse_rate", "dynamic_sampling/effective_groups"} <= logged
    # The warm-up decays over the run, not per epoch: beta0 0.5 over the run's 4 steps (2 an
    # epoch), sized by total_steps from decay_fraction 1.0.
    betas = []
    for epoch in (0, 1):
        rows = json.loads((out / f"epoch-{epoch}" / "trainer_state.json").read_text())
        betas += [row["reward/beta"] for row in rows["log_history"] if "reward/beta" in row]
    assert betas == pytest.approx([0.5, 0.375, 0.25, 0.125])


def _start(out: Path, epoch: int, state: dict) -> str:
    return str(out / "sft" / "final") if epoch == 0 else state[f"epoch-{epoch - 1}"]["next"]


def test_a_checkpoint_below_the_start_is_not_averaged_in() -> None:
    """Seen on a 2-core AMD machine: the generate recipe's CI run validated 1.000 at step 20,
    then collapsed to unparseable answers (-1.000 at step 40); averaging the two gave a model
    that parsed nothing."""
    from memsifter.training.loop import checkpoints_to_average

    res = {
        "start": {"reward": 0.19},
        "checkpoint-20": {"reward": 1.0},
        "checkpoint-40": {"reward": -1.0},
        "checkpoint-60": {"reward": 0.19},  # a tie with the start stays
    }
    assert checkpoints_to_average(res, "reward", 2) == ["checkpoint-20", "checkpoint-60"]
    assert checkpoints_to_average(res, "reward", 3) == ["checkpoint-20", "checkpoint-60"]
    below = {
        "start": {"reward": 0.5},
        "checkpoint-1": {"reward": 0.1},
        "checkpoint-2": {"reward": 0.2},
    }
    assert checkpoints_to_average(below, "reward", 2) == ["checkpoint-2"]  # the best alone
    del res["start"]  # not validated: the plain top k
    assert checkpoints_to_average(res, "reward", 2) == ["checkpoint-20", "checkpoint-60"]
    assert checkpoints_to_average(res, "reward", 3) == [
        "checkpoint-20",
        "checkpoint-60",
        "checkpoint-40",
    ]


def test_keep_or_advance_keeps_only_a_strictly_better_start() -> None:
    from memsifter.training.loop import keep_or_advance

    def res(start: float, avg: float) -> dict:
        return {"start": {"ndcg_1": start}, "averaged": {"ndcg_1": avg}}

    assert keep_or_advance(res(0.6, 0.5), "ndcg_1", "S", "A") == "S"
    assert keep_or_advance(res(0.5, 0.6), "ndcg_1", "S", "A") == "A"
    assert keep_or_advance(res(0.5, 0.5), "ndcg_1", "S", "A") == "A"  # a tie advances


def test_keep_start_needs_start_validation() -> None:
    with pytest.raises(ValueError, match="validate_start"):
        EpochSettings(validate_start=False)
    EpochSettings(validate_start=False, keep_start_if_better=False)


@pytest.mark.slow
def test_rerun_resumes_instead_of_retraining(run) -> None:
    from memsifter.training.loop import run_training

    cfg, summary, _, _ = run
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
    # The checkpoint saved after resuming carries the spec too.
    assert read_spec(edir / "checkpoint-2") == read_spec(cfg.data)


@pytest.mark.slow
def test_lora_run_ships_adapters_with_the_spec(
    tiny_qwen3: Path, rl_data: Path, tmp_path: Path
) -> None:
    """LoRA on the top layer only: SFT keeps its adapter and hands GRPO a merged model; GRPO
    checkpoints are adapters, validated merged; every folder carries the spec."""
    from memsifter.training.config import LoraSettings
    from memsifter.training.loop import run_training

    torch.manual_seed(0)
    cfg = _config(tiny_qwen3, rl_data, tmp_path / "out")
    cfg.model.lora = LoraSettings(
        r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"], top_layers=1
    )
    cfg.epochs = EpochSettings(
        epochs=1, max_steps=2, save_steps=1, top_k=1, validation_max_questions=1
    )
    summary = run_training(cfg, log=lambda _: None)
    out, spec = Path(cfg.output_dir), read_spec(rl_data)
    assert (out / "sft" / "adapter" / "adapter_config.json").is_file()
    assert not (out / "sft" / "final" / "adapter_config.json").exists()
    edir = out / "epoch-0"
    for name in ("checkpoint-1", "checkpoint-2"):
        adapter = json.loads((edir / name / "adapter_config.json").read_text())
        assert adapter["layers_to_transform"] == [1]  # the tiny model's top layer of 2
        assert read_spec(edir / name) == spec
        assert read_spec(edir / "merged-for-eval" / name) == spec
    for folder in (out / "sft" / "final", edir / "averaged", Path(summary["model"])):
        assert read_spec(folder) == spec


# --- refused settings and total_steps (no training) -----------------------------------------------


def test_completion_longer_than_the_spec_is_refused(
    tiny_qwen3: Path, rl_data: Path, tmp_path: Path
) -> None:
    from memsifter.training.loop import run_training

    cfg = _config(tiny_qwen3, rl_data, tmp_path / "out", max_completion_length=33)
    with pytest.raises(DataError, match=r"max_completion_length \(33\) exceeds") as e:
        run_training(cfg, log=lambda _: None)
    assert "completion budget (32)" in str(e.value)
    assert not (tmp_path / "out" / "sft").exists()


def test_validation_shorter_than_training_is_refused(
    tiny_qwen3: Path, rl_data: Path, tmp_path: Path
) -> None:
    import dataclasses

    from memsifter.training.loop import run_training

    cfg = _config(tiny_qwen3, rl_data, tmp_path / "out")
    short = dataclasses.replace(cfg.epochs, validation_max_new_tokens=8)
    with pytest.raises(DataError, match=r"validation_max_new_tokens \(8\) is below") as e:
        run_training(dataclasses.replace(cfg, epochs=short), log=lambda _: None)
    assert "max_completion_length (12)" in str(e.value)
    assert not (tmp_path / "out" / "sft").exists()  # refused before any stage ran


def test_trainer_chat_template_kwargs_are_refused(
    tiny_qwen3: Path, rl_data: Path, tmp_path: Path
) -> None:
    from memsifter.training.loop import run_training

    cfg = _config(tiny_qwen3, rl_data, tmp_path / "out", extra={"chat_template_kwargs": {"x": 1}})
    with pytest.raises(DataError, match="prompt.chat_template_kwargs in the data recipe"):
        run_training(cfg, log=lambda _: None)


def test_data_without_prompt_spec_is_refused(
    tiny_qwen3: Path, rl_data: Path, tmp_path: Path
) -> None:
    from memsifter.training.loop import run_training

    data = tmp_path / "rl"
    shutil.copytree(rl_data, data)
    (data / SPEC_FILE).unlink()
    with pytest.raises(DataError, match=f"has no {SPEC_FILE}"):
        run_training(_config(tiny_qwen3, data, tmp_path / "out"), log=lambda _: None)


def test_until_is_checked(tiny_qwen3: Path, rl_data: Path, tmp_path: Path) -> None:
    from memsifter.training.loop import run_training

    cfg = _config(tiny_qwen3, rl_data, tmp_path / "out")
    with pytest.raises(ValueError, match="until must be sft"):
        run_training(cfg, log=lambda _: None, until="grpo")
    cfg.sft.enabled = False
    with pytest.raises(ValueError, match="sft.enabled is false"):
        run_training(cfg, log=lambda _: None, until="sft")


def test_train_cli_until_sft_needs_sft(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    path = tmp_path / "t.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nsft:\n  enabled: false\n")
    res = CliRunner().invoke(app, ["train", str(path), "--until", "sft"])
    assert res.exit_code == 2 and "sft.enabled is false" in res.output


def test_total_steps() -> None:
    from memsifter.training.loop import total_steps

    cfg = TrainConfig(
        grpo=GRPOSettings(num_generations=4, per_device_train_batch_size=8),
        epochs=EpochSettings(epochs=3, max_steps=30),
    )
    assert total_steps(cfg, 1000) == 90  # max_steps wins, per epoch
    cfg.epochs.max_steps = -1  # one pass: 100 prompts x 4 completions / 8 per step = 50
    assert total_steps(cfg, 100) == 3 * 50
    assert total_steps(cfg, 101) == 3 * 51  # a partial step still counts
    cfg.grpo.gradient_accumulation_steps = 2
    assert total_steps(cfg, 100) == 3 * 25
    cfg.grpo.num_iterations = 2  # TRL takes num_iterations steps on every generation batch
    assert total_steps(cfg, 100) == 3 * 50
    assert total_steps(cfg, 0) == 3  # never 0: the warm-up needs a length


def test_validation_feeds_the_prompt_text_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    import memsifter.llm as llm
    from memsifter.llm import Generation
    from memsifter.training.validation import generate_completions

    seen: list[str] = []

    class _Backend:
        name, model_name, tokenizer = "fake", "m", None

        def generate(self, texts, sampling):  # noqa: ANN001, ANN202
            seen.extend(texts)
            return [[Generation("<ranking>0</ranking>", 1, 1, "stop", 0.0)] for _ in texts]

    monkeypatch.setattr(llm, "build_backend", lambda *a, **k: _Backend())
    rows = [
        {
            "prompt": "<|im_start|>user\nrendered<|im_end|>\n<|im_start|>assistant\n",
            "n_candidates": 1,
        }
    ]
    assert generate_completions("m", rows, max_new_tokens=4) == ["<ranking>0</ranking>"]
    assert seen == [rows[0]["prompt"]]  # not templated again
    with pytest.raises(ValueError, match="rendered prompt text"):
        generate_completions(
            "m", [{"prompt": [{"role": "user", "content": "x"}]}], max_new_tokens=4
        )


def test_vllm_validation_builds_one_engine_per_model_and_shuts_it_down(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``epochs.validation_backend: vllm`` generates with an in-process ``vllm.LLM`` on the
    model folder (window from ``model.context_tokens``), greedy and capped, and shuts the
    engine down afterwards: the next checkpoint's engine and the next trainer need its GPU."""
    import sys
    import types

    from memsifter.training.config import TrainConfig
    from memsifter.training.validation import ValidationEngine, generate_completions

    events: list[tuple[str, object]] = []

    class _Core:
        def shutdown(self) -> None:
            events.append(("shutdown", None))

    class _LLM:
        def __init__(self, **kwargs: object) -> None:
            events.append(("init", kwargs))
            self.llm_engine = types.SimpleNamespace(engine_core=_Core())

        def generate(self, prompts, params, use_tqdm=False):  # noqa: ANN001, ANN202
            events.append(("generate", (list(prompts), params)))
            out = types.SimpleNamespace(text="<ranking>1, 0</ranking>", token_ids=[1, 2, 3])
            out.finish_reason = "stop"
            return [types.SimpleNamespace(prompt_token_ids=[0], outputs=[out]) for _ in prompts]

    class _Params:
        def __init__(self, **kwargs: object) -> None:
            self.kwargs = kwargs

    monkeypatch.setitem(
        sys.modules, "vllm", types.SimpleNamespace(LLM=_LLM, SamplingParams=_Params)
    )
    model = tmp_path / "checkpoint-4"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = TrainConfig()
    cfg.model.context_tokens = 4096
    cfg.epochs.validation_backend = "vllm"
    cfg.epochs.validation_engine_args = {"gpu_memory_utilization": 0.5, "enforce_eager": True}
    engine = ValidationEngine.from_config(cfg)
    rows = [{"prompt": "p1", "n_candidates": 2}, {"prompt": "p2", "n_candidates": 2}]
    assert (
        generate_completions(model, rows, max_new_tokens=7, engine=engine)
        == ["<ranking>1, 0</ranking>"] * 2
    )
    kinds = [e[0] for e in events]
    assert kinds == ["init", "generate", "shutdown"]
    init = events[0][1]
    assert isinstance(init, dict)
    assert init["model"] == str(model) and init["max_model_len"] == 4096
    assert init["gpu_memory_utilization"] == 0.5 and init["enforce_eager"] is True
    prompts, params = events[1][1]  # type: ignore[misc]
    assert prompts == ["p1", "p2"]
    assert params.kwargs["temperature"] == 0.0 and params.kwargs["max_tokens"] == 7


def test_validation_backend_is_checked() -> None:
    from memsifter.training.config import EpochSettings

    with pytest.raises(ValueError, match="validation_backend must be one of"):
        EpochSettings(validation_backend="sglang")
    with pytest.raises(ValueError, match="validation_engine_args are vllm engine arguments"):
        EpochSettings(validation_engine_args={"enforce_eager": True})
