"""A CPU dress rehearsal of the paper-scale recipes, both heads, end to end to a served recall.

Each recipe's own files are loaded and only what a CPU cannot hold is changed:
- the generate head: configs/train/qwen3_4b.yaml with configs/data/qwen3_4b.yaml;
- the first-token head: configs/train/qwen3_4b_first_token.yaml with
  configs/data/qwen3_4b_first_token.yaml;
- the reward: configs/rewards/qwen3_4b.yaml, inherited with ``base:``.

What changes: the model is a tiny random Qwen3, the window is 768 tokens of LoCoMo pages (the
mini fixture, BM25 in front), the batch is a few prompts, the run is 2 steps of one epoch, and
validation runs in transformers. The generate recipe gets a cold start, because a random model
writes no ranking, and nothing would then reach the answerer. Everything else runs as configured:
the head's marker read, LoRA and gradient checkpointing, dynamic sampling and the soft checks.

The run, per head:
1. ``accelerate launch`` starts 2 processes (DDP over gloo) running ``memsifter train``; the
   first-token head runs a second time sharded, launched as ``configs/accelerate/fsdp.yaml``
   launches (FSDP2 over gloo).
2. The reward's working LLM is a real OpenAI-compatible server: the vLLM CPU server serving the
   tiny model, reached through ``--answerer-url``.
3. Checkpoint saves, validation and averaging happen on the main process.
4. The final model ships: the head's LoRA update is exported as an adapter of the base; the
   generate recipe's full fine-tune changes the embeddings too, which no adapter can carry, so it
   ships as its whole folder. It is opened with ``Proxy.from_pretrained`` and served: a recall
   through ``/v1/users/{u}/recall`` ranks with it.

What CPU cannot rehearse, and what covers it instead:
- NCCL's weight sync to a ``trl vllm-serve`` rollout node: ``scripts/gpu_smoke.sh`` (two GPUs).
- In-process vLLM validation: ``tests/training/test_train_loop.py``, with the engine stubbed.
- DeepSpeed ZeRO-3 (the generate head's): deepspeed is the ``gpu`` extra's and is not installed
  here; the head's sharding is FSDP2's, rehearsed here.
- bf16 and sdpa's flash kernel: ``scripts/gpu_check.sh`` (one GPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {
    "generate": ("configs/train/qwen3_4b.yaml", "configs/data/qwen3_4b.yaml"),
    "first_token": (
        "configs/train/qwen3_4b_first_token.yaml",
        "configs/data/qwen3_4b_first_token.yaml",
    ),
}


def _data(head: str, model: Path, locomo: Path, out: Path) -> Path:
    from memsifter.training.rldata.build import prepare_rl_data
    from memsifter.training.rldata.recipe import load_rl_data_config

    recipe = load_rl_data_config(ROOT / RECIPES[head][1])
    source = dataclasses.replace(
        recipe.sources[0], path=str(locomo), count=4, train_conversations=[0, 1],
        validation_conversations=[2], test_conversations=[],
    )  # fmt: skip
    prompt = dataclasses.replace(
        recipe.prompt, model=str(model), window_tokens=768, coarse="bm25", unit="page",
        turns_per_page=2, completion_tokens=0 if head == "first_token" else 96,
    )  # fmt: skip
    prepare_rl_data(dataclasses.replace(recipe, sources=[source], prompt=prompt), out)
    return out


def _train_config(
    head: str, model: Path, data: Path, tmp: Path, *, answerer: Path, name: str
) -> Path:
    from memsifter.training.config import load_train_config

    reward = tmp / f"{name}-reward.yaml"
    reward.write_text(
        yaml.safe_dump(
            {
                "base": str(ROOT / "configs/rewards/qwen3_4b.yaml"),
                "answerer": {"model": str(answerer), "window_tokens": 512, "max_new_tokens": 8},
            }
        )
    )
    common = [
        f"output_dir={tmp / name}", f"data={data}", f"reward={reward}",
        f"model.name={model}", "model.context_tokens=768", "epochs.epochs=1",
        "epochs.max_steps=2", "epochs.save_steps=1", "epochs.validation_max_questions=2",
        "epochs.validation_backend=transformers", "epochs.validation_engine_args={}",
        "epochs.rescore_curriculum=false", "tracking.backend=none", "threads=1",
        "barrier_timeout_s=600",
    ]  # fmt: skip
    if head == "generate":
        common += [
            "grpo.use_vllm=false", "grpo.num_generations=2", "grpo.per_device_train_batch_size=2",
            "grpo.gradient_accumulation_steps=1", "grpo.steps_per_generation=1",
            "grpo.max_completion_length=96", "grpo.soft_overlong=null",
            "grpo.learning_rate=1e-3",
            # A random model writes no ranking, so nothing would reach the answerer: the
            # cold start teaches the format first (the 4B thinking model needs none).
            "sft.enabled=true", "sft.epochs=10", "sft.per_device_train_batch_size=2",
            "sft.learning_rate=5e-3",
        ]  # fmt: skip
    else:
        common += ["grpo.gradient_accumulation_steps=1", "grpo.learning_rate=1e-3"]
    cfg = load_train_config(ROOT / RECIPES[head][0], common)
    path = tmp / f"{name}-train.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    return path


def _served_recall(adapter: Path, db_url: str) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from memsifter.serving.app import create_app
    from memsifter.serving.config import ApiKeySettings, PagingSettings, ProxySettings, ServeConfig
    from memsifter.serving.store import hash_key

    key = "key-dress-rehearsal-0123456789"
    cfg = ServeConfig(
        db_url=db_url, coarse="bm25", ranker="proxy",
        proxy=ProxySettings(model=str(adapter), backend="transformers", max_candidates=6),
        paging=PagingSettings(turns_per_page=2),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(key))],
    )  # fmt: skip
    sessions = [
        {"id": f"s{i}", "date": f"2024-05-0{i + 1}T10:00:00",
         "turns": [{"speaker": "user", "text": t}, {"speaker": "assistant", "text": "Noted."}]}
        for i, t in enumerate(["My dog is called Max.", "I run the Lisbon half marathon.",
                               "My sister marries in Porto."])
    ]  # fmt: skip
    with TestClient(create_app(cfg), headers={"Authorization": f"Bearer {key}"}) as client:
        r = client.post("/v1/users/ana/sessions", json={"sessions": sessions})
        assert r.status_code == 201, r.text
        r = client.post("/v1/users/ana/recall", json={"question": "Where is the wedding?"})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_both_heads_rehearse_the_recipe_to_a_served_recall(
    tiny_qwen3: Path, locomo_mini_path: Path, tmp_path: Path
) -> None:
    import json

    from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
    from memsifter.ranker.checkpoint import read_spec, save_spec
    from memsifter.ranker.first_token import MARKER_TOKEN
    from memsifter.ranker.proxy import Proxy
    from memsifter.testing import build_tiny_qwen3
    from memsifter.testing.launch import accelerate_launch
    from memsifter.training.adapter_export import export_adapter

    # The head's marker read takes one token's logit: a tokenizer that keeps it whole.
    marker_model = build_tiny_qwen3(
        tmp_path / "tiny-qwen3-marker", extra_corpus=(f"Relevant?{MARKER_TOKEN}",) * 50
    )
    policies = {"generate": tiny_qwen3, "first_token": marker_model}
    runs = [("generate", False), ("first_token", False), ("first_token", True)]
    with launch_vllm_cpu_server(tiny_qwen3, served_model_name=str(tiny_qwen3), timeout=300) as url:
        for head, fsdp in runs:
            policy, name = policies[head], head + ("-fsdp" if fsdp else "")
            data = tmp_path / f"{head}-rl"
            if not data.exists():
                _data(head, policy, locomo_mini_path, data)
            config = _train_config(head, policy, data, tmp_path, answerer=tiny_qwen3, name=name)
            done = accelerate_launch(
                "memsifter.cli", ["train", str(config), "--answerer-url", url],
                processes=2, root=ROOT, module=True, fsdp=fsdp,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
            out = tmp_path / name
            said = done.stdout + done.stderr
            assert ("sharded with FSDP2 over 2 processes" in said) == fsdp, said[-4000:]
            summary = json.loads((out / "summary.json").read_text())
            results = json.loads((out / "epoch-0" / "validation.json").read_text())
            assert {"start", "checkpoint-1", "checkpoint-2", "averaged"} <= set(results)
            assert (out / "epoch-0" / "averaged" / "averaging.json").is_file()
            assert not list((out / "epoch-0").glob("checkpoint-*/optimizer*"))  # pruned
            # The reward's working LLM answered over HTTP: the service counted its calls.
            state = json.loads((out / "epoch-0" / "trainer_state.json").read_text())
            calls = sum(e.get("reward/answer_calls", 0) for e in state["log_history"])
            assert calls > 0, state["log_history"]

            shipped = Path(summary["model"])
            if head == "first_token":  # LoRA: the update ships as an adapter of the base
                shipped = tmp_path / f"{name}-adapter"
                export_adapter(str(policy), summary["model"], shipped, rank=64)
                save_spec(read_spec(summary["model"]), shipped)
            proxy = Proxy.from_pretrained(str(shipped))
            assert proxy.spec.ranking_head == head
            recalled = _served_recall(shipped, f"sqlite:///{tmp_path / name}.db")
            assert "proxy" in recalled["ranker"] and recalled["hits"]
