"""The scale-out recipes, checked on CPU: every accelerate config loads with the installed
accelerate's own loader and launch-argument processing, and scripts/train_multinode.sh prints
commands that accelerate, TRL's vllm-serve and `memsifter train` all parse, or stops naming the
variable that is missing."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_DIR = ROOT / "configs" / "accelerate"
SCRIPT = ROOT / "scripts" / "train_multinode.sh"
EXPECTED = {"ddp": "MULTI_GPU", "deepspeed_zero3": "DEEPSPEED", "fsdp": "FSDP"}
TRAINER_ENV = {
    "CONFIG": "configs/train/qwen3_4b.yaml",
    "VLLM_HOST": "10.0.0.3",
    "ANSWERER_URL": "http://10.0.0.4:8001/v1",
}


def test_every_config_is_expected() -> None:
    assert {p.stem for p in ACCELERATE_DIR.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_config_loads(name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    path = ACCELERATE_DIR / f"{name}.yaml"
    config = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type.value == EXPECTED[name]
    assert config.mixed_precision == "bf16"
    assert (config.num_processes, config.num_machines, config.machine_rank) == (8, 1, 0)

    # accelerate copies nested keys onto launch arguments without checking them, so a misspelt
    # one would be silently ignored: each must be a launch argument of this accelerate.
    known = set(vars(launch_command_parser().parse_args(["x.py"])))
    nested = {k if k.startswith("fsdp") else f"fsdp_{k}" for k in config.fsdp_config or {}}
    nested |= set(config.deepspeed_config or {})
    assert nested <= known, nested - known
    # `memsifter merge` needs a plain model.safetensors in each checkpoint.
    if name == "deepspeed_zero3":
        assert config.deepspeed_config["zero_stage"] == 3
        assert config.deepspeed_config["zero3_save_16bit_model"] is True
    if name == "fsdp":
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # A clean environment: the caller's own NNODES or CONFIG must not leak into the test.
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**base, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _command(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert res.returncode == 0, res.stderr
    cd, command = res.stdout.strip().splitlines()
    assert shlex.split(cd) == ["cd", str(ROOT)]
    return shlex.split(command)


@pytest.mark.parametrize("strategy", sorted(EXPECTED))
def test_trainer_dry_run_parses(strategy: str) -> None:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    env = {**TRAINER_ENV, "STRATEGY": strategy, "NNODES": "2", "NODE_RANK": "1"}
    env["MASTER_ADDR"] = "10.0.0.1"
    argv = _command(_run("--role", "trainer", "--dry-run", **env))
    assert argv[:2] == ["accelerate", "launch"]
    args = launch_command_parser().parse_args(argv[2:])
    args, _, _ = _validate_launch_command(args)
    assert args.config_file == str(ACCELERATE_DIR / f"{strategy}.yaml")
    assert (args.num_machines, args.num_processes, args.machine_rank) == (2, 16, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.0.0.1", 29500)
    assert args.use_deepspeed == (strategy == "deepspeed_zero3")
    assert args.use_fsdp == (strategy == "fsdp")
    assert args.module and args.training_script == "memsifter.cli"

    train_args = args.training_script_args
    assert train_args == [
        "train",
        str(ROOT / TRAINER_ENV["CONFIG"]),
        "--vllm-server-host",
        "10.0.0.3",
        "--answerer-url",
        "http://10.0.0.4:8001/v1",
    ]
    _parses_as_memsifter_train(train_args)


def _parses_as_memsifter_train(train_args: list[str], until: str | None = None) -> None:
    import typer.main

    from memsifter.cli import app

    group = typer.main.get_command(app)
    train = group.commands["train"]  # type: ignore[attr-defined]
    ctx = train.make_context("train", list(train_args[1:]))
    assert ctx.params["vllm_server_host"] in (None, "10.0.0.3")
    assert ctx.params["answerer_url"] == "http://10.0.0.4:8001/v1"
    assert ctx.params["until"] == until  # the whole run unless asked to stop after SFT


def test_trainer_single_node_and_colocate() -> None:
    env = {**TRAINER_ENV, "VLLM_MODE": "colocate"}
    del env["VLLM_HOST"]
    argv = _command(_run("--role", "trainer", "--dry-run", "--", "--output-dir", "/x", **env))
    assert "--vllm-server-host" not in argv
    i = argv.index("--num_processes")
    assert argv[i : i + 2] == ["--num_processes", "8"]
    assert argv[argv.index("--main_process_ip") + 1] == "127.0.0.1"
    assert argv[argv.index("--config_file") + 1].endswith("deepspeed_zero3.yaml")
    assert argv[-2:] == ["--output-dir", "/x"]
    _parses_as_memsifter_train(argv[argv.index("train") :])


def test_trainer_forwards_until_sft() -> None:
    env = {**TRAINER_ENV, "VLLM_MODE": "colocate"}
    del env["VLLM_HOST"]
    argv = _command(_run("--role", "trainer", "--dry-run", "--", "--until", "sft", **env))
    assert argv[-2:] == ["--until", "sft"]
    _parses_as_memsifter_train(argv[argv.index("train") :], until="sft")


def test_rollout_dry_run_parses_as_trl_vllm_serve(tmp_path: Path) -> None:
    """The rollout server serves the training config's policy with its 128K window, and YaRN
    where the base needs it: trl vllm-serve takes the window, and hands --hf-overrides on to
    `vllm serve` unchanged."""
    import json
    import sys

    import yaml
    from trl.scripts.vllm_serve import make_parser

    env = {"CONFIG": TRAINER_ENV["CONFIG"], "VLLM_TP": "2", "VLLM_DP": "4"}
    argv = _command(_run("--role", "rollout", "--dry-run", PYTHON=sys.executable, **env))
    assert argv[:2] == ["trl", "vllm-serve"]
    args, rest = make_parser().parse_args_and_config(argv[2:], return_remaining_strings=True)
    assert args.model == "Qwen/Qwen3-4B-Thinking-2507"  # the paper's base: 262K positions
    assert (args.tensor_parallel_size, args.data_parallel_size) == (2, 4)
    assert (args.host, args.port, args.max_model_len) == ("0.0.0.0", 8000, 131072)
    assert rest == []  # no rope override: its own positions reach the window

    # The original Qwen3-4B (40,960 positions) in the same recipe: YaRN x4 travels along.
    recipe = yaml.safe_load((ROOT / TRAINER_ENV["CONFIG"]).read_text())
    recipe["model"]["name"] = "Qwen/Qwen3-4B"
    recipe["model"]["rope_scaling"] = {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
        "rope_theta": 1000000,
    }  # fmt: skip
    original = tmp_path / "qwen3_4b_original.yaml"
    original.write_text(yaml.safe_dump(recipe))
    argv = _command(
        _run(
            "--role",
            "rollout",
            "--dry-run",
            PYTHON=sys.executable,
            **{**env, "CONFIG": str(original)},
        )
    )
    args, rest = make_parser().parse_args_and_config(argv[2:], return_remaining_strings=True)
    assert args.model == "Qwen/Qwen3-4B"
    assert rest[0] == "--hf-overrides" and len(rest) == 2
    assert json.loads(rest[1]) == {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "rope_theta": 1000000,
        }
    }
    local = _command(
        _run("--role", "rollout", "--dry-run", PYTHON=sys.executable, POLICY_MODEL="/m", **env)
    )
    assert local[local.index("--model") + 1] == "/m"
    res = _run("--role", "rollout", "--dry-run", PYTHON=sys.executable)
    assert res.returncode != 0 and "CONFIG is not set" in res.stderr


def test_answerer_dry_run() -> None:
    argv = _command(_run("--role", "answerer", "--dry-run", ANSWERER_SERVED_NAME="working-llm"))
    assert argv == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "0.0.0.0", "--port", "8001",
        "--tensor-parallel-size", "1", "--served-model-name", "working-llm",
    ]  # fmt: skip


def test_judge_dry_run() -> None:
    argv = _command(_run("--role", "judge", "--dry-run", JUDGE_TP="2", JUDGE_SERVED_NAME="judge"))
    assert argv == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "0.0.0.0", "--port", "8002",
        "--tensor-parallel-size", "2", "--served-model-name", "judge",
    ]  # fmt: skip


def test_trainer_forwards_the_judge_url() -> None:
    import typer.main

    from memsifter.cli import app

    env = {**TRAINER_ENV, "JUDGE_URL": "http://10.0.0.5:8002/v1"}
    argv = _command(_run("--role", "trainer", "--dry-run", **env))
    i = argv.index("--judge-url")
    assert argv[i + 1] == "http://10.0.0.5:8002/v1"
    train = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    ctx = train.make_context("train", argv[argv.index("train") + 1 :])
    assert ctx.params["judge_url"] == "http://10.0.0.5:8002/v1"
    # Without JUDGE_URL nothing is passed: the run itself refuses judged sources (tested in
    # tests/training/test_scorers.py).
    assert "--judge-url" not in _command(_run("--role", "trainer", "--dry-run", **TRAINER_ENV))


@pytest.mark.parametrize(
    ("missing", "extra"),
    [
        ("CONFIG", {}),
        ("ANSWERER_URL", {}),
        ("VLLM_HOST", {}),
        ("NODE_RANK", {"NNODES": "2", "MASTER_ADDR": "10.0.0.1"}),
        ("MASTER_ADDR", {"NNODES": "2", "NODE_RANK": "0"}),
    ],
)
def test_missing_variable_is_named(missing: str, extra: dict[str, str]) -> None:
    env = {**TRAINER_ENV, **extra}
    env.pop(missing, None)
    res = _run("--role", "trainer", "--dry-run", **env)
    assert res.returncode != 0
    assert f"{missing} is not set" in res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "no role given"),
        (("--role", "referee"), {}, "unknown role 'referee'"),
        (("--role", "trainer"), {**TRAINER_ENV, "STRATEGY": "zero2"}, "STRATEGY=zero2"),
        (("--role", "trainer"), {**TRAINER_ENV, "CONFIG": "nope.yaml"}, "CONFIG=nope.yaml"),
        (("--role", "trainer"), {**TRAINER_ENV, "NNODES": "two"}, "NNODES must be"),
        (("--bogus",), {}, "unknown argument '--bogus'"),
    ],
)
def test_bad_invocations(args: tuple[str, ...], env: dict[str, str], message: str) -> None:
    res = _run(*args, "--dry-run", **env)
    assert res.returncode != 0
    assert message in res.stderr
