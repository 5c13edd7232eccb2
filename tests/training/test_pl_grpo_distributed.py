"""The first-token head's trainer scaled out (memsifter.training.pl_grpo, "Scale-out"): two
processes under ``accelerate launch`` (torchrun underneath, gloo on CPU) make the same updates as
one process accumulating two micro-batches over the same global batch, with the whole batch's
std under ``scale_rewards: batch``; and one process accumulating two micro-batches makes the same
update as one micro-batch of both (fast)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "training" / "_pl_grpo_driver.py"
STEPS = 2
# Two processes against one accumulating the same two micro-batches: the same forwards, and the
# same gradients once halved (exact in float32), summed in another order. Every side runs torch on
# one thread (memsifter.testing.launch for the launched processes, ``one_thread`` here): on
# another thread count a CPU's matmuls sum in another order, and Adam's normalised step turns
# those last bits of near-zero gradients into visible differences (CI measured 1.2e-5 with two
# threads; here one thread against two gives 3.4e-5, one against one 0.0). A step moves some
# weight by 0.002, 200 times this.
ATOL = 1e-5
# One micro-batch of 32 prompts against two of 16: other padding widths and batched matmuls, so
# float32 sums differ in their last bits (measured: 4e-5 after two steps).
ACCUM_ATOL = 1e-4


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from memsifter.testing.gym import gym_rl_data

    world = {"seed": 0, "level": "single", "size": "ci", "users": 40}
    return gym_rl_data(
        tmp_path_factory.mktemp("pl_dist"), world, ROOT / "configs/data/gym_first_token.yaml"
    )


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread, as each launched process runs: the kernels sum in the same order."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _one_process(gym: dict[str, Path], out: Path, *overrides: str, train_it: bool = True) -> Any:
    from datasets import load_dataset

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.config import load_train_config
    from memsifter.training.pl_grpo import PLGRPOTrainer

    cfg = load_train_config(
        ROOT / "configs/train/gym_pl_outcome.yaml",
        [f"output_dir={out}", f"data={gym['data']}", f"model.name={gym['proxy']}", *overrides],
    )
    train = load_dataset("parquet", data_files=str(gym["data"] / "train.parquet"), split="train")
    fn = make_reward_function(RewardService.from_config(load_reward_config(ROOT / cfg.reward)))
    fn.set_total_steps(cfg.epochs.max_steps)
    trainer = PLGRPOTrainer(cfg, str(gym["proxy"]), train, fn, out, log=lambda _: None)
    if train_it:
        trainer.train()
    return trainer


def _steps(micro: int, accum: int, scale: str) -> list[str]:
    return [
        f"grpo.per_device_train_batch_size={micro}",
        f"grpo.gradient_accumulation_steps={accum}",
        f"grpo.scale_rewards={scale}",
        f"epochs.max_steps={STEPS}",
        "epochs.save_steps=0",
    ]


def _max_diff(a: Any, b: Any) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_accumulated_micro_batches_make_the_one_batch_update(
    gym: dict[str, Path], tmp_path: Path, scale: str
) -> None:
    whole = _one_process(gym, tmp_path / "whole", *_steps(32, 1, scale))
    split = _one_process(gym, tmp_path / "split", *_steps(16, 2, scale))
    assert [e["reward"] for e in split.state.log_history] == [
        e["reward"] for e in whole.state.log_history
    ]
    assert _max_diff(whole.model.parameters(), split.model.parameters()) < ACCUM_ATOL


def test_a_resume_reads_the_optimizer_state_by_name_as_a_sharded_run_writes_it(
    gym: dict[str, Path], tmp_path: Path
) -> None:
    """A checkpoint whose ``optimizer.pt`` is by parameter name (the form a sharded run gathers
    and writes) resumes in one process and ends where the uninterrupted run did; the AdamW
    moments are the saved ones, not fresh (the control: a resume without them ends elsewhere)."""
    from memsifter.errors import DataError
    from memsifter.training.sharding import PREFIX, optimizer_state_for

    common = [*_steps(16, 1, "group")[:-1], "epochs.save_steps=1"]
    run = _one_process(gym, tmp_path / "run", *common)
    ckpt = tmp_path / "run" / "checkpoint-1"
    names = [n for n, p in run.model.named_parameters() if p.requires_grad]
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    by_name = optimizer_state_for(saved, names, True, str(ckpt))
    assert all(isinstance(k, str) and k.startswith(PREFIX) for k in by_name["state"])
    torch.save(by_name, ckpt / "optimizer.pt")
    resumed = _one_process(gym, tmp_path / "resumed", *common, train_it=False)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == STEPS
    assert _max_diff(run.model.parameters(), resumed.model.parameters()) < ATOL
    torch.save({"state": {}, "param_groups": by_name["param_groups"]}, ckpt / "optimizer.pt")
    fresh = _one_process(gym, tmp_path / "fresh", *common, train_it=False)
    fresh.train(resume_from_checkpoint=str(ckpt))
    assert _max_diff(run.model.parameters(), fresh.model.parameters()) > 100 * ATOL
    other = {"state": {}, "param_groups": [{**by_name["param_groups"][0], "params": ["lm.x"]}]}
    torch.save(other, ckpt / "optimizer.pt")
    with pytest.raises(DataError, match="holds 1 parameters and this run trains"):
        _one_process(gym, tmp_path / "other", *common, train_it=False).train(
            resume_from_checkpoint=str(ckpt)
        )


def _launch(
    gym: dict[str, Path], out: Path, *overrides: str, fsdp: bool = False
) -> subprocess.CompletedProcess:
    from memsifter.testing.launch import accelerate_launch

    args = [str(gym["data"]), str(gym["proxy"]), str(out), *overrides]
    return accelerate_launch(DRIVER, args, processes=2, root=ROOT, fsdp=fsdp)


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["batch"])
def test_two_processes_make_the_one_process_update(
    gym: dict[str, Path], tmp_path: Path, scale: str, one_thread: None
) -> None:
    """Per process one micro-batch of 2 prompts; the reference accumulates both micro-batches
    in one process. ``batch`` scaling needs the other process's rewards (the gather)."""
    out = tmp_path / "two"
    out.mkdir()
    done = _launch(gym, out, *_steps(16, 1, scale))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert not json.loads((out / "run.json").read_text())["sharded"]  # DDP: whole copies
    two = torch.load(out / "w.pt", weights_only=True)
    one = _one_process(gym, tmp_path / "one", *_steps(16, 2, scale))
    start = _one_process(gym, tmp_path / "start", *_steps(16, 2, scale), train_it=False)
    names = [n for n, _ in one.model.named_parameters()]
    mine = [p for _, p in one.model.named_parameters()]
    moved = _max_diff(mine, [p for _, p in start.model.named_parameters()])
    assert _max_diff(mine, [two[n] for n in names]) < ATOL
    assert moved > 100 * ATOL, moved  # the steps moved the weights: the match is not vacuous
    log = json.loads((out / "log.json").read_text())
    assert [e["reward"] for e in log] == pytest.approx(
        [e["reward"] for e in one.state.log_history], abs=1e-6
    )


LORA = ("model.lora.r=4", "model.lora.alpha=8", "model.lora.dropout=0.0",
        "model.lora.target_modules=[q_proj,v_proj]", "model.lora.top_layers=1")  # fmt: skip


def _saved(ckpt: Path, lora: bool) -> dict[str, Any]:
    """A checkpoint's weights as written: the adapter's tensors, or the whole model's."""
    from safetensors.torch import load_file

    if lora:
        return load_file(ckpt / "adapter_model.safetensors")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sharded_processes_make_the_one_process_update_and_resume(
    gym: dict[str, Path], tmp_path: Path, lora: bool, one_thread: None
) -> None:
    """FSDP2 (configs/accelerate/fsdp.yaml's launch): two processes holding half the weights each
    make the one-process update, with the KL's reference sharded too (under LoRA the policy with
    its adapter off, as the one process reads it from its frozen trunk); a checkpoint is
    gathered to an ordinary model folder or adapter, the same as the one process writes, and a
    sharded resume from it ends where the run did."""
    common = ["epochs.save_steps=1", "grpo.beta=0.05", *(LORA if lora else ())]
    steps = [*_steps(16, 1, "batch")[:-1], *common]
    out = tmp_path / "sharded"
    out.mkdir()
    done = _launch(gym, out, *steps, fsdp=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    facts = json.loads((out / "run.json").read_text())
    # Sharded indeed: each process held DTensor shards, not the model.
    assert facts["world"] == 2 and facts["sharded"]
    assert set(facts["params"].values()) == {"DTensor"}
    # The KL's reference: under LoRA the policy with its adapter off, never a second copy.
    assert facts["reference_copy"] is not lora
    two = torch.load(out / "w.pt", weights_only=True)
    one = _one_process(gym, tmp_path / "one", *_steps(16, 2, "batch")[:-1], *common)
    start = _one_process(gym, tmp_path / "start", *steps, train_it=False)
    names = [n for n, _ in one.model.named_parameters()]
    mine = [p for _, p in one.model.named_parameters()]
    assert _max_diff(mine, [two[n] for n in names]) < ATOL
    assert _max_diff(mine, [p for _, p in start.model.named_parameters()]) > 100 * ATOL
    log = json.loads((out / "log.json").read_text())
    assert [e["reward"] for e in log] == pytest.approx(
        [e["reward"] for e in one.state.log_history], abs=1e-6
    )
    assert all("kl" in e for e in log)

    # The checkpoint is whole, and what the one process wrote after the same first step.
    ckpt = out / "run" / "checkpoint-1"
    saved, theirs = _saved(ckpt, lora), _saved(tmp_path / "one" / "checkpoint-1", lora)
    assert saved.keys() == theirs.keys()
    assert _max_diff([saved[k] for k in theirs], list(theirs.values())) < ATOL
    assert (ckpt / "optimizer.pt").is_file()

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    again = _launch(gym, resumed, *steps, f"resume={ckpt}", fsdp=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
    after = torch.load(resumed / "w.pt", weights_only=True)
    assert _max_diff([after[n] for n in names], [two[n] for n in names]) < ATOL
    # Across forms: the sharded checkpoint resumed in one process, and the one process's
    # checkpoint resumed sharded, each end where the run did.
    accumulated = [*_steps(16, 2, "batch")[:-1], *common]  # one process, both micro-batches
    single = _one_process(gym, tmp_path / "single", *accumulated, train_it=False)
    single.train(resume_from_checkpoint=str(ckpt))
    assert (
        _max_diff([p for _, p in single.model.named_parameters()], [two[n] for n in names]) < ATOL
    )
    across = tmp_path / "across"
    across.mkdir()
    theirs_ckpt = tmp_path / "one" / "checkpoint-1"
    done = _launch(gym, across, *steps, f"resume={theirs_ckpt}", fsdp=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    after = torch.load(across / "w.pt", weights_only=True)
    assert _max_diff([after[n] for n in names], [two[n] for n in names]) < ATOL


def test_checkpointing_schedule_and_fp32_masters(gym: dict[str, Path], tmp_path: Path) -> None:
    """Gradient checkpointing recomputes, it does not change the update; the LR follows the
    schedule with its warm-up; bf16 weights are stepped through float32 masters and AdamW's
    moments are float32."""
    base = _steps(32, 1, "group")
    plain = _one_process(gym, tmp_path / "plain", *base)
    ckpt = _one_process(gym, tmp_path / "ckpt", *base, "model.gradient_checkpointing=true")
    assert _max_diff(plain.model.parameters(), ckpt.model.parameters()) < ACCUM_ATOL
    assert ckpt.model.is_gradient_checkpointing

    sched = _one_process(
        gym, tmp_path / "sched", *base, "grpo.lr_scheduler_type=linear", "grpo.warmup_steps=0.5"
    )
    lr = sched.g.learning_rate
    # Two updates, the first of them warm-up: after it the LR peaked, after both it reached 0.
    assert sched.sched.get_last_lr() == [pytest.approx(0.0)]
    assert sched.master is None  # float32 weights need no masters

    bf16 = _one_process(gym, tmp_path / "bf16", *base, "model.dtype=bfloat16")
    assert bf16.master is not None and all(m.dtype == torch.float32 for m in bf16.master)
    moments = [v for st in bf16.opt.state.values() for v in st.values() if torch.is_tensor(v)]
    assert moments and all(v.dtype == torch.float32 for v in moments if v.dim())
    for m, p in zip(bf16.master, bf16.params, strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, m.to(torch.bfloat16))
    assert lr > 0


def test_bf16_checkpoints_are_averaged_from_their_float32_masters(
    gym: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from memsifter.training.averaging import MASTER_FILE, average_checkpoints

    out = tmp_path / "bf16"
    trainer = _one_process(
        gym, out, *_steps(32, 1, "group")[:-1], "epochs.save_steps=1", "model.dtype=bfloat16"
    )
    ckpts = [out / "checkpoint-1", out / "checkpoint-2"]
    masters = [torch.load(c / MASTER_FILE, weights_only=True) for c in ckpts]
    assert set(masters[0]) == {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    average_checkpoints(ckpts, tmp_path / "avg", dtype="fp32")
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    name = next(iter(masters[0]))
    want = (masters[0][name] + masters[1][name]) / 2
    assert torch.equal(averaged[name], want)  # the float32 mean, not the bf16 weights' mean
    for c in ckpts:
        (c / MASTER_FILE).unlink()
    average_checkpoints(ckpts, tmp_path / "avg_rounded", dtype="fp32")
    rounded = load_file(tmp_path / "avg_rounded" / "model.safetensors")[name]
    assert not torch.equal(rounded, want)  # the control: without masters the mean is rounded
