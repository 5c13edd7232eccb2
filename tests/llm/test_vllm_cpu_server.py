"""``launch_vllm_cpu_server``: the process handling against stand-in scripts (fast), and a real
vLLM CPU server on the converted SmolLM2 (slow, needs ``.venv-vllm``).

The real test skips when ``.venv-vllm`` is absent, unless ``MEMSIFTER_REQUIRE_VLLM`` is set (CI
builds the venv and sets it, so there a missing venv is a failure, not a silent skip).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from memsifter.llm import vllm_cpu
from memsifter.llm.vllm_cpu import VllmServerError, launch_vllm_cpu_server
from memsifter.testing.server import FAKE_LAUNCHER, alive, group_gone, stand_in_launcher

# ---- fast: stand-in scripts ------------------------------------------------------------------


def _script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    stand_in_launcher(vllm_cpu, tmp_path, monkeypatch, text)
    model = tmp_path / "model"
    model.mkdir()
    return model


def test_yields_base_url_and_stops_the_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _script(tmp_path, monkeypatch, FAKE_LAUNCHER)
    with launch_vllm_cpu_server(model, timeout=30, served_model_name="m") as base_url:
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with urllib.request.urlopen(f"{base_url}/models") as r:
            assert json.load(r)["data"][0]["id"] == "m"
        assert all(alive(int((tmp_path / n).read_text())) for n in ("leader", "child"))
    assert group_gone(tmp_path)


def test_startup_failure_raises_with_the_log_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _script(
        tmp_path,
        monkeypatch,
        '[ "$1" = --setup-only ] && exit 0\necho "boom: no such architecture" >&2\nexit 3\n',
    )
    with pytest.raises(VllmServerError, match=r"exited with 3(.|\n)*boom: no such architecture"):
        with launch_vllm_cpu_server(model, timeout=30):
            pass


def test_startup_timeout_raises_and_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = '[ "$1" = --setup-only ] && exit 0\necho $$ > "$PIDS/leader"\necho loading\n'
    model = _script(tmp_path, monkeypatch, script + "exec sleep 300\n")
    with pytest.raises(VllmServerError, match=r"did not answer(.|\n)*loading"):
        with launch_vllm_cpu_server(model, timeout=1):
            pass
    assert not alive(int((tmp_path / "leader").read_text()))


def test_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(VllmServerError, match="does not exist"):
        with launch_vllm_cpu_server(tmp_path / "nope"):
            pass


# ---- slow: the real server ------------------------------------------------------------------


def _chat(base_url: str, model: str, content: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_real_vllm_cpu_server_serves_smollm2(request: pytest.FixtureRequest) -> None:
    # Requested only now, so a skip does not first pay for the ~20 s conversion.
    smollm2_dir: Path = request.getfixturevalue("smollm2_dir")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = "smollm2-135m-instruct"
    question = "What is the capital of France? Answer in one sentence."
    with launch_vllm_cpu_server(smollm2_dir, served_model_name=name, timeout=300) as base_url:
        with urllib.request.urlopen(f"{base_url}/models") as r:
            assert [m["id"] for m in json.load(r)["data"]] == [name]
        reply = _chat(base_url, name, question, max_tokens=24)

    choice = reply["choices"][0]
    text = choice["message"]["content"]
    assert "Paris" in text
    assert choice["finish_reason"] == "stop"  # stopped on <|im_end|>, not on max_tokens

    # The server renders the same chat template and decodes greedily, so it says what
    # transformers says from the same folder.
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(prompt, return_tensors="pt")
    assert reply["usage"]["prompt_tokens"] == ids.input_ids.shape[1]
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    assert text == tok.decode(out[0, ids.input_ids.shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_proxy_rankings_over_http_agree_with_transformers(
    request: pytest.FixtureRequest, locomo_mini_path: Path
) -> None:
    """LoCoMo-style proxy prompts through the OpenAI backend against the real server: every
    answer parses to a valid ranking or a typed error, and greedy fp32 outputs match the
    transformers backend's, except at near-ties of the logits (explained divergences)."""
    smollm2_dir: Path = request.getfixturevalue("smollm2_dir")
    import torch

    from memsifter.coarse import BM25Filter
    from memsifter.data import load_locomo
    from memsifter.evaluation.agreement import compare_greedy
    from memsifter.llm import BackendSpec, SamplingParams, build_backend
    from memsifter.ranker import PromptBuilder, parse_ranking
    from memsifter.ranker.first_token import engine_scores, head_scores, order_scores

    hf = build_backend(
        BackendSpec(kind="transformers", model=str(smollm2_dir), batch_size=1, threads=2)
    )
    builder = PromptBuilder(hf.tokenizer, 1264, 48, coarse=BM25Filter())
    queries = [q for q in load_locomo(locomo_mini_path).queries if q.has_evidence][:4]
    prompts = [builder.build_query(q) for q in queries]
    sampling = SamplingParams(max_new_tokens=48)
    name = "smollm2-135m-instruct"
    with launch_vllm_cpu_server(smollm2_dir, served_model_name=name, timeout=300) as base_url:
        http = build_backend(
            BackendSpec(
                kind="openai", model=str(smollm2_dir), base_url=base_url, served_model_name=name
            )
        )
        served = [g[0] for g in http.generate([p.text for p in prompts], sampling)]
        # The first-token head on the same server: max_tokens 1, the top logprobs as ids.
        head = PromptBuilder(
            hf.tokenizer, 1264, 0, coarse=BM25Filter(), ask_think=False, ranking_head="first_token"
        )
        heads = [head.build_query(q) for q in queries]
        ns = [p.num_candidates for p in heads]
        served_head = engine_scores(http, [list(p.token_ids) for p in heads], ns)
    local = [g[0] for g in hf.generate([p.text for p in prompts], sampling)]

    with torch.no_grad():
        local_head = [
            head_scores(hf.model, hf.tokenizer, [p.text], [n])[0].tolist()
            for p, n in zip(heads, ns, strict=True)
        ]
    for got, ref in zip(served_head, local_head, strict=True):
        a, b = order_scores(got), order_scores(ref)
        # The same ranking, but where two candidates' logits are within 1e-3 (a near-tie).
        assert all(x == y or abs(ref[x] - ref[y]) < 1e-3 for x, y in zip(a, b, strict=True)), (
            a,
            b,
        )

    for p, g in zip(prompts, served, strict=True):
        assert g.prompt_tokens == p.n_tokens  # byte-identical prompts on both sides
        parsed = parse_ranking(g.text, p.num_candidates)
        assert all(0 <= i < p.num_candidates for i in parsed.ids)
        assert len(set(parsed.ids)) == len(parsed.ids)
        assert parsed.ok or not parsed.ids
        assert sorted(parsed.complete(range(p.num_candidates)).ids) == list(range(p.num_candidates))
    report = compare_greedy(
        hf.model,
        hf.tokenizer,
        [p.text for p in prompts],
        [g.text for g in local],
        [g.text for g in served],
    )
    print(f"agreement {report.identical}/{report.n}; divergences: {report.divergences}")
    assert not report.unexplained, report.unexplained
