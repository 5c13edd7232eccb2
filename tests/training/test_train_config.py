"""Every shipped training config parses and builds the GRPOConfig it asks for (no model is
loaded), CPU settings are forced where there is no GPU, and bad settings name themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from memsifter.errors import DataError  # noqa: E402
from memsifter.ranker.parse import parse_ranking  # noqa: E402
from memsifter.training.config import (  # noqa: E402
    ModelSettings,
    TrainConfig,
    check_hardware,
    load_train_config,
)
from memsifter.training.grpo import (  # noqa: E402
    build_grpo_config,
    grpo_config_kwargs,
    lora_config,
)
from memsifter.training.rldata.build import load_rl_data_config  # noqa: E402
from memsifter.training.sft import sft_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "train").glob("*.yaml"))


def test_shipped_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"smollm2_cpu.yaml", "qwen3_4b.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_grpo_config(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trl import GRPOConfig

    from memsifter.training import gpu_env

    # The simulated GPU node has the gpu extra's vLLM (this machine has none).
    monkeypatch.setattr(gpu_env, "installed", {"vllm": "0.31.0", "trl": "1.16.0"}.get)
    cfg = load_train_config(path)
    assert (ROOT / cfg.reward).exists()
    fields = set(GRPOConfig.__dataclass_fields__)
    for cuda in (False, True):
        if cfg.grpo.use_vllm and not cuda:
            with pytest.raises(DataError, match="use_vllm"):
                check_hardware(cfg, cuda=False)
            continue
        check_hardware(cfg, cuda=cuda)
        kwargs = grpo_config_kwargs(cfg, tmp_path, cuda=cuda, vllm_server_host="rollout-node")
        assert set(kwargs) <= fields, set(kwargs) - fields
        assert kwargs["use_cpu"] is (not cuda) and kwargs["bf16"] is cuda
        # TrainingArguments refuses bf16/vLLM without a GPU: build the rest of it here.
        cpu_safe = {**kwargs, "bf16": False, "use_cpu": True, "use_vllm": False}
        args = GRPOConfig(**cpu_safe)
        assert args.num_generations == cfg.grpo.num_generations
        assert (args.epsilon, args.epsilon_high, args.beta) == (0.2, 0.28, cfg.grpo.beta)
        assert args.loss_type == "dapo" and args.learning_rate == cfg.grpo.learning_rate
        assert args.generation_batch_size % args.num_generations == 0
        if not cuda:
            assert build_grpo_config(cfg, tmp_path, cuda=False).use_cpu


def test_paper_setting() -> None:
    cfg = load_train_config(ROOT / "configs/train/qwen3_4b.yaml")
    g = cfg.grpo
    assert (g.num_generations, g.max_completion_length, cfg.epochs.epochs) == (6, 16384, 3)
    world = 8
    prompts_per_step = (
        g.per_device_train_batch_size * g.gradient_accumulation_steps * world // g.num_generations
    )
    assert prompts_per_step == 32
    with pytest.raises(ValueError, match="vllm_server_host"):
        grpo_config_kwargs(cfg, "/tmp/x", cuda=True)  # server mode without a host


def test_cpu_defaults_follow_the_paper() -> None:
    g = TrainConfig().grpo
    assert (g.num_generations, g.temperature, g.epsilon, g.epsilon_high, g.beta) == (
        6,
        1.0,
        0.2,
        0.28,
        0.0,
    )
    assert (g.loss_type, g.learning_rate, g.weight_decay, g.max_grad_norm) == (
        "dapo",
        1e-6,
        0.1,
        1.0,
    )


def test_bad_settings_are_named(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("grpo:\n  extra: {max_prompt_length: 512}\n")
    with pytest.raises(DataError, match="max_prompt_length"):
        load_train_config(p)
    p.write_text("grpo:\n  num_generation: 4\n")
    with pytest.raises(DataError, match="unknown key"):
        load_train_config(p)
    p.write_text("model:\n  dtype: bfloat16\n")
    with pytest.raises(DataError, match="bfloat16"):
        check_hardware(load_train_config(p), cuda=False)


@pytest.mark.parametrize("think", [True, False])
def test_sft_targets_parse_and_put_gold_first(think: bool) -> None:
    coarse = [3, 0, 2, 1]
    for target, first in (("coarse", 3), ("gold", 2)):
        text = sft_target(coarse, [2], target, think=think)
        parsed = parse_ranking(text, 4)
        assert parsed.ok and parsed.strict if hasattr(parsed, "strict") else parsed.ok
        assert parsed.ids[0] == first and sorted(parsed.ids) == [0, 1, 2, 3]
        assert text.startswith("<think>") is think


# Each shipped training config and the data recipe that builds its `data` folder.
RECIPES = {
    "smollm2_cpu.yaml": "locomo_smollm2_cpu.yaml",
    "qwen3_4b.yaml": "qwen3_4b.yaml",
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_completion_budget_matches_the_data_recipe(name: str) -> None:
    """The loop refuses grpo.max_completion_length above the data's PromptSpec budget; the
    shipped pairs must pass that check, and name their data folder after the recipe's output."""
    cfg = load_train_config(ROOT / "configs" / "train" / name)
    recipe = ROOT / "configs" / "data" / RECIPES[name]
    spec = load_rl_data_config(recipe).prompt
    assert f"--out {cfg.data}" in recipe.read_text()  # the recipe's documented build command
    assert cfg.grpo.max_completion_length <= spec.completion_tokens
    assert "chat_template_kwargs" not in cfg.grpo.extra  # refused by the loop
    assert cfg.model.name == spec.model
    if cfg.epochs.validation_max_new_tokens is not None:
        assert cfg.epochs.validation_max_new_tokens <= spec.completion_tokens


def test_smollm2_cpu_trains_lora_on_the_top_layers() -> None:
    cfg = load_train_config(ROOT / "configs/train/smollm2_cpu.yaml")
    lo = cfg.model.lora
    assert lo is not None and lo.top_layers == 10 and isinstance(lo.target_modules, list)
    peft = lora_config(cfg, 30)  # SmolLM2-135M has 30 decoder layers
    assert peft.layers_to_transform == list(range(20, 30))
    assert cfg.sft.enabled and cfg.sft.target == "gold"


def test_train_cli_dry_run() -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    res = CliRunner().invoke(
        app,
        ["train", str(ROOT / "configs/train/qwen3_4b.yaml"), "--dry-run"]
        + ["--vllm-server-host", "10.0.0.3"],
    )
    assert res.exit_code == 0, res.output
    assert "vllm_server_host: '10.0.0.3'" in res.output and "epsilon_high: 0.28" in res.output
    res = CliRunner().invoke(app, ["train", "configs/train/missing.yaml", "--dry-run"])
    assert res.exit_code == 2 and "not found" in res.output


def test_set_overrides_are_checked_like_the_file() -> None:
    path = ROOT / "configs/train/smollm2_cpu.yaml"
    base = load_train_config(path)
    cfg = load_train_config(
        path,
        [
            "epochs.max_steps=12",
            "grpo.learning_rate=2e-5",
            "data=data/rl/other",
            "epochs.validation_max_questions=null",
        ],
    )
    assert (cfg.epochs.max_steps, cfg.grpo.learning_rate) == (12, 2e-5)
    assert cfg.data == "data/rl/other" and cfg.epochs.validation_max_questions is None
    assert cfg.grpo.num_generations == base.grpo.num_generations  # the rest is the file's
    assert cfg.overrides == [
        "epochs.max_steps=12",
        "grpo.learning_rate=2e-5",
        "data=data/rl/other",
        "epochs.validation_max_questions=null",
    ]
    with pytest.raises(DataError, match="unknown key"):
        load_train_config(path, ["grpo.num_generation=4"])
    with pytest.raises(DataError, match="expected int"):
        load_train_config(path, ["epochs.max_steps=many"])
    with pytest.raises(DataError, match="not KEY=VALUE"):
        load_train_config(path, ["epochs.max_steps"])
    with pytest.raises(DataError, match="not a section"):
        load_train_config(path, ["data.x=1"])


def test_train_cli_set_reaches_the_dry_run() -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    res = CliRunner().invoke(
        app,
        ["train", str(ROOT / "configs/train/smollm2_cpu.yaml"), "--dry-run"]
        + ["--set", "grpo.learning_rate=3e-5", "--set", "grpo.num_generations=2"],
    )
    assert res.exit_code == 0, res.output
    assert "learning_rate: 3e-05" in res.output and "num_generations: 2" in res.output
    res = CliRunner().invoke(
        app, ["train", str(ROOT / "configs/train/smollm2_cpu.yaml"), "--set", "nope=1"]
    )
    assert res.exit_code == 2 and "unknown key" in res.output


def test_every_shipped_recipe_selects_by_a_metric_its_reward_can_move() -> None:
    """Validation's reward is alpha * R_ans: a retrieval-only reward (alpha 0) scores every
    checkpoint 0, so selecting by it chooses by ties (the reading gym's labels recipe once did)."""
    from memsifter.rewards import load_reward_config
    from memsifter.training.validation import check_select_metric

    for path in CONFIGS:
        cfg = load_train_config(path)
        check_select_metric(cfg, load_reward_config(ROOT / cfg.reward))
    labels = load_train_config(
        ROOT / "configs/train/gym_read_pl_labels.yaml", ["epochs.select_metric=reward"]
    )
    with pytest.raises(DataError, match=r"select_metric is reward.*gym_labels.yaml has alpha 0"):
        check_select_metric(labels, load_reward_config(ROOT / labels.reward))


def test_bf16_autocast_on_a_cpu_without_bf16_units_is_kept_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    import memsifter.training.loop as loop

    bf16 = TrainConfig(model=ModelSettings(autocast="bf16"))
    monkeypatch.setattr(loop, "cpu_bf16_units", lambda: ())
    said = loop.emulated_autocast(bf16, cuda=False)
    assert said is not None and "model.autocast=none" in said
    assert loop.emulated_autocast(bf16, cuda=True) is None  # a GPU computes bf16 natively
    none = dataclasses.replace(bf16, model=ModelSettings(autocast="none"))
    assert loop.emulated_autocast(none, cuda=False) is None
    monkeypatch.setattr(loop, "cpu_bf16_units", lambda: ("amx_bf16",))
    assert loop.emulated_autocast(bf16, cuda=False) is None
