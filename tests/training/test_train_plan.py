"""`memsifter train CONFIG --plan`: the memory arithmetic on hand-computed cases (a tiny Qwen3's
config.json), the Qwen3-4B recipe fitting 8 x 80 GB under ZeRO-3, and the recipe's long window:
the paper's base (Thinking-2507) reaches it natively, the original Qwen3-4B through YaRN, on the
policy load and on the rollout server's command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsifter.training.config import (
    GRPOSettings,
    LoraSettings,
    ModelSettings,
    PlanSettings,
    TrainConfig,
    load_train_config,
)
from memsifter.training.plan import GB, LINEARS, ModelShape, Strategy, memory_plan, plan_report

ROOT = Path(__file__).resolve().parents[2]
QWEN3_4B = ROOT / "configs/train/qwen3_4b.yaml"
# The original Qwen3-4B in the same recipe (the overrides its comment gives).
ORIGINAL = [
    "model.name=Qwen/Qwen3-4B",
    "plan.model_config=configs/models/Qwen3-4B/config.json",
    "model.rope_scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768, "
    "rope_theta: 1000000}",
]

# The tiny Qwen3 (tests/conftest.py): hidden 64, 2 layers, 2 heads x 32, 1 KV head, MLP 128,
# vocabulary 607, tied embeddings.
EMBED = 607 * 64  # 38,848
# q 64x64 + k 64x32 + v 64x32 + o 64x64 + MLP 3 x 64x128 + norms 2x64 + q/k norms 2x32
LAYER = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 128 + 64  # 37,056
PARAMS = EMBED + 2 * LAYER + 64  # + final norm = 113,024
A = 6 * 64 + 3 * 64 + 3 * 32 + 4 * 128  # 1,184 activation values per token per layer


@pytest.fixture(scope="module")
def shape(tiny_qwen3: Path) -> ModelShape:
    return ModelShape.from_config_json(tiny_qwen3)


def test_parameter_count_is_the_models(shape: ModelShape, tiny_qwen3: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert (shape.layer_parameters, shape.parameters) == (LAYER, PARAMS) == (37_056, 113_024)
    assert shape.activation_values_per_token == A
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    assert sum(p.numel() for p in model.parameters()) == shape.parameters


def _cfg(**grpo: object) -> TrainConfig:
    return TrainConfig(
        model=ModelSettings(context_tokens=1000, gradient_checkpointing=True),
        grpo=GRPOSettings(per_device_train_batch_size=2, max_completion_length=100, **grpo),
        plan=PlanSettings(gpus=8, reserve_gb=0.0),
    )


def test_zero3_bf16_with_checkpointing(shape: ModelShape) -> None:
    plan = memory_plan(_cfg(), shape, Strategy("deepspeed", 3))
    expected = {
        "weights": PARAMS * 2 / 8,  # 28,256: bf16, sharded over 8
        "gathered weights": 2 * (2 * LAYER + EMBED),  # 225,920
        "gradients": PARAMS * 2 / 8,
        "optimizer states": PARAMS * 12 / 8,  # fp32 master + 2 moments, sharded
        "checkpointed activations": 2 * 1000 * 64 * 2 * 2,  # b S H L a = 512,000
        "recomputed layer": 2 * 1000 * A * 2,  # 4,736,000
        "logits": 3 * 2 * 100 * 607 * 2,  # 728,400
        "vLLM": 0.0,
        "reserve": 0.0,
    }
    assert {line.name: line.bytes for line in plan.lines} == pytest.approx(expected)
    assert plan.total_bytes == pytest.approx(sum(expected.values()))
    assert plan.fits


def test_ddp_fp32_without_checkpointing_and_colocated_vllm(shape: ModelShape) -> None:
    cfg = _cfg(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.25)
    cfg.model.dtype, cfg.model.gradient_checkpointing = "float32", False
    cfg.plan.gpus, cfg.plan.gpu_memory_gb = 1, 0.01
    plan = memory_plan(cfg, shape, Strategy("ddp", 0))
    assert {line.name: line.bytes for line in plan.lines} == pytest.approx(
        {
            "weights": PARAMS * 4,
            "gradients": PARAMS * 4,
            "optimizer states": PARAMS * 8,  # torch AdamW: two fp32 moments
            "activations": 2 * 1000 * A * 2 * 4,  # every layer kept: b S A L a
            "logits": 3 * 2 * 100 * 607 * 4,
            "vLLM": 0.25 * 0.01 * GB,  # its share of every training GPU
            "reserve": 0.0,
        }
    )
    assert plan.total_bytes > 0.01 * GB and not plan.fits


def test_lora_trains_only_its_matrices(shape: ModelShape, tiny_qwen3: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from memsifter.training.grpo import lora_config

    cfg = _cfg()
    cfg.model.lora = LoraSettings(r=4, target_modules=list(LINEARS), top_layers=1)
    # r (in + out) per linear: q 4x128, k 4x96, v 4x96, o 4x128, gate/up/down 4x192 each
    trainable = 512 + 384 + 384 + 512 + 3 * 768
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3), lora_config(cfg, 2))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == trainable
    plan = memory_plan(cfg, shape, Strategy("deepspeed", 3))
    assert plan.get("gradients") == pytest.approx(trainable * 2 / 8)
    assert plan.get("optimizer states") == pytest.approx(trainable * 12 / 8)
    assert plan.get("weights") == pytest.approx(PARAMS * 2 / 8 + trainable * 2)


def test_strategies_read_from_the_shipped_accelerate_configs() -> None:
    accel = ROOT / "configs/accelerate"
    assert Strategy.from_accelerate_config(accel / "deepspeed_zero3.yaml") == Strategy(
        "deepspeed", 3
    )
    assert Strategy.from_accelerate_config(accel / "fsdp.yaml").stage == 3
    assert Strategy.from_accelerate_config(accel / "ddp.yaml").stage == 0


def test_the_qwen3_4b_recipe_fits_80gb() -> None:
    cfg = load_train_config(QWEN3_4B)
    text, plan = plan_report(cfg, ROOT)
    assert plan.fits and plan.budget_bytes == 80 * GB, text
    assert 4.0e9 < plan.get("weights") * 8 / 2 < 4.05e9  # Qwen3-4B: 4.02B parameters
    # 1 x 131,072 tokens x 2,560 hidden x 36 layers x 2 bytes
    assert plan.get("checkpointed activations") == 131072 * 2560 * 36 * 2
    assert "fits" in text and "rope yarn" not in text
    assert (
        "base: Qwen/Qwen3-4B-Thinking-2507 (config configs/models/Qwen3-4B-Thinking-2507/"
        "config.json: max_position_embeddings 262144, rope_theta 5,000,000); the 131072-token "
        "window is reached natively, no rope scaling" in text
    ), text
    assert not plan.notes

    # The original Qwen3-4B: the same shape, YaRN x4 to the window; the plan names that base.
    original_text, original = plan_report(load_train_config(QWEN3_4B, ORIGINAL), ROOT)
    assert original.fits and "rope yarn" in original_text and not original.notes
    assert "base: Qwen/Qwen3-4B (config configs/models/Qwen3-4B/config.json: " in original_text
    assert "reached yarn x4 from 32768 positions" in original_text
    # Without YaRN it would not reach; YaRN on the 2507 base is not needed: both are said.
    _, bare = plan_report(
        load_train_config(QWEN3_4B, [*ORIGINAL[:2], "model.rope_scaling=null"]), ROOT
    )
    assert any("beyond the model's max_position_embeddings 40960" in n for n in bare.notes)
    _, extra = plan_report(load_train_config(QWEN3_4B, [ORIGINAL[2]]), ROOT)
    assert any("YaRN is not needed" in n for n in extra.notes)
    # The batch of the paper: 32 prompts x 6 completions per optimiser step on 8 GPUs.
    assert "192 completions = 32 prompts x 6" in text

    # Six 128K sequences per forward pass (the recipe before) do not fit.
    six = load_train_config(QWEN3_4B, ["grpo.per_device_train_batch_size=6"])
    _, over = plan_report(six, ROOT)
    assert not over.fits and over.get("checkpointed activations") > 140 * GB


def test_plan_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["train", str(QWEN3_4B), "--plan"])
    assert res.exit_code == 0, res.output
    assert "checkpointed activations" in res.output and "fits" in res.output
    res = runner.invoke(
        app, ["train", str(QWEN3_4B), "--plan", "--set", "grpo.per_device_train_batch_size=6"]
    )
    assert res.exit_code == 1 and "DOES NOT FIT" in res.output
    # A hub id without a local config.json: named, nothing downloaded.
    res = runner.invoke(app, ["train", str(QWEN3_4B), "--plan", "--set", "plan.model_config=null"])
    assert res.exit_code == 2 and "plan.model_config" in res.output
    res = runner.invoke(
        app, ["train", str(QWEN3_4B), "--plan", "--set", "model.context_tokens=null"]
    )
    assert res.exit_code == 2 and "model.context_tokens" in res.output


# -- the long window ---------------------------------------------------------------------------


def test_vllm_args_carry_the_window_and_yarn() -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    res = CliRunner().invoke(app, ["train", str(QWEN3_4B), "--vllm-args"])
    assert res.exit_code == 0, res.output
    base = res.output.splitlines()
    assert base[:4] == ["--model", "Qwen/Qwen3-4B-Thinking-2507", "--max-model-len", "131072"]
    assert "--hf-overrides" not in base  # its own positions reach 128K
    sets = [a for o in ORIGINAL for a in ("--set", o)]
    res = CliRunner().invoke(app, ["train", str(QWEN3_4B), "--vllm-args", *sets])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[:4] == ["--model", "Qwen/Qwen3-4B", "--max-model-len", "131072"]
    assert lines[4] == "--hf-overrides"
    rope = json.loads(lines[5])["rope_parameters"]
    assert rope == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
        "rope_theta": 1000000,
    }


def test_policy_loads_with_yarn(tiny_qwen3: Path, tmp_path: Path) -> None:
    from memsifter.training.grpo import load_policy

    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 256,
        "rope_theta": 1e6,
    }
    cfg = TrainConfig(model=ModelSettings(name=str(tiny_qwen3), rope_scaling=rope))
    model, _, _ = load_policy(cfg, str(tiny_qwen3), cuda=False)
    assert model.model.rotary_emb.rope_type == "yarn"
    assert model.model.rotary_emb.attention_scaling > 1.0  # YaRN's 0.1 ln(4) + 1
    model.save_pretrained(tmp_path)  # a checkpoint carries it to the next epoch
    saved = json.loads((tmp_path / "config.json").read_text())["rope_parameters"]
    assert saved["rope_type"] == "yarn" and saved["factor"] == 4.0

    plain, _, _ = load_policy(TrainConfig(), str(tiny_qwen3), cuda=False)
    assert plain.model.rotary_emb.rope_type == "default"


def test_rope_scaling_is_checked() -> None:
    with pytest.raises(ValueError, match="rope_theta"):
        ModelSettings(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32768})  # fmt: skip
    with pytest.raises(ValueError, match="reaches"):
        ModelSettings(context_tokens=200_000, rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
            "rope_theta": 1e6})  # fmt: skip


def test_colocated_vllm_refuses_a_rope_override() -> None:
    from memsifter.training.grpo import grpo_config_kwargs

    cfg = load_train_config(QWEN3_4B, [*ORIGINAL, "grpo.vllm_mode=colocate"])
    with pytest.raises(ValueError, match="colocate"):
        grpo_config_kwargs(cfg, "/tmp/x", cuda=True)


def test_the_window_is_the_data_recipes() -> None:
    """model.context_tokens (vLLM's --max-model-len, the plan's sequence) is the window the data
    recipe builds prompts for, on the same base: Thinking-2507 reaches it natively, the original
    Qwen3-4B through YaRN."""
    from memsifter.training.rldata.build import load_rl_data_config

    cfg = load_train_config(QWEN3_4B)
    spec = load_rl_data_config(ROOT / "configs/data/qwen3_4b.yaml").prompt
    assert cfg.model.context_tokens == spec.window_tokens == 131072
    assert spec.model == cfg.model.name == "Qwen/Qwen3-4B-Thinking-2507"
    paper = ModelShape.from_config_json(ROOT / "configs/models/Qwen3-4B-Thinking-2507")
    assert (paper.max_position_embeddings, paper.rope_theta) == (262144, 5_000_000)
    assert cfg.model.rope_scaling is None and spec.window_tokens <= paper.max_position_embeddings
    original = ModelShape.from_config_json(ROOT / "configs/models/Qwen3-4B")
    assert paper.parameters == original.parameters  # the same shape, other positions
    rope = load_train_config(QWEN3_4B, ORIGINAL).model.rope_scaling or {}
    assert rope["original_max_position_embeddings"] * rope["factor"] >= spec.window_tokens
    assert spec.window_tokens > (original.max_position_embeddings or 0)  # hence YaRN


@pytest.mark.parametrize("name", ["qwen3_4b_one_node", "qwen3_4b_first_token"])
def test_the_one_node_layouts_fit_80gb_for_both_heads(name: str) -> None:
    cfg = load_train_config(ROOT / "configs/train" / f"{name}.yaml")
    text, plan = plan_report(cfg, ROOT)
    assert plan.fits and plan.budget_bytes == 80 * GB, text
    assert "layout: one node of 8 GPUs" in text and "per card: 80 GB: fits, 141 GB: fits" in text
    assert cfg.plan.role_gpus == cfg.plan.node_gpus == 8
    if name == "qwen3_4b_first_token":
        # One prompt a forward, no completion logits, no vLLM, float32 masters for LoRA's
        # (float32 already: 8 B a parameter would do, the plan keeps 12 for bf16 weights).
        assert plan.get("logits") == 0 and plan.get("vLLM") == 0
        assert "trainer: first_token head" in text and "30 prompts x 16" in text
        # Its full fine-tune does not fit 80 GB but fits an H200's 141.
        full = load_train_config(ROOT / "configs/train" / f"{name}.yaml", ["model.lora=null"])
        full_text, full_plan = plan_report(full, ROOT)
        assert not full_plan.fits and "141 GB: fits" in full_text
    else:
        assert "180 completions = 30 prompts x 6" in text  # near the paper's 32 on 6 GPUs


def test_the_head_is_planned_ddp_or_sharded_never_under_deepspeed() -> None:
    """The head's trainer takes its own optimizer step: DeepSpeed is refused, naming FSDP2;
    under FSDP2 its float32 shards are the masters, so a full fine-tune of Qwen3-4B at 128K
    fits 80 GB sharded over the 6 trainer GPUs, where DDP's whole copy does not."""
    from memsifter.errors import DataError

    recipe = ROOT / "configs/train/qwen3_4b_first_token.yaml"
    ds = load_train_config(
        recipe, ["plan.accelerate_config=configs/accelerate/deepspeed_zero3.yaml"]
    )
    with pytest.raises(DataError, match="DeepSpeed's engine would own.*configs/accelerate/fsdp"):
        plan_report(ds, ROOT)
    plans = {}
    for launch in ("ddp", "fsdp"):
        cfg = load_train_config(
            recipe, [f"plan.accelerate_config=configs/accelerate/{launch}.yaml", "model.lora=null"]
        )
        plans[launch] = plan_report(cfg, ROOT)
    ddp_text, ddp = plans["ddp"]
    fsdp_text, fsdp = plans["fsdp"]
    assert not ddp.fits and "12 B per trainable param" in ddp_text
    assert fsdp.fits and "8 B per trainable param" in fsdp_text and "x 4 B, stage 3" in fsdp_text


def test_a_layout_that_does_not_fit_the_machine_is_refused_with_the_arithmetic() -> None:
    from memsifter.errors import DataError
    from memsifter.training.plan import check_layout

    cfg = load_train_config(ROOT / "configs/train/qwen3_4b_one_node.yaml")
    check_layout(cfg, processes=6, visible=8)
    with pytest.raises(DataError, match=r"needs 8 GPUs \(6 training \+ 1 rollout \+ 1 answerer\)"):
        check_layout(cfg, processes=6, visible=4)
    with pytest.raises(DataError, match="plans 6 training processes .* 8 were launched"):
        check_layout(cfg, processes=8, visible=8)
    with pytest.raises(DataError, match="the roles need 9 GPUs"):
        load_train_config(ROOT / "configs/train/qwen3_4b_one_node.yaml", ["plan.gpus=7"])
    # Roles on separate machines: nothing to check here.
    check_layout(load_train_config(QWEN3_4B), processes=8, visible=1)
