"""Checkpoint averaging on the tiny Qwen3: every output tensor is the fp32 mean of its inputs,
LoRA adapters are merged before averaging, mismatches are refused by name, and the output is an
ordinary model folder that loads and generates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from memsifter.cli import app
from memsifter.training.averaging import CheckpointError, average_checkpoints

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"


def _perturbed(src: Path, dst: Path, seed: int, dtype: torch.dtype | None = None) -> Path:
    """A copy of ``src`` with seeded noise on every weight, optionally cast to ``dtype``."""
    shutil.copytree(src, dst)
    weights = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    noisy = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in weights.items()}
    if dtype is not None:
        noisy = {k: v.to(dtype) for k, v in noisy.items()}
        config = json.loads((dst / "config.json").read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        (dst / "config.json").write_text(json.dumps(config))
    save_file(noisy, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for f in files for k, v in load_file(str(folder / f)).items()}
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def three(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    # One of them named like a Trainer checkpoint, with the optimizer state beside the model.
    ckpts = [_perturbed(tiny_qwen3, root / name, seed) for seed, name in enumerate("ab")]
    trainer_ckpt = _perturbed(tiny_qwen3, root / "run" / "checkpoint-30", 2)
    (trainer_ckpt / "trainer_state.json").write_text("{}")
    (trainer_ckpt / "optimizer.pt").write_bytes(b"not read")
    return [*ckpts, trainer_ckpt]


def test_every_tensor_is_the_mean(three: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    report = average_checkpoints(three, out)

    inputs = [_weights(p) for p in three]
    merged = _weights(out)
    assert set(merged) == set(inputs[0])
    for key, value in merged.items():
        expected = torch.stack([w[key] for w in inputs]).mean(dim=0)
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7, msg=key)
    assert "lm_head.weight" not in merged  # tied: the loader re-ties it to the embeddings

    saved = json.loads((out / "averaging.json").read_text())
    assert saved["inputs"] == [str(p.resolve()) for p in three]
    assert saved["dtype"] == "float32" == report.dtype
    assert saved["n_tensors"] == len(merged) == report.n_tensors
    assert saved["kinds"] == ["full"] * 3
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not list(tmp_path.glob(".merged.partial-*"))


def test_bf16_inputs_accumulate_in_fp32(tiny_qwen3: Path, tmp_path: Path) -> None:
    ckpts = [_perturbed(tiny_qwen3, tmp_path / f"c{i}", i, torch.bfloat16) for i in range(3)]
    # bf16 keeps 8 significant bits: 1 + 2**-8 rounds back to 1, so a bf16 running sum of
    # (1, 2**-8, 2**-8) loses both small terms, while the fp32 sum keeps them.
    for path, value in zip(ckpts, (1.0, 2**-8, 2**-8), strict=True):
        weights = load_file(str(path / "model.safetensors"))
        weights[NORM] = torch.full_like(weights[NORM], value)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})

    out = average_checkpoints(ckpts, tmp_path / "merged", dtype="bf16")  # asked for explicitly
    merged = _weights(tmp_path / "merged")
    assert out.dtype == "bfloat16"
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "bfloat16"
    assert all(v.dtype == torch.bfloat16 for v in merged.values())

    fp32_mean = torch.tensor((1.0 + 2**-7) / 3).to(torch.bfloat16)
    bf16_mean = torch.tensor(1.0, dtype=torch.bfloat16) / 3
    assert fp32_mean != bf16_mean
    assert torch.all(merged[NORM] == fp32_mean)

    inputs = [_weights(p) for p in ckpts]
    for key, value in merged.items():
        expected = torch.stack([w[key].float() for w in inputs]).mean(dim=0).to(torch.bfloat16)
        torch.testing.assert_close(value, expected, msg=key)

    as_fp32 = average_checkpoints(ckpts, tmp_path / "merged32")  # the default
    assert as_fp32.dtype == "float32"
    torch.testing.assert_close(
        _weights(tmp_path / "merged32")[EMBED],
        torch.stack([w[EMBED].float() for w in inputs]).mean(dim=0),
    )


def test_default_output_keeps_differences_below_bf16_resolution(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    """Two bf16 checkpoints one bf16 step apart (an epoch's small updates): their mean lies
    between two bf16 values, so only a non-bf16 output keeps it. The default writes fp32."""
    ckpts = [_perturbed(tiny_qwen3, tmp_path / f"c{i}", i, torch.bfloat16) for i in range(2)]
    low = torch.tensor(0.02, dtype=torch.bfloat16)
    high = torch.nextafter(low, torch.tensor(1.0, dtype=torch.bfloat16))
    assert 0 < high.float() - low.float() < 2e-4  # bf16's step near 0.02 is 2**-13
    for path, value in zip(ckpts, (low, high), strict=True):
        weights = load_file(str(path / "model.safetensors"))
        weights[NORM] = torch.full_like(weights[NORM], value)
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    mean = (low.float() + high.float()) / 2
    assert mean.to(torch.bfloat16) in (low, high)  # a bf16 output rounds the mean away

    report = average_checkpoints(ckpts, tmp_path / "merged")
    merged = _weights(tmp_path / "merged")
    assert report.dtype == "float32"
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "float32"
    assert all(v.dtype == torch.float32 for v in merged.values())
    assert torch.all(merged[NORM] == mean)
    assert torch.all(merged[NORM] != low.float()) and torch.all(merged[NORM] != high.float())


def test_lora_adapters_are_merged_then_averaged(tiny_qwen3: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    adapters = []
    for seed in range(3):
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
        peft_model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        )
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:  # zero at init, which would make every merge a no-op
                    param.normal_(std=0.5)
        peft_model.save_pretrained(tmp_path / f"adapter{seed}")
        adapters.append(tmp_path / f"adapter{seed}")
    config = json.loads((adapters[0] / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == tiny_qwen3

    report = average_checkpoints(adapters, tmp_path / "merged")
    assert report.kinds == ("lora",) * 3
    assert report.dtype == "float32"

    merged_states = []
    for path in adapters:
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
        merged_states.append({k: v.detach().clone() for k, v in merged.state_dict().items()})
    q_key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged_states[0][q_key], merged_states[1][q_key])

    result = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    state = result.state_dict()
    assert set(state) == set(merged_states[0])
    for key, value in state.items():
        expected = torch.stack([s[key] for s in merged_states]).mean(dim=0)
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7, msg=key)
    assert not (tmp_path / "merged" / "_merged").exists()
    # No tokenizer in the adapter folders: it comes from the base.
    assert report.tokenizer_from == str(tiny_qwen3)


def test_mismatched_shapes_name_the_tensor(three: list[Path], tmp_path: Path) -> None:
    odd = shutil.copytree(three[1], tmp_path / "odd")
    weights = load_file(str(odd / "model.safetensors"))
    weights[NORM] = weights[NORM][:-1].clone()
    save_file(weights, str(odd / "model.safetensors"), metadata={"format": "pt"})

    with pytest.raises(CheckpointError, match=rf"'{NORM}'.*{odd.name}"):
        average_checkpoints([three[0], odd], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
    assert not list(tmp_path.glob(".merged.partial-*"))


def test_mismatched_keys_and_architectures(three: list[Path], tmp_path: Path) -> None:
    fewer = shutil.copytree(three[1], tmp_path / "fewer")
    weights = load_file(str(fewer / "model.safetensors"))
    del weights[NORM]
    save_file(weights, str(fewer / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"fewer lacks tensor '{NORM}'"):
        average_checkpoints([three[0], fewer], tmp_path / "m1")

    other = shutil.copytree(three[1], tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"other has architectures=\['LlamaForCausalLM'\]"):
        average_checkpoints([three[0], other], tmp_path / "m2")

    with pytest.raises(CheckpointError, match="not an empty folder"):
        average_checkpoints(three, three[0].parent)
    with pytest.raises(CheckpointError, match="unknown dtype 'int4'"):
        average_checkpoints(three, tmp_path / "m3", dtype="int4")


def test_tied_head_saved_by_some_checkpoints(three: list[Path], tmp_path: Path) -> None:
    """A saver that writes lm_head.weight next to the tied embeddings must not break averaging,
    and the merged head must still be the merged embeddings."""
    from transformers import AutoModelForCausalLM

    with_head = shutil.copytree(three[1], tmp_path / "with_head")
    weights = load_file(str(with_head / "model.safetensors"))
    weights["lm_head.weight"] = weights[EMBED].clone()
    save_file(weights, str(with_head / "model.safetensors"), metadata={"format": "pt"})

    average_checkpoints([three[0], with_head], tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    expected = (_weights(three[0])[EMBED] + weights[EMBED]) / 2
    torch.testing.assert_close(model.get_input_embeddings().weight, expected)
    torch.testing.assert_close(model.get_output_embeddings().weight, expected)


def test_sharded_inputs_and_output(three: list[Path], tiny_qwen3: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(three[2]).save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").exists()

    out = tmp_path / "merged"
    report = average_checkpoints([three[0], sharded], out, max_shard_bytes=60_000)
    assert len(report.files) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(report.files)
    for name in report.files:
        with safe_open(str(out / name), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
    a, b = _weights(three[0]), _weights(three[2])
    merged = _weights(out)
    for key, value in merged.items():
        torch.testing.assert_close(value, (a[key] + b[key]) / 2, msg=key)
    AutoModelForCausalLM.from_pretrained(out)


def test_cli_merge_output_loads_and_generates(three: list[Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    res = CliRunner().invoke(app, ["merge", *map(str, three), "--out", str(out), "--dtype", "bf16"])
    assert res.exit_code == 0, res.output
    assert "averaged 3 checkpoints" in res.output

    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "rank these"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt")
    generated = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]

    res = CliRunner().invoke(app, ["merge", str(three[0]), "--out", str(out)])
    assert res.exit_code == 2
    assert "not an empty folder" in res.output


def test_cli_merge_defaults_to_fp32(tiny_qwen3: Path, tmp_path: Path) -> None:
    ckpts = [_perturbed(tiny_qwen3, tmp_path / f"c{i}", i, torch.bfloat16) for i in range(2)]
    out = tmp_path / "merged"
    res = CliRunner().invoke(app, ["merge", *map(str, ckpts), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "float32" in res.output
    assert json.loads((out / "averaging.json").read_text())["dtype"] == "float32"
