"""The released MemSifter proxy's contract (memsifter.ranker.official) against what the official
functions produced: the user message byte for byte on every rendering fixture, and the parse
(then the toolkit's completion) on every odd completion. The fixtures were made once by running
the official code at the commit they name (tests/fixtures/official_memsifter/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from memsifter.data.types import Session, Turn
from memsifter.ranker.official import SOURCE, official_messages, parse_official

FIXTURES = Path(__file__).parents[1] / "fixtures" / "official_memsifter"
RENDER = json.loads((FIXTURES / "render.json").read_text(encoding="utf-8"))
PARSE = json.loads((FIXTURES / "parse.json").read_text(encoding="utf-8"))


def _sessions(case: dict[str, Any]) -> list[Session]:
    out = [
        Session(
            id=f"s{i}",
            # LoCoMo-shaped turns name a speaker, LongMemEval-shaped ones a role.
            turns=tuple(
                Turn(t.get("speaker", t.get("role")), t.get("text", t.get("content")))
                for t in s["turns"]
            ),
            date_text=s.get("date"),
        )
        for i, s in enumerate(case["sessions"])
    ]
    shown = case.get("shown")
    return out if shown is None else [out[i] for i in shown]


def test_the_fixtures_name_their_source_and_cover_the_goal() -> None:
    assert RENDER["source"]["repo"] == PARSE["source"]["repo"] == "plageon/MemSifter"
    assert SOURCE.split("@")[1] in " ".join(RENDER["source"]["files"])
    rendered = [c for c in RENDER["cases"] if "user" in c]
    assert len(rendered) >= 20 and len(PARSE["cases"]) >= 30
    names = " ".join(c["name"] for c in rendered)
    assert "locomo" in names and "lme" in names and "no_dates" in names


@pytest.mark.parametrize(
    "case", [c for c in RENDER["cases"] if "user" in c], ids=lambda c: c["name"]
)
def test_the_user_message_is_the_official_one_byte_for_byte(case: dict[str, Any]) -> None:
    assert official_messages(case["question"], _sessions(case)) == [
        {"role": "user", "content": case["user"]}
    ]


@pytest.mark.parametrize("case", PARSE["cases"], ids=lambda c: repr(c["completion"])[:40])
def test_the_parse_and_its_completion_are_the_official_ones(case: dict[str, Any]) -> None:
    n = case["n_sessions"]
    parsed = parse_official(case["completion"], n)
    official = case["parsed"]
    seen: list[int] = []
    for i in official:
        if 0 <= i < n and i not in seen:
            seen.append(i)
    assert list(parsed.ids) == seen
    assert parsed.ok == bool(seen)
    # The toolkit shows the candidates in coarse order and appends what the model left out
    # by index: in local positions that is completing from the identity order.
    if case.get("toolkit_local_order") is not None:
        assert list(parsed.complete(range(n)).ids) == case["toolkit_local_order"]


# --------------------------------------------------------------------------- through our doors


class _Recording:
    """A FakeTokenizer whose template knows enable_thinking (as Qwen3's does) and records the
    arguments it is rendered with."""

    def __init__(self) -> None:
        from memsifter.testing.backends import FakeTokenizer

        self.inner = FakeTokenizer()
        self.kwargs: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    chat_template = "... enable_thinking ..."

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self.inner(*a, **kw)

    def apply_chat_template(self, messages: Any, **kw: Any) -> str:
        self.kwargs.append({k: v for k, v in kw.items() if k not in ("tokenize",)})
        return self.inner.apply_chat_template(messages, **kw)


def _official_spec() -> Any:
    from memsifter.ranker.checkpoint import resolve_spec

    return resolve_spec("local/MemSifter-4B-Thinking", "official")


def test_the_official_preset_is_the_training_scripts_settings() -> None:
    from memsifter.ranker.official import SETTINGS
    from memsifter.ranker.spec import PromptSpec

    spec = _official_spec()
    assert spec.template == "official" and spec.model == "local/MemSifter-4B-Thinking"
    assert spec.order == "chronological" and spec.ranking_head == "generate" and spec.ask_think
    assert spec.to_dict()["template"] == "official" and "template" not in PromptSpec().to_dict()
    assert {k: getattr(spec, k) for k in SETTINGS} == SETTINGS
    for bad, field in (
        ({"ranking_head": "first_token", "ask_think": False}, "ranking_head"),
        ({"unit": "page"}, "unit"),
        ({"language": "zh"}, "language"),
    ):
        with pytest.raises(ValueError, match=f"cannot take .*{field}"):
            PromptSpec(template="official", **bad)


def test_the_builder_renders_the_official_message_with_the_models_template_untouched() -> None:
    from memsifter.coarse import build_filter

    case = next(c for c in RENDER["cases"] if c["name"] == "lme_3_sessions")
    sessions = _sessions(case)
    tok = _Recording()
    spec = _official_spec()

    spec = dataclasses.replace(spec, coarse="bm25", window_tokens=8192, completion_tokens=1024)
    built = spec.builder(tok, build_filter("bm25")).build(
        case["question"], sessions, case["question_date"]
    )
    assert built.candidate_ids == tuple(s.id for s in sessions)
    assert built.messages == [{"role": "user", "content": case["user"]}]
    assert built.text == tok.inner.apply_chat_template(built.messages, add_generation_prompt=True)
    # The released model was trained with no template arguments: no enable_thinking.
    assert tok.kwargs and all("enable_thinking" not in kw for kw in tok.kwargs)


def test_the_proxy_reads_the_answer_by_the_official_rules_and_completes_from_coarse() -> None:
    from memsifter.coarse import build_filter
    from memsifter.ranker.proxy import Proxy
    from memsifter.testing.backends import ScriptedBackend

    case = next(c for c in RENDER["cases"] if c["name"] == "lme_3_sessions")
    sessions = _sessions(case)
    spec = _official_spec()

    spec = dataclasses.replace(spec, coarse="bm25", window_tokens=8192, completion_tokens=1024)
    answers = ["<think>2 has it</think><ranking>2, 7, 2</ranking>", "<ranking>1</ranking>"]
    backend = ScriptedBackend.replying(answers, tokenizer=_Recording())
    proxy = Proxy(backend, spec, build_filter("bm25"))
    prior = [s.id for s in sessions[::-1]]
    got = proxy.rank(case["question"], sessions, prior=prior)
    assert got.parsed.ids[0] == 2 and got.parsed.dropped == 1 and got.parsed.duplicates == 1
    assert list(got.ranking.ids) == ["s2", "s1", "s0"]  # the rest in the prior's order
    assert backend.prompts[0] == got.prompt.text
    # No </think>: the official parser reads nothing; the prior's order answers.
    failed = proxy.rank(case["question"], sessions, prior=prior)
    assert not failed.parsed.ok and list(failed.ranking.ids) == prior


def test_the_wrong_contract_is_refused_or_warned_by_name(caplog: pytest.LogCaptureFixture) -> None:
    from memsifter.ranker.checkpoint import PromptSpecError, resolve_spec

    # Ours, told it is the released model: refused, naming the field.
    with pytest.raises(PromptSpecError, match="template: 'official'"):
        resolve_spec("memsifter-smollm2-135m-locomo", "official")
    # The released model shown our prompt: warned by name.
    with caplog.at_level("WARNING"):
        resolve_spec("zstanjj/MemSifter-4B-Thinking", {"window_tokens": 32768})
    assert "named like the released MemSifter proxy" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        resolve_spec("zstanjj/MemSifter-4B-Thinking", "official")
    assert "released MemSifter" not in caplog.text


def test_a_released_folder_without_a_chat_template_is_refused_naming_it() -> None:
    from memsifter.coarse import build_filter
    from memsifter.errors import DataError
    from memsifter.testing.backends import FakeTokenizer

    class NoTemplate(FakeTokenizer):
        chat_template = None
        name_or_path = "/models/MemSifter-4B-Thinking"

    with pytest.raises(DataError, match="MemSifter-4B-Thinking has none"):
        _official_spec().builder(NoTemplate(), build_filter("bm25"))


def test_the_released_proxy_config_serves_it_on_its_own_contract() -> None:
    from memsifter.serving.config import load_serve_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_serve_config(root / "configs/serve/released_proxy.yaml")
    spec = cfg.proxy.prompt_spec()
    assert spec.template == "official" and spec.model == "zstanjj/MemSifter-4B-Thinking"
    assert (cfg.coarse, cfg.proxy.max_candidates, cfg.proxy.temperature) == ("bge-m3", 20, 0.6)
    # Whole sessions, the unit it was trained on: a page holds every turn a session may have.
    assert cfg.paging.turns_per_page >= cfg.limits.max_turns_per_session


def test_a_released_folder_whose_tokenizer_outgrows_its_config_is_refused(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    import shutil

    from transformers import AutoTokenizer

    from memsifter.coarse import build_filter
    from memsifter.errors import DataError

    released = tmp_path / "MemSifter-4B-Thinking"
    shutil.copytree(tiny_qwen3, released)
    spec = _official_spec()
    tok = AutoTokenizer.from_pretrained(released)
    spec.builder(tok, build_filter("bm25"))  # the folder as built: its tokenizer fits
    config = json.loads((released / "config.json").read_text())
    config["vocab_size"] = len(tok) - 1
    (released / "config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match="vocab_size.*not the same model's") as e:
        spec.builder(AutoTokenizer.from_pretrained(released), build_filter("bm25"))
    assert "config.json" in str(e.value)
