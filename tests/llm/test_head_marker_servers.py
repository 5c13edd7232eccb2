"""The first-token head's marker read (``head_read: marker``) through a server: the OpenAI
backend's ``marker_logits`` against stand-in servers in vLLM's shape (``POST /pooling``,
``token_classify``: the read token's logit at every token) and llama-server's (``POST
/embeddings`` with ``--pooling none``: every token's final hidden state, multiplied here by the
LM head's row), both answering from the tiny model itself (fast); then the real servers on
SmolLM2-135M-Instruct against ``head_scores(..., read="marker")`` in process, the engine-agreement
check (slow: one server start per engine).

The real tests skip when the engine is not built (``bash scripts/vllm_cpu_server.sh
--setup-only``, ``bash scripts/llamacpp_server.sh --setup-only``) unless
``MEMSIFTER_REQUIRE_VLLM`` / ``MEMSIFTER_REQUIRE_LLAMACPP`` is set (then a missing build fails).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memsifter.llm.errors import BackendError
from memsifter.llm.openai_http import SERVERS, OpenAIBackend
from memsifter.ranker.first_token import (
    RankingHeadError,
    backend_rankings,
    engine_marker_scores,
    head_scores,
    marker_positions,
    marker_token_id,
    order_scores,
    rank_prompts,
)
from memsifter.testing.rewards import topic_sessions
from memsifter.testing.tiny_models import marker_head_spec


def _prompts(tok: Any, model: str) -> tuple[list[str], list[int]]:
    from memsifter.coarse.bm25 import BM25Filter

    builder = marker_head_spec(model).builder(tok, BM25Filter())
    restated = marker_head_spec(model, layout="restated").builder(tok, BM25Filter())
    built = [
        builder.build("what about topic 3?", topic_sessions(12)),
        builder.build("topic 1?", topic_sessions(5)),
        restated.build("and topic 4, the latest?", topic_sessions(8)),  # the question restated
    ]
    return [b.text for b in built], [b.num_candidates for b in built]


def _stand_in(
    model_path: Path, shape: str, edit: Callable[[list[int], Any], Any] | None = None
) -> tuple[Any, list[tuple[str, dict]]]:
    """A mock server answering marker-read requests from the model itself: vLLM's ``/pooling``
    (``token_classify``: the read token's logit at every token, one float each) or llama-server's
    ``/embeddings`` (every token's final normed hidden state). ``edit(ids, answer)`` spoils the
    answer to the prompt ``ids`` for the error tests."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.ranker.first_token import _decoder_and_head

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    yes = marker_token_id(AutoTokenizer.from_pretrained(model_path))
    decoder, _ = _decoder_and_head(model)
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        ids = body["input"] if shape == "vllm" else body["content"]
        with torch.no_grad():
            if shape == "vllm":
                logits = model(torch.tensor([ids])).logits[0, :, yes]
                answer: Any = {
                    "object": "list",
                    "data": [
                        {"index": 0, "object": "pooling", "data": [[v] for v in logits.tolist()]}
                    ],
                }
            else:
                hidden = decoder(input_ids=torch.tensor([ids])).last_hidden_state[0]
                answer = [{"index": 0, "embedding": hidden.tolist()}]
        if edit is not None:
            answer = edit(ids, answer)
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(200, json=answer)

    return httpx.MockTransport(handler), seen


@pytest.mark.parametrize("shape", SERVERS)
def test_a_server_marker_read_ranks_as_the_in_process_head(tiny_smollm2: Path, shape: str) -> None:
    """Both server shapes give the in-process marker scores: the right endpoint and body, each
    prompt sent up to its last marker, and the same rankings through the proxy's front door."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.ranker.proxy import Proxy

    tok = AutoTokenizer.from_pretrained(tiny_smollm2)
    model = AutoModelForCausalLM.from_pretrained(tiny_smollm2).eval()
    prompts, ns = _prompts(tok, str(tiny_smollm2))
    transport, seen = _stand_in(tiny_smollm2, shape)
    be = OpenAIBackend("http://x:1/v1", model=str(tiny_smollm2), transport=transport, server=shape)
    got = engine_marker_scores(be, prompts, ns)
    with torch.no_grad():
        want = head_scores(model, tok, prompts, ns, read="marker")
    for g, w, n in zip(got, want.tolist(), ns, strict=True):
        assert max(abs(a - b) for a, b in zip(g, w[:n], strict=True)) < 1e-4
    assert backend_rankings(be, prompts, ns, read="marker") == rank_prompts(
        model, tok, prompts, ns, read="marker"
    )
    # The requests (concurrent, so in any order): one a prompt, its own ids up to its last
    # marker, as ids.
    assert len(seen) == 6
    want_ids = []
    for text, n in zip(prompts, ns, strict=True):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        want_ids.append(ids[: marker_positions(tok, text, n)[-1] + 1])
    sent_ids = []
    for path, body in seen[:3]:
        if shape == "vllm":
            assert path == "/pooling"
            assert body["task"] == "token_classify" and body["use_activation"] is False
            assert body["model"] == str(tiny_smollm2) and body["add_special_tokens"] is False
            sent_ids.append(body["input"])
        else:
            assert path == "/embeddings" and set(body) == {"content"}
            sent_ids.append(body["content"])
    assert sorted(sent_ids) == sorted(want_ids)
    assert all(
        len(w) < len(tok(t, add_special_tokens=False)["input_ids"])
        for w, t in zip(want_ids, prompts, strict=True)
    )
    # The front door: a proxy over the server ranks as the in-process one does.
    spec = marker_head_spec(str(tiny_smollm2))
    sessions = topic_sessions(9)
    proxy = Proxy(be, spec, BM25Filter())
    served = proxy.rank("what about topic 2?", sessions)
    with torch.no_grad():
        built = proxy.builder.build("what about topic 2?", sessions)
        order = rank_prompts(model, tok, [built.text], [9], read="marker")[0]
    assert served.parsed.ids == tuple(order)


def test_the_marker_read_needs_the_server_named_and_refuses_what_cannot_score(
    tiny_smollm2: Path,
) -> None:
    """A server kind left unsaid is refused at start (no guess from an answer); so is a backend
    with no per-token read, both naming how to serve the marker read."""
    import httpx

    from memsifter.llm import BackendSpec, build_backend
    from memsifter.ranker.first_token import check_backend
    from memsifter.ranker.proxy import Proxy
    from memsifter.serving.config import PROXY_SERVERS, ProxySettings

    unsaid = OpenAIBackend(
        "http://x:1",
        model=str(tiny_smollm2),
        transport=httpx.MockTransport(lambda r: httpx.Response(500)),
    )
    with pytest.raises(RankingHeadError, match="does not say which server it is.*vllm or llamacpp"):
        Proxy(unsaid, marker_head_spec(str(tiny_smollm2)))
    with pytest.raises(BackendError, match="does not say which server"):
        unsaid.marker_logits([[1, 2, 3]], [[2]], 5)

    class LogprobsOnly:
        name = "elsewhere"
        tokenizer = None

        def label_logprobs(self, *a: Any) -> None: ...

    with pytest.raises(RankingHeadError, match="elsewhere backend returns no per-token scores"):
        check_backend(LogprobsOnly(), "marker")
    assert check_backend(LogprobsOnly(), "label") is not None
    with pytest.raises(BackendError, match="server must be one of vllm, llamacpp"):
        OpenAIBackend("http://x:1", model="m", server="sglang")
    # Said once, in the spec or the serve config, and carried to the backend.
    named = build_backend(
        BackendSpec(kind="openai", model=str(tiny_smollm2), base_url="http://x:1", server="vllm")
    )
    assert named.server == "vllm" and check_backend(named, "marker") is named
    settings = ProxySettings(backend="openai", base_url="http://x:1", server="llamacpp")
    assert settings.backend_spec().server == "llamacpp"
    assert PROXY_SERVERS == SERVERS
    with pytest.raises(ValueError, match="proxy.server must be one of"):
        ProxySettings(backend="openai", base_url="http://x:1", server="tgi")


def _pooled(edit: Callable[[list[list[float]]], list[list[float]]], only: int | None = None) -> Any:
    """Spoils vLLM's per-token rows (of the answer to a prompt of ``only`` tokens, or of
    every answer)."""

    def spoil(ids: list[int], answer: Any) -> Any:
        if only is None or len(ids) == only:
            answer["data"][0]["data"] = edit(answer["data"][0]["data"])
        return answer

    return spoil


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_unusable_server_answers_are_refused_by_name(tiny_smollm2: Path) -> None:
    """Nothing usable, nothing made up: a generate server (404 on /pooling), an embeddings
    server without --embeddings or with pooling, a classifier of two tokens, fewer values than
    tokens, and a position past the prompt each raise BackendError naming the prompt or the
    flags to start the server with."""
    import httpx
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_smollm2)
    prompts, ns = _prompts(tok, str(tiny_smollm2))

    def backend(shape: str, edit: Callable[[list[int], Any], Any]) -> OpenAIBackend:
        transport, _ = _stand_in(tiny_smollm2, shape, edit)
        return OpenAIBackend(
            "http://x:1/v1", model=str(tiny_smollm2), transport=transport, server=shape,
            max_retries=0,
        )  # fmt: skip

    def status(code: int, text: str) -> Callable[[int, Any], Any]:
        return lambda ids, a: httpx.Response(code, json={"error": {"message": text}})

    with pytest.raises(BackendError, match=r"HTTP 404(.|\n)*--runner pooling --convert classify"):
        engine_marker_scores(backend("vllm", status(404, "Not Found")), prompts[:1], ns[:1])
    two = backend("vllm", _pooled(lambda rows: [[r[0], 0.0] for r in rows]))
    with pytest.raises(BackendError, match=r"prompt 0: .*gave \[2\] values a token"):
        engine_marker_scores(two, prompts[:1], ns[:1])
    second = tok(prompts[1], add_special_tokens=False)["input_ids"]
    second_sent = marker_positions(tok, prompts[1], ns[1])[-1] + 1
    assert second_sent < len(second)
    short = backend("vllm", _pooled(lambda rows: rows[:5], only=second_sent))
    with pytest.raises(BackendError, match=r"prompt 1: .*gave 5 values for \d+ tokens"):
        engine_marker_scores(short, prompts, ns)
    no_embd = status(501, "This server does not support embeddings. Start it with `--embeddings`")
    with pytest.raises(BackendError, match=r"--embeddings`(.|\n)*--pooling none --ubatch-size"):
        engine_marker_scores(backend("llamacpp", no_embd), prompts[:1], ns[:1])
    pooled = backend(
        "llamacpp", lambda ids, a: [{"index": 0, "embedding": [a[0]["embedding"][-1]]}]
    )
    with pytest.raises(
        BackendError, match=r"prompt 0: .*gave 1 vectors .*start it with --pooling none"
    ):
        engine_marker_scores(pooled, prompts[:1], ns[:1])
    garbled = backend("llamacpp", lambda ids, a: {"embedding": "?"})
    with pytest.raises(BackendError, match=r"prompt 0: unusable /embeddings answer"):
        engine_marker_scores(garbled, prompts[:1], ns[:1])
    fine = backend("llamacpp", lambda ids, a: a)
    with pytest.raises(
        BackendError, match=r"prompt 1: positions \[7\] are not within its 4 tokens"
    ):
        fine.marker_logits([[1, 2, 3], [1, 2, 3, 4]], [[2], [1, 7]], marker_token_id(tok))
    with pytest.raises(BackendError, match="prompt 0: the marker read takes token ids"):
        fine.marker_logits(["text"], [[0]], marker_token_id(tok))  # type: ignore[list-item]
    ids = tok(prompts[0], add_special_tokens=False)["input_ids"]
    with pytest.raises(RankingHeadError, match="prompt 0: the token ids to send"):
        engine_marker_scores(fine, prompts[:1], ns[:1], payloads=[ids[:-1]])


def test_output_row_is_the_lm_heads_row_tied_or_not(tiny_smollm2: Path, tmp_path: Path) -> None:
    """llama.cpp's client-side row: the tied input embedding's where the config ties them
    (SmolLM2), else ``lm_head.weight``; the same numbers transformers' LM head holds."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from memsifter.llm.llamacpp import LlamaCppError, output_row

    tied = AutoModelForCausalLM.from_pretrained(tiny_smollm2)
    row, bias = output_row(tiny_smollm2, 1234)
    assert bias == 0.0
    assert torch.equal(
        torch.tensor(row, dtype=torch.float32), tied.get_output_embeddings().weight[1234]
    )
    config = LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    untied = LlamaForCausalLM(config)
    untied.save_pretrained(tmp_path / "untied")
    row, _ = output_row(tmp_path / "untied", 7)
    head = untied.get_output_embeddings().weight[7]
    assert torch.equal(torch.tensor(row, dtype=torch.float32), head)
    assert not torch.equal(head, untied.get_input_embeddings().weight[7])
    with pytest.raises(LlamaCppError, match="outside"):
        output_row(tmp_path / "untied", 300)
    with pytest.raises(LlamaCppError, match="config.json"):
        output_row(tmp_path, 0)


_RECORD_ARGS = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$ARGS_OUT"
"""


def test_the_launchers_start_each_server_for_the_marker_read(
    tiny_smollm2: Path, tmp_path: Path
) -> None:
    """The real launcher scripts, with a stand-in for the engine that records its arguments:
    ``--marker-read`` becomes vLLM's pooling flags, naming the read token as SmolLM2's
    vocabulary writes it, and llama-server's per-token embeddings with a micro-batch of a
    slot's context."""
    import subprocess
    import sys

    from memsifter.resources import LLAMACPP_SERVER, VLLM_CPU_SERVER

    record = tmp_path / "record.sh"
    record.write_text(_RECORD_ARGS)
    record.chmod(0o755)
    out = tmp_path / "args"
    env = {**os.environ, "ARGS_OUT": str(out), "MEMSIFTER_PYTHON": sys.executable}

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(record)  # pip, the import check and the server: recorded
    cmd = ["bash", str(VLLM_CPU_SERVER), "--model", str(tiny_smollm2), "--marker-read"]
    done = subprocess.run(
        cmd, env={**env, "MEMSIFTER_VLLM_VENV": str(venv)}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    args = out.read_text().splitlines()
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    at = args.index("--runner")
    assert args[at : at + 5] == ["--runner", "pooling", "--convert", "classify", "--hf-overrides"]
    overrides = json.loads(args[at + 5])
    assert overrides == {"classifier_from_token": ["\u0120yes"], "method": "no_post_processing"}
    assert args[at + 6] == "--pooler-config"
    assert json.loads(args[at + 7]) == {"task": "token_classify"}

    build = tmp_path / "llamacpp"
    (build / "build" / "bin").mkdir(parents=True)
    (build / "build" / "bin" / "llama-server").symlink_to(record)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cmd = ["bash", str(LLAMACPP_SERVER), "--model", str(gguf), "--ctx-size", "3000"]
    done = subprocess.run(
        [*cmd, "--marker-read"], env={**env, "MEMSIFTER_LLAMACPP_DIR": str(build)},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = out.read_text().splitlines()
    at = args.index("--embeddings")
    assert args[at : at + 7] == [
        "--embeddings", "--pooling", "none", "--ubatch-size", "3000", "--batch-size", "3000",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, env={**env, "MEMSIFTER_LLAMACPP_DIR": str(build)}, capture_output=True, text=True
    )
    assert done.returncode == 0 and "--embeddings" not in out.read_text().splitlines()


# ---- slow: the real servers ----------------------------------------------------------------


def _marker_prompts(tok: Any, model: str) -> tuple[list[str], list[int]]:
    """Marker prompts on SmolLM2's tokenizer: a few questions over sessions of varied topics."""
    from memsifter.coarse.bm25 import BM25Filter

    builder = marker_head_spec(model).builder(tok, BM25Filter())
    restated = marker_head_spec(model, layout="restated").builder(tok, BM25Filter())
    asks = [
        ("what about topic 3?", 12),
        ("which session mentions topic 1 last?", 6),
        ("topic 7 and topic 2?", 20),
        ("tell me about topic 5", 9),
    ]
    # the second and fourth with the question restated before every closer (the shorter two:
    # llama-server's slots hold 1,024 tokens each)
    built = [(restated if i % 2 else builder).build(q, topic_sessions(n))
             for i, (q, n) in enumerate(asks)]  # fmt: skip
    return [b.text for b in built], [b.num_candidates for b in built]


def _agreement(served: list[list[float]], local: list[list[float]]) -> tuple[float, float]:
    """The largest absolute and relative (to the prompt's largest |logit|) differences."""
    worst_abs = worst_rel = 0.0
    for s, r in zip(served, local, strict=True):
        scale = max(abs(x) for x in r)
        diff = max(abs(a - b) for a, b in zip(s, r, strict=True))
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / scale)
    return worst_abs, worst_rel


def _local_marker_scores(model_dir: Path, prompts: list[str], ns: list[int]) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [
            head_scores(model, tok, [p], [n], read="marker")[0, :n].tolist()
            for p, n in zip(prompts, ns, strict=True)
        ]


def _check_agreement(engine: str, served: list[list[float]], local: list[list[float]]) -> None:
    worst_abs, worst_rel = _agreement(served, local)
    print(f"{engine} marker read vs transformers: max abs {worst_abs:.3e}, rel {worst_rel:.3e}")
    assert [order_scores(s) for s in served] == [order_scores(r) for r in local]
    assert worst_rel < 1e-3, (worst_abs, worst_rel)


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_vllm_serves_the_marker_read_as_transformers_computes_it(
    request: pytest.FixtureRequest,
) -> None:
    """vLLM started for the marker read (a pooling model whose one-label classifier is the LM
    head's row of " yes") returns the logits transformers computes at every marker."""
    from memsifter.llm.vllm_cpu import launch_vllm_cpu_server

    smollm2_dir: Path = request.getfixturevalue("smollm2_dir")
    from memsifter.llm import BackendSpec, build_backend

    name = "smollm2-135m-instruct"
    http = build_backend(
        BackendSpec(kind="openai", model=str(smollm2_dir), served_model_name=name, server="vllm",
                    base_url="http://unused")
    )  # fmt: skip
    prompts, ns = _marker_prompts(http.tokenizer, str(smollm2_dir))
    with launch_vllm_cpu_server(
        smollm2_dir, served_model_name=name, timeout=300, marker_read=True
    ) as url:
        http = build_backend(
            BackendSpec(kind="openai", model=str(smollm2_dir), base_url=url,
                        served_model_name=name, server="vllm")
        )  # fmt: skip
        served = engine_marker_scores(http, prompts, ns)
    _check_agreement("vllm", served, _local_marker_scores(smollm2_dir, prompts, ns))


@pytest.mark.slow
@pytest.mark.llamacpp_server
@pytest.mark.usefixtures("llamacpp_built")
def test_llamacpp_serves_the_marker_read_as_transformers_computes_it(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server started for the marker read (``--embeddings --pooling none``) returns the
    final hidden states; times the LM head's row they are the logits transformers computes at
    every marker (SmolLM2 exported to f32 GGUF)."""
    from memsifter.llm.llamacpp import launch_llamacpp_server

    smollm2_cache: Path = request.getfixturevalue("smollm2_cache")
    monkeypatch.setenv("MEMSIFTER_CACHE", str(smollm2_cache))  # the session's SmolLM2
    from memsifter.llm import BackendSpec, build_backend

    name = "smollm2-135m-instruct"
    model_dir = smollm2_cache / "models" / name
    spec = BackendSpec(kind="openai", model=name, base_url="http://unused", server="llamacpp")
    prompts, ns = _marker_prompts(build_backend(spec).tokenizer, name)
    with launch_llamacpp_server(
        name, setup=False, timeout=300, parallel=2, ctx_size=2048, marker_read=True
    ) as url:
        http = build_backend(
            BackendSpec(kind="openai", model=name, base_url=url, served_model_name=name,
                        server="llamacpp")
        )  # fmt: skip
        served = engine_marker_scores(http, prompts, ns)
    _check_agreement("llamacpp", served, _local_marker_scores(model_dir, prompts, ns))
