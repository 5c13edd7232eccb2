"""One prompt contract (issue 11): the recall service, eval and the RL data all render a model's
prompt from its PromptSpec, so a checkpoint is served byte-identical prompts to the ones it was
trained on. Models without a spec need an explicit one; explicit settings that contradict a
model's own spec are refused."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from memsifter.coarse import build_filter
from memsifter.data import load_locomo
from memsifter.data.types import Query
from memsifter.data.units import to_units
from memsifter.errors import DataError
from memsifter.llm import Generation, SamplingParams
from memsifter.ranker.checkpoint import PromptSpecError, merge_settings, resolve_spec, save_spec
from memsifter.ranker.proxy import Proxy
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.config import ProxySettings, ServeConfig, load_serve_config
from memsifter.serving.ranking import ServiceRanker


def _spec(**kw: Any) -> PromptSpec:
    base = dict(model="tiny-qwen3", window_tokens=1400, completion_tokens=60, unit="page")
    base.update(turns_per_page=2, order="coarse", ask_think=False)
    base.update(kw)
    return PromptSpec(**base)  # type: ignore[arg-type]


def _with_spec(tiny_qwen3: Path, folder: Path, spec: PromptSpec) -> Path:
    shutil.copytree(tiny_qwen3, folder)
    save_spec(spec, folder)
    return folder


@pytest.fixture(scope="module")
def query(locomo_mini_path: Path) -> Query:
    q = next(q for q in load_locomo(locomo_mini_path).queries if q.has_evidence)
    return to_units(q, "page", 2)


def _serve_yaml(tmp_path: Path, model: Path | str, extra: str = "", pages: int = 2) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(
        f"db_url: sqlite:///{tmp_path / 'm.db'}\n"
        "coarse: bm25\n"
        "ranker: proxy\n"
        "proxy:\n"
        "  backend: transformers\n"
        f"  model: {model}\n"
        "  max_candidates: 1000\n" + extra + f"paging:\n  turns_per_page: {pages}\n"
    )
    return path


class _Recorder:
    """Stands in for the loaded model's generate: keeps the prompts, answers a fixed ranking."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.caps: list[int] = []

    def __call__(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        self.prompts += prompts
        self.caps.append(sampling.max_new_tokens)
        return [[Generation("<ranking>1, 0</ranking>", 1, 1, "stop", 0.0)] for _ in prompts]


@pytest.mark.parametrize(
    "spec",
    [
        _spec(),  # coarse order, pages; the window cuts most pages
        _spec(order="chronological", ask_think=True, window_tokens=1800, completion_tokens=200),
        _spec(window_tokens=30000, completion_tokens=100),  # everything fits
    ],
    ids=["coarse-cut", "chronological-think", "coarse-all-fit"],
)
def test_served_prompt_is_the_rl_data_prompt(
    spec: PromptSpec, tiny_qwen3: Path, tmp_path: Path, query: Query
) -> None:
    from memsifter.models import load_tokenizer

    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", spec)
    config = load_serve_config(_serve_yaml(tmp_path, model))
    assert config.proxy.prompt_spec() == spec
    ranker = ServiceRanker.from_config(config)  # what `memsifter serve` builds
    assert ranker.proxy is not None and ranker.proxy.spec == spec
    recorder = _Recorder()
    ranker.backend.generate = recorder  # type: ignore[union-attr,method-assign]
    pages = list(query.haystack)
    outcome = ranker.rank(query.question, pages, tenant="acme", question_date=query.question_date)
    assert outcome.parse.status == "ok"
    (served,) = recorder.prompts
    assert recorder.caps == [spec.completion_tokens]  # the generation cap is the spec's

    # What the RL data is built with: the spec's own builder, on the spec's tokenizer.
    tok = load_tokenizer(str(model))
    builder = spec.builder(tok)
    direct = builder.build(query.question, pages, query.question_date)
    assert served == direct.text
    ids = tok(served, add_special_tokens=False)["input_ids"]
    assert ids == tok(direct.text, add_special_tokens=False)["input_ids"]
    assert len(ids) == direct.n_tokens <= spec.budget_tokens
    try:
        from memsifter.training.rldata.build import build_row
    except ImportError as e:  # the training extra is optional
        pytest.skip(f"training code unavailable: {e}")
    row = build_row(query, "locomo", spec.builder(tok), build_filter(spec.coarse))
    text = row["prompt"] if isinstance(row["prompt"], str) else builder.render(row["prompt"])
    assert text == served


def test_eval_proxy_uses_the_models_spec(tiny_qwen3: Path, tmp_path: Path) -> None:
    from memsifter.evaluation.retrieval import RetrievalEvalConfig, build_proxy, proxy_spec

    spec = _spec()
    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", spec)
    cfg = RetrievalEvalConfig(model=str(model), retrievers=["memsifter"])
    assert proxy_spec(cfg) == spec
    proxy = build_proxy(cfg)
    assert proxy.spec == spec and proxy.builder.order == "coarse"
    same = RetrievalEvalConfig(model=str(model), coarse="bm25", proxy_completion_tokens=60)
    assert proxy_spec(same) == spec  # repeating the spec is fine
    clash = RetrievalEvalConfig(model=str(model), coarse_budget=999, proxy_language="zh")
    with pytest.raises(PromptSpecError) as e:
        proxy_spec(clash)
    assert "budget_tokens: 999" in str(e.value) and "language: 'zh'" in str(e.value)


def test_eval_refuses_a_model_without_spec_unless_given_one(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    from memsifter.evaluation.retrieval import RetrievalEvalConfig, proxy_spec

    with pytest.raises(PromptSpecError, match=f"model '{tiny_qwen3}' has no prompt_spec.json"):
        proxy_spec(RetrievalEvalConfig(model=str(tiny_qwen3)))
    flags = RetrievalEvalConfig(
        model=str(tiny_qwen3), coarse_budget=1500, proxy_completion_tokens=24
    )
    got = proxy_spec(flags)
    assert (got.window_tokens, got.completion_tokens, got.model) == (1524, 24, str(tiny_qwen3))
    spec_file = save_spec(_spec(), tmp_path / "rl-data")
    for given in (str(spec_file), str(tmp_path / "rl-data")):  # the file, or its folder
        assert proxy_spec(RetrievalEvalConfig(model=str(tiny_qwen3), prompt=given)) == _spec()
    with pytest.raises(PromptSpecError, match="window_tokens"):
        proxy_spec(
            RetrievalEvalConfig(
                model=str(tiny_qwen3), prompt={"window_tokens": 2000}, coarse_budget=100
            )
        )


def test_serve_refuses_a_model_without_spec(tiny_qwen3: Path, tmp_path: Path) -> None:
    path = _serve_yaml(tmp_path, tiny_qwen3)
    with pytest.raises(DataError) as e:
        load_serve_config(path)
    msg = str(e.value)
    assert f"model '{tiny_qwen3}' has no prompt_spec.json" in msg and "proxy.prompt" in msg
    assert str(path) in msg  # names the config file
    given = _serve_yaml(
        tmp_path, tiny_qwen3, "  prompt:\n    window_tokens: 1000\n    completion_tokens: 50\n"
    )
    spec = load_serve_config(given).proxy.prompt_spec()
    assert (spec.window_tokens, spec.completion_tokens, spec.unit) == (1000, 50, "session")
    with pytest.raises(ValueError, match="has no prompt_spec.json"):
        ServeConfig(
            ranker="proxy", proxy=ProxySettings(backend="transformers", model=str(tiny_qwen3))
        )
    # The coarse ranker needs no spec, and a proxy block it does not use is not checked.
    ServeConfig(proxy=ProxySettings(backend="transformers", model=str(tiny_qwen3)))


def test_serve_refuses_settings_that_contradict_the_models_spec(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", _spec())
    clash = "  prompt:\n    window_tokens: 2048\n    order: chronological\n    unit: page\n"
    with pytest.raises(DataError) as e:
        load_serve_config(_serve_yaml(tmp_path, model, clash))
    msg = str(e.value)
    assert "window_tokens: 2048 (the model's spec: 1400)" in msg
    assert "order: 'chronological' (the model's spec: 'coarse')" in msg
    assert "unit" not in msg.split("contradict it:")[1].split(". Drop")[0]  # equal: not listed
    with pytest.raises(DataError, match="paging.turns_per_page is 4.*pages of 2 turns"):
        load_serve_config(_serve_yaml(tmp_path, model, pages=4))
    with pytest.raises(DataError, match="unknown prompt setting"):
        load_serve_config(_serve_yaml(tmp_path, model, "  prompt:\n    windw: 1\n"))


def test_resolve_spec_rules(tiny_qwen3: Path, tmp_path: Path) -> None:
    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", _spec())
    # The folder's spec, as is, even when its model field names another (the base's) name.
    assert resolve_spec(str(model), {"model": "other", "budget_tokens": 1340}) == _spec()
    with pytest.raises(PromptSpecError, match="conflicting prompt settings: language"):
        merge_settings(("prompt", {"language": "en"}), ("flags", {"language": "zh"}))
    assert merge_settings(("a", {"language": "en"}), ("b", {"language": None})) == {
        "language": "en"
    }
    with pytest.raises(PromptSpecError, match="invalid prompt spec"):
        resolve_spec("some/hub-model", {"window_tokens": 10, "completion_tokens": 20})


class _Scripted:
    name = "scripted"
    model_name = "scripted"

    def __init__(self, tok: Any, text: str) -> None:
        self._tok, self.text = tok, text

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        return [[Generation(self.text, 1, 1, "stop", 0.0)] for _ in prompts]


class _CountingBM25:
    def __init__(self) -> None:
        self.inner = build_filter("bm25")
        self.name = self.inner.name
        self.scored = 0

    def score(self, question: str, sessions: Sequence[Any]) -> Any:
        self.scored += 1
        return self.inner.score(question, sessions)

    def select(self, *a: Any, **k: Any) -> Any:
        return self.inner.select(*a, **k)


def test_completion_with_coarse_order_uses_the_shown_order(tiny_qwen3: Path, query: Query) -> None:
    """With order: coarse the prompt is shown in the coarse filter's order, and a partial
    ranking is completed from BuiltPrompt.coarse_order, never from a second scoring."""
    from memsifter.models import load_tokenizer

    coarse = _CountingBM25()
    spec = _spec(window_tokens=30000, completion_tokens=100)
    proxy = Proxy(_Scripted(load_tokenizer(str(tiny_qwen3)), "<ranking>3</ranking>"), spec, coarse)
    r = proxy.rank(query.question, query.haystack[:6], query.question_date)
    assert coarse.scored == 1  # the builder's one ranking
    assert r.prompt.coarse_order == tuple(range(6))  # the shown order is the coarse order
    assert r.parsed.ids == (3, 0, 1, 2, 4, 5) and r.completed


def test_proxy_takes_a_spec(tiny_qwen3: Path) -> None:
    from memsifter.models import load_tokenizer

    be = _Scripted(load_tokenizer(str(tiny_qwen3)), "")
    with pytest.raises(TypeError, match="spec must be a PromptSpec"):
        Proxy(be, build_filter("bm25"))  # type: ignore[arg-type]
    assert Proxy(be, _spec(coarse="bm25")).coarse.name == build_filter("bm25").name


def test_from_pretrained_is_the_one_front_door(tiny_qwen3: Path, tmp_path: Path) -> None:
    """A checkpoint opens with its own spec; keyword overrides may repeat it but not contradict
    it (both values named, before any model loads); a model without a spec takes them as its
    spec; a backend already built is used as is."""
    from memsifter.models import CARRIED_FILES, load_tokenizer
    from memsifter.ranker.checkpoint import SPEC_FILE

    assert SPEC_FILE in CARRIED_FILES  # a merged adapter keeps the spec
    spec = _spec()
    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", spec)
    proxy = Proxy.from_pretrained(str(model), order="coarse")
    assert proxy.spec == spec and proxy.backend.name == "transformers"
    with pytest.raises(PromptSpecError, match=r"window_tokens: 999 \(the model's spec: 1400\)"):
        Proxy.from_pretrained(str(model), backend="no-such-backend", window_tokens=999)
    with pytest.raises(PromptSpecError, match="conflicting prompt settings: language"):
        Proxy.from_pretrained(str(model), prompt={"language": "en"}, language="zh")
    be = _Scripted(load_tokenizer(str(tiny_qwen3)), "<ranking>1, 0</ranking>")
    base = Proxy.from_pretrained("some/hub-model", backend=be, budget_tokens=940, language="en")
    assert base.backend is be
    assert base.spec == PromptSpec(model="some/hub-model", window_tokens=1964, language="en")


def test_rendered_and_built_prompts_share_one_answer_path(tiny_qwen3: Path, query: Query) -> None:
    """What eval and validation score (a prompt rendered earlier) is answered and parsed as the
    service's own rendering is; only ranking completes a partial answer."""
    from memsifter.models import load_tokenizer
    from memsifter.ranker.proxy import ProxyParams, RenderedPrompt

    recorder = _Recorder()
    be = _Scripted(load_tokenizer(str(tiny_qwen3)), "")
    be.generate = recorder  # type: ignore[method-assign]
    spec = _spec(window_tokens=30000, completion_tokens=100)
    proxy = Proxy(be, spec, config=ProxyParams(batch_size=None, max_new_tokens=7))
    ranked = proxy.rank(query.question, query.haystack[:3], query.question_date)
    heard: list[int] = []
    (answer,) = proxy.answer([RenderedPrompt(ranked.prompt.text, 3)], lambda n, s: heard.append(n))
    assert recorder.prompts == [ranked.prompt.text] * 2 and recorder.caps == [7, 7]
    assert answer.generation == ranked.generation and answer.parsed.ids == (1, 0)
    assert not answer.parsed.completed_from and ranked.parsed.ids == (1, 0, 2)
    assert heard == [1]


def test_eval_retrieval_cli_refuses_then_runs_on_the_models_pages(
    tiny_qwen3: Path, tmp_path: Path, locomo_mini_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from memsifter.cli import app

    def run(model: Path, *extra: str) -> Any:
        args = ["eval", "retrieval", "--data", str(locomo_mini_path), "--retriever", "bm25"]
        args += ["--retriever", "memsifter", "--model", str(model), "--max-questions", "2"]
        return CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), *extra])

    def said(res: Any) -> str:
        # rich folds the error at the terminal's width, so where the lines break depends on how
        # long the (temporary) model path is: compare with the whitespace collapsed.
        return " ".join(res.output.split())

    res = run(tiny_qwen3)
    assert res.exit_code == 2 and "has no prompt_spec.json" in said(res)
    model = _with_spec(tiny_qwen3, tmp_path / "ckpt", _spec(completion_tokens=8, window_tokens=900))
    res = run(model, "--completion-tokens", "9")
    assert res.exit_code == 2 and "completion_tokens: 9 (the model's spec: 8)" in said(res)
    res = run(model)
    assert res.exit_code == 0, res.output
    sub = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("memsifter")]
    m = json.loads((sub[0] / "metrics.json").read_text())
    assert m["unit"] == "page" and m["proxy"]["prompt_spec"]["window_tokens"] == 900
    assert m["proxy"]["prompt_budget_tokens"] == 892
