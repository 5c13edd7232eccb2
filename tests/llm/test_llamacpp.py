"""llama.cpp as the proxy's CPU engine (``memsifter.llm.llamacpp``): the launcher's process
handling against a stand-in script and the errors without a build (fast); then the real
``llama-server`` (slow): a tiny SmolLM2-shaped model exported by ``memsifter export-gguf`` and
served, and the shipped proxy adapter merged, exported and served, both against transformers.

The real tests skip when llama.cpp is not built (``bash scripts/llamacpp_server.sh
--setup-only``), unless ``MEMSIFTER_REQUIRE_LLAMACPP`` is set (``scripts/test.sh`` builds it and
sets it, so there a missing build is a failure, not a silent skip).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from memsifter.llm import llamacpp
from memsifter.llm.llamacpp import (
    LlamaCppError,
    export_gguf,
    gguf_for,
    is_built,
    launch_llamacpp_server,
)
from memsifter.testing.server import group_gone, stand_in_launcher

ADAPTER = "memsifter-smollm2-135m-locomo"

# ---- fast: no build --------------------------------------------------------------------------


def test_launch_passes_the_settings_and_stops_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_launcher(llamacpp, tmp_path, monkeypatch)
    gguf = tmp_path / "proxy.gguf"
    gguf.write_bytes(b"GGUF")
    with launch_llamacpp_server(gguf, timeout=30, parallel=2, ctx_size=2048, threads=1) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(f"{url}/models") as r:
            assert json.load(r)["data"][0]["id"] == "proxy"  # the file's stem by default
        args = (tmp_path / "args").read_text().split()
        assert args[args.index("--model") + 1] == str(gguf)
        assert args[args.index("--ctx-size") + 1] == "2048"
        assert args[args.index("--parallel") + 1] == "2"
        assert args[args.index("--threads") + 1] == "1"
    assert group_gone(tmp_path)


def test_without_a_build_the_errors_name_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llamacpp.DIR_ENV, str(tmp_path / "none"))
    assert not is_built()
    with pytest.raises(LlamaCppError, match=r"not set up(.|\n)*llamacpp_server.sh --setup-only"):
        export_gguf("smollm2-135m-instruct", tmp_path / "out.gguf")
    with pytest.raises(LlamaCppError, match="not built"):
        with launch_llamacpp_server(tmp_path / "x.gguf", setup=False):
            pass
    with pytest.raises(LlamaCppError, match="unknown GGUF type"):
        export_gguf("smollm2-135m-instruct", tmp_path / "out.gguf", outtype="q3")


def test_export_gguf_command_fails_cleanly_without_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    monkeypatch.setenv(llamacpp.DIR_ENV, str(tmp_path / "none"))
    result = CliRunner().invoke(app, ["export-gguf", ADAPTER, str(tmp_path / "p.gguf")])
    assert result.exit_code == 2
    assert "--setup-only" in result.output
    assert not (tmp_path / "p.gguf").exists()


def test_gguf_for_takes_a_gguf_file_as_is(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert gguf_for(str(gguf)) == gguf.resolve()
    with pytest.raises(LlamaCppError, match="does not exist"):
        gguf_for(str(tmp_path / "missing.gguf"))


# ---- slow: the real llama-server -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.llamacpp_server
@pytest.mark.usefixtures("llamacpp_built")
def test_tiny_model_exported_and_served_agrees_with_transformers(tmp_path: Path) -> None:
    """``memsifter export-gguf`` on a tiny SmolLM2-shaped model, served by llama-server: a prompt
    sent as token ids is read as exactly those ids (no BOS added), the same prompt as text is
    tokenized as Hugging Face does, and greedy outputs match transformers'."""
    from typer.testing import CliRunner

    from memsifter.cli import app
    from memsifter.evaluation.agreement import compare_greedy
    from memsifter.llm import BackendSpec, SamplingParams, build_backend
    from memsifter.models import PROXIES_DIR
    from memsifter.testing import build_tiny_smollm2

    model = build_tiny_smollm2(tmp_path / "tiny", PROXIES_DIR / ADAPTER)
    gguf = tmp_path / "tiny.gguf"
    result = CliRunner().invoke(app, ["export-gguf", str(model), str(gguf)])
    assert result.exit_code == 0, result.output
    assert gguf.read_bytes()[:4] == b"GGUF"

    hf = build_backend(BackendSpec(kind="transformers", model=str(model), batch_size=1))
    tok = hf.tokenizer
    questions = [
        "Rank the sessions about my dog.",
        "What did Caroline research?",
        "Where did we go hiking, and when? <ranking>",
    ]
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    sampling = SamplingParams(max_new_tokens=24)
    with launch_llamacpp_server(gguf, served_model_name="tiny", setup=False, parallel=2) as url:
        http = build_backend(
            BackendSpec(kind="openai", model=str(model), base_url=url, served_model_name="tiny")
        )
        served = [g[0] for g in http.generate(ids, sampling)]
        as_text = [g[0] for g in http.generate(texts, sampling)]
    local = [g[0] for g in hf.generate(texts, sampling)]

    for g, p in zip(served, ids, strict=True):
        assert g.prompt_tokens == len(p)
    for g, p in zip(as_text, ids, strict=True):
        assert g.prompt_tokens == len(p)  # llama.cpp's tokenizer splits these as HF's does
    report = compare_greedy(hf.model, tok, texts, [g.text for g in local], [g.text for g in served])
    print(f"agreement {report.identical}/{report.n}; divergences: {report.divergences}")
    assert not report.unexplained, report.unexplained


@pytest.mark.slow
@pytest.mark.llamacpp_server
@pytest.mark.usefixtures("llamacpp_built")
def test_shipped_proxy_through_llamacpp_agrees_with_transformers(
    request: pytest.FixtureRequest, locomo_mini_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped adapter, merged into SmolLM2 and exported to f32 GGUF (once, in the cache),
    ranks LoCoMo-style prompts through llama-server as it does through transformers: the same
    prompt tokens, the same parse results, and greedy texts identical but for explained
    near-ties."""
    import httpx

    smollm2_cache: Path = request.getfixturevalue("smollm2_cache")
    monkeypatch.setenv("MEMSIFTER_CACHE", str(smollm2_cache))  # the session's SmolLM2
    from memsifter.data import load_locomo
    from memsifter.evaluation.agreement import compare_greedy
    from memsifter.evaluation.retrieval import proxy_units
    from memsifter.llm import BackendSpec, SamplingParams, build_backend
    from memsifter.ranker import parse_ranking
    from memsifter.ranker.checkpoint import model_spec

    spec = model_spec(ADAPTER)
    assert spec is not None
    hf = build_backend(BackendSpec(kind="transformers", model=ADAPTER, batch_size=2))
    builder = spec.builder(hf.tokenizer)
    queries = [q for q in load_locomo(locomo_mini_path).queries if q.has_evidence][:4]
    prompts = [builder.build_query(q) for q in proxy_units(queries, spec)]
    assert all(p.token_ids is not None for p in prompts)
    sampling = SamplingParams(max_new_tokens=spec.completion_tokens)
    with launch_llamacpp_server(ADAPTER, setup=False, timeout=300) as url:
        http = build_backend(BackendSpec(kind="openai", model=ADAPTER, base_url=url))
        served = [g[0] for g in http.generate([list(p.token_ids) for p in prompts], sampling)]
        # Its own tokenizer splits the rendered prompts into the ids Hugging Face's gives, so
        # a prompt sent as text (token_ids: false) is read the same way too.
        for p in prompts:
            r = httpx.post(
                f"{url.removesuffix('/v1')}/tokenize",
                json={"content": p.text, "add_special": False, "parse_special": True},
                timeout=60,
            )
            assert r.json()["tokens"] == list(p.token_ids)
    local = [g[0] for g in hf.generate([p.text for p in prompts], sampling)]
    assert next((smollm2_cache / "gguf").glob(f"{ADAPTER}-*.f32.gguf")).is_file()

    for p, g in zip(prompts, served, strict=True):
        assert g.prompt_tokens == p.n_tokens
    parsed = {
        name: [
            parse_ranking(g.text, p.num_candidates).ok for g, p in zip(gens, prompts, strict=True)
        ]
        for name, gens in (("llamacpp", served), ("transformers", local))
    }
    report = compare_greedy(
        hf.model,
        hf.tokenizer,
        [p.text for p in prompts],
        [g.text for g in local],
        [g.text for g in served],
    )
    print(f"agreement {report.identical}/{report.n}; divergences: {report.divergences}")
    assert not report.unexplained, report.unexplained
    if report.identical == report.n:
        assert parsed["llamacpp"] == parsed["transformers"]
