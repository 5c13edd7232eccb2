"""The command line built from the configs (memsifter.config_cli): a field is a flag with no CLI
edit, the YAML file comes first and typed flags override it, the flags users type today are kept,
and every field of the eval configs is a flag or named in the command's help as YAML-only."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from memsifter.cli import (
    PROXY_EVAL_FLAGS,
    QA_FLAGS,
    RETRIEVAL_FLAGS,
    app,
)
from memsifter.config import setting
from memsifter.config_cli import Flag, config_flags, config_options
from memsifter.errors import MemSifterError
from memsifter.evaluation.config import ProxyEvalConfig, QAEvalConfig, RetrievalEvalConfig


@dataclass
class Toy:
    name: str = setting("a", help="a name")
    count: int = setting(2, help="how many")
    rate: float = setting(0.5, help="a rate")
    on: bool = setting(True, help="switch")
    where: Path | None = setting(None, help="a folder")
    mode: Literal["fast", "slow"] = setting("fast", help="fast | slow")
    tags: list[str] = setting(default_factory=lambda: ["x"], help="tags")
    ids: list[str] | None = setting(None, help="ids")
    spec: dict[str, Any] | str | None = setting(None, help="a path, or a mapping in YAML")
    extra: dict[str, Any] = setting(default_factory=dict, help="free-form")


def toy_app(cls: type, seen: list, flags: dict[str, Flag] | None = None) -> typer.Typer:
    """A two-command app (typer would fold a single command into the root) running ``cls``."""

    def fail(e: MemSifterError):
        typer.echo(f"error: {e}")
        raise typer.Exit(2)

    toy = typer.Typer()

    @toy.command("run")
    @config_options(cls, flags=flags, on_error=fail)
    def run(cfg) -> None:
        """Run the toy."""
        seen.append(cfg)

    @toy.command("other")
    def other() -> None:
        """Nothing."""

    return toy


def invoke(app_: typer.Typer, *args: str):
    return CliRunner().invoke(app_, list(args))


def test_every_scalar_type_is_a_flag_and_defaults_are_the_dataclass() -> None:
    seen: list[Toy] = []
    toy = toy_app(Toy, seen, {"ids": Flag(comma=True), "tags": Flag("--tag")})
    res = invoke(toy, "run")
    assert res.exit_code == 0, res.output
    assert seen.pop() == Toy()
    res = invoke(toy, "run", "--name", "b", "--count", "3", "--rate", "1e-3", "--no-on")
    assert res.exit_code == 0, res.output
    res = invoke(
        toy, "run", "--where", "w", "--mode", "slow", "--tag", "p", "--tag", "q",
        "--ids", "1, 2", "--spec", "s.json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    second, first = seen.pop(), seen.pop()
    assert (first.name, first.count, first.rate, first.on) == ("b", 3, 1e-3, False)
    assert second.where == Path("w") and second.mode == "slow" and second.spec == "s.json"
    assert second.tags == ["p", "q"] and second.ids == ["1", "2"]
    assert invoke(toy, "run", "--mode", "medium").exit_code == 2  # a Literal is a choice
    assert invoke(toy, "run", "--count", "many").exit_code == 2
    assert invoke(toy, "run", "--extra", "x").exit_code == 2  # a mapping has no flag


def test_help_shows_each_fields_help_default_and_the_yaml_only_fields() -> None:
    res = CliRunner().invoke(toy_app(Toy, []), ["run", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for text in ("how many", "fast | slow", "--no-on", "--tags", "(repeatable)", "--spec"):
        assert text in res.output
    assert "[default: 2]" in res.output
    assert "config file only (no flag): extra" in res.output
    options, yaml_only = config_flags(Toy)
    assert yaml_only == ["extra"] and [o.field for o in options][:2] == ["name", "count"]


def test_a_new_config_field_is_a_flag_with_no_cli_edit() -> None:
    """A field added to RetrievalEvalConfig shows up on `eval retrieval`'s command line as is,
    beside the command's kept flags."""
    grown = dataclasses.make_dataclass(
        "GrownRetrievalEvalConfig",
        [("rerank_depth", int, setting(7, help="a new knob"))],
        bases=(RetrievalEvalConfig,),
    )
    seen: list[Any] = []
    toy = toy_app(grown, seen, RETRIEVAL_FLAGS)
    assert "a new knob" in invoke(toy, "run", "--help").output
    res = invoke(toy, "run", "--rerank-depth", "3", "--retriever", "bm25", "--retriever", "minilm")
    assert res.exit_code == 0, res.output
    assert seen[0].rerank_depth == 3 and seen[0].retrievers == ["bm25", "minilm"]
    assert invoke(toy, "run").exit_code == 0 and seen[1].rerank_depth == 7


def test_yaml_first_then_every_typed_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 3\nhaystack: 32k\nretrievers: [bm25, minilm]\nconversations: ['8']\n")
    seen: list[RetrievalEvalConfig] = []
    toy = toy_app(RetrievalEvalConfig, seen, RETRIEVAL_FLAGS)
    # --seed 0 is the default's value, typed: it overrides the file's 3
    res = invoke(toy, "run", "--config", str(cfg), "--seed", "0", "--conversations", "0,1")
    assert res.exit_code == 0, res.output
    (got,) = seen
    assert got.seed == 0 and got.haystack == "32k" and got.retrievers == ["bm25", "minilm"]
    assert got.conversations == ["0", "1"]
    cfg.write_text("retreivers: [bm25]\n")
    res = invoke(toy, "run", "--config", str(cfg))
    assert res.exit_code == 2 and "retreivers" in res.output and "c.yaml" in res.output
    res = invoke(toy, "run", "--config", str(tmp_path / "none.yaml"))
    assert res.exit_code == 2 and "config file not found" in res.output


def test_a_field_without_default_is_required_here_or_in_the_yaml(tmp_path: Path) -> None:
    seen: list[ProxyEvalConfig] = []
    toy = toy_app(ProxyEvalConfig, seen, PROXY_EVAL_FLAGS)
    res = invoke(toy, "run", "--split", "test")
    assert res.exit_code == 2 and "missing --data" in res.output
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: d\nmodels: [[a, path/a]]\n")
    assert invoke(toy, "run", "--config", str(cfg), "--pair", "a-bm25").exit_code == 0
    assert seen[0].data == "d" and seen[0].models == [("a", "path/a")]
    assert seen[0].pairs == ["a-bm25"]


@pytest.mark.parametrize(
    ("command", "cls", "flags"),
    [
        ("retrieval", RetrievalEvalConfig, RETRIEVAL_FLAGS),
        ("qa", QAEvalConfig, QA_FLAGS),
        ("proxy", ProxyEvalConfig, PROXY_EVAL_FLAGS),
    ],
)
def test_every_eval_config_field_is_a_flag_or_named_yaml_only(command, cls, flags) -> None:
    click_cmd = get_command(app).commands["eval"].commands[command]  # type: ignore[attr-defined]
    by_field = {p.name: p for p in click_cmd.params}
    _, yaml_only = config_flags(cls, flags)
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
        assert f.name in by_field or f.name in yaml_only, f.name
    for name in yaml_only:
        assert name in (click_cmd.help or "")
    res = CliRunner().invoke(app, ["eval", command, "--help"])
    assert res.exit_code == 0, res.output


def test_kept_flag_names() -> None:
    """The flags users and scripts type, where they differ from the field name."""

    def opts(command: str) -> set[str]:
        cmd = get_command(app).commands["eval"].commands[command]  # type: ignore[attr-defined]
        return {o for p in cmd.params for o in p.opts}

    assert {"--retriever", "--completion-tokens", "--prompt-spec", "--conversations"} <= opts(
        "retrieval"
    )
    assert {"--prompt", "--prompt-spec", "--completion-tokens", "--top-k"} <= opts("qa")
    assert {"--model", "--run", "--pair", "--explicit-spec", "--out-json"} <= opts("proxy")


def test_eval_commands_build_their_config_from_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real commands, up to the benchmark call."""
    seen: list[Any] = []

    def capture(cfg, console=None):
        seen.append(cfg)
        raise MemSifterError("stop")

    for module, name in [
        ("retrieval", "run_retrieval_eval"),
        ("qa", "run_qa_eval"),
        ("proxy_eval", "run_proxy_eval"),
    ]:
        monkeypatch.setattr(f"memsifter.evaluation.{module}.{name}", capture)
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["eval", "retrieval", "--retriever", "bm25", "--retriever", "memsifter",
         "--completion-tokens", "9", "--prompt-spec", "spec.json", "--conversations", "8, 9"],
    )  # fmt: skip
    assert res.exit_code == 2 and "stop" in res.output
    r = seen.pop()
    assert r.retrievers == ["bm25", "memsifter"] and r.proxy_completion_tokens == 9
    assert r.prompt == "spec.json" and r.conversations == ["8", "9"]
    res = runner.invoke(
        app, ["eval", "qa", "--prompt", "locomo", "--prompt-spec", "s", "--no-include-no-evidence"]
    )
    assert res.exit_code == 2, res.output
    q = seen.pop()
    assert q.answer_prompt == "locomo" and q.prompt == "s" and q.include_no_evidence is False
    # every other field as the dataclass has it ($MEMSIFTER_LOCOMO may move the data default)
    want = QAEvalConfig(answer_prompt="locomo", prompt="s", include_no_evidence=False)
    assert dataclasses.replace(q, data=want.data) == want
    res = runner.invoke(
        app, ["eval", "proxy", "--data", "d", "--model", "a=p", "--run", "b=r.jsonl"]
    )
    assert res.exit_code == 2, res.output
    p = seen.pop()
    assert p.models == [("a", "p")] and p.runs == [("b", "r.jsonl")] and p.data == "d"
    res = runner.invoke(app, ["eval", "proxy", "--data", "d", "--run", "no-equals"])
    assert res.exit_code == 2 and "--run 'no-equals': write NAME=PATH" in res.output
