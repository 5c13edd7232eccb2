"""`train`, `data rl` and `serve` take their options from their configs (memsifter.config_cli),
with every flag they had before still parsing."""

from __future__ import annotations

from pathlib import Path

import typer.main
from typer.testing import CliRunner

from memsifter.cli import app

ROOT = Path(__file__).resolve().parents[1]
TRAIN_CFG = ROOT / "configs/train/smollm2_cpu.yaml"


def _command(name: str):  # noqa: ANN202 - a click command
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def test_train_field_flag_help_and_override(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["train", "--help"], terminal_width=200)
    assert "--barrier-timeout-s" in res.output and "--reward" in res.output
    cfg = tmp_path / "t.yaml"
    cfg.write_text(TRAIN_CFG.read_text() + "\noutput_dir: from_yaml\n")
    ctx = _command("train").make_context("train", [str(cfg), "--output-dir", "typed"])
    assert ctx.params["output_dir"] == "typed"
    # The typed flag beats both the file and --set (which edits the file).
    seen = {}
    import memsifter.training.grpo as grpo

    def fake(cfg, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen["cfg"] = cfg
        return {}

    orig, grpo.grpo_config_kwargs = grpo.grpo_config_kwargs, fake
    try:
        args = ["train", str(cfg), "--dry-run", "--set", "threads=3", "--set", "output_dir=s"]
        res = CliRunner().invoke(app, [*args, "--output-dir", "typed"])
        assert res.exit_code == 0, res.output
        assert seen["cfg"].output_dir == "typed" and seen["cfg"].threads == 3
        assert seen["cfg"].source == str(cfg) and seen["cfg"].overrides == args[4::2]
        res = CliRunner().invoke(app, args)
        assert seen["cfg"].output_dir == "s"
        res = CliRunner().invoke(app, ["train", str(cfg), "--dry-run"])
        assert seen["cfg"].output_dir == "from_yaml"
    finally:
        grpo.grpo_config_kwargs = orig


def test_train_every_old_flag_parses() -> None:
    old = [str(TRAIN_CFG), "--vllm-server-host", "h", "--answerer-url", "a", "--judge-url", "j",
           "--output-dir", "o", "--dry-run", "--plan", "--vllm-args", "--until", "sft",
           "--set", "threads=1", "--set", "seed=2",
           "--no-dry-run", "--no-plan", "--no-vllm-args"]  # fmt: skip
    p = _command("train").make_context("train", old).params
    assert p["config"] == TRAIN_CFG and p["set_"] == ["threads=1", "seed=2"]
    assert (p["vllm_server_host"], p["answerer_url"], p["judge_url"]) == ("h", "a", "j")
    assert p["output_dir"] == "o" and p["until"] == "sft" and not p["dry_run"]


def test_serve_field_flag_help_override_and_old_flags(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    res = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    assert "--keep-alive-s" in res.output and "--db-url" in res.output
    old = ["--config", "c.yaml", "--host", "0.0.0.0", "--port", "9", "--seed-sample",
           "--log-level", "debug", "--workers", "2"]  # fmt: skip
    p = _command("serve").make_context("serve", old).params
    assert (p["host"], p["port"], p["seed_sample"], p["workers"]) == ("0.0.0.0", 9, True, 2)
    assert p["config"] == Path("c.yaml") and p["log_level"] == "debug"

    import memsifter.serving.server as server
    from memsifter.serving.config import load_serve_config

    seen = {}

    def fake(path, **kw):  # noqa: ANN001, ANN003, ANN202
        seen["cfg"], seen["path"], seen["kw"] = load_serve_config(path), path, kw

    monkeypatch.setattr(server, "serve", fake)
    monkeypatch.delenv("MEMSIFTER_SERVE_DB_URL", raising=False)
    cfg = tmp_path / "s.yaml"
    cfg.write_text("keep_alive_s: 30\ncoarse: bm25\n")
    res = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--port", "9"])
    assert res.exit_code == 0, res.output
    assert seen["path"] == cfg and seen["cfg"].keep_alive_s == 30 and seen["kw"]["port"] == 9
    res = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--keep-alive-s", "5"])
    assert res.exit_code == 0, res.output
    assert seen["cfg"].keep_alive_s == 5 and seen["path"] != cfg
    assert not Path(seen["path"]).exists()  # the copy is removed when the server stops
    res = CliRunner().invoke(app, ["serve", "--db-url", "sqlite:///x.db"])  # the packaged default
    assert res.exit_code == 0, res.output
    assert seen["cfg"].db_url == "sqlite:///x.db" and seen["cfg"].api_keys
    res = CliRunner().invoke(app, ["serve", "--ranker", "bogus"])
    assert res.exit_code == 2 and "ranker" in res.output


def test_data_rl_field_flag_and_every_old_flag(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["data", "rl", "--help"], terminal_width=200)
    assert "--seed" in res.output and "--recipe" in res.output
    assert "config file only (no flag): sources, prompt, curriculum" in res.output
    recipe = ROOT / "configs/data/gym_tiny.yaml"
    rl = typer.main.get_command(app).commands["data"].commands["rl"]  # type: ignore[attr-defined]
    old = ["--recipe", str(recipe), "--out", "o", "--data", "x=y", "--rankings", "r.jsonl",
           "--strategy", "random", "--dry-run", "--no-dry-run"]  # fmt: skip
    p = rl.make_context("rl", [*old, "--seed", "7"]).params
    assert p["config"] == recipe and p["out"] == Path("o") and p["data"] == ["x=y"]
    assert p["rankings"] == Path("r.jsonl") and p["strategy"] == "random" and p["seed"] == 7
    # A typed --seed overrides the recipe's, which the dry run's plan is built from.
    seen = {}
    import memsifter.training.rldata.build as rl_data

    def fake(cfg):  # noqa: ANN001, ANN202
        seen["seed"] = cfg.seed
        return []

    orig, rl_data.plan_sources = rl_data.plan_sources, fake
    try:
        base = ["data", "rl", "--recipe", str(recipe), "--out", str(tmp_path), "--dry-run"]
        assert CliRunner().invoke(app, [*base, "--seed", "7"]).exit_code == 0
        assert seen["seed"] == 7
        CliRunner().invoke(app, base)
        from memsifter.training.rldata.recipe import load_rl_data_config

        assert seen["seed"] == load_rl_data_config(recipe).seed
    finally:
        rl_data.plan_sources = orig
