"""The reward at the recipe's rate (issue 37, item 6): one GRPO step's reward call against a real
OpenAI-compatible server, and what the paper-scale recipe would need on paper.

Measured here (committed as eval/results/bench_reward_rate/bench_reward_rate.{md,json}):
- The server: the vLLM CPU server (scripts/vllm_cpu_server.sh) serving SmolLM2-135M-Instruct,
  the working LLM that fits this machine.
- The call: ``RewardService.score`` on a batch of ``--prompts`` GRPO groups of ``--completions``
  rankings each, one call for the whole generation batch, as TRL makes it. The answerer sends up
  to ``max_concurrency`` requests at a time (the Qwen3-4B reward config's 16).
- The data: held-out LoCoMo questions (conversations 8-9), each turn a memory unit, BM25's top
  ``--candidates`` units shown. The rankings are seeded Plackett-Luce perturbations of BM25's
  order, as a policy's samples agree at the top more than at the bottom.
- Reported: working-LLM calls, naive calls (every completion scored alone), the sharing ratio,
  calls a second, and per-request latency p50 and p95. Latency is timed at the HTTP transport,
  so it includes queueing on the server under the concurrency.

Projected, on paper, for the recipe (configs/train/qwen3_4b.yaml with its reward config): calls
a step = prompts a step x the calls a group measured here. Tokens a call come from the tiers'
session counts and the mean LoCoMo session length in the Qwen3 tokenizer's count (approximated by
SmolLM2's, both BPE of about the same size). Qwen3-8B's prefill rate on one H200 is an assumption
stated in the report, not a measurement. The answerer GPUs a step needs follow for a few step
times.

    flock /tmp/memsifter-heavy.lock python -m eval.bench.bench_reward_rate
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from eval.common import machine, machine_line, pl_around
from memsifter.coarse import build_filter
from memsifter.data import load_locomo
from memsifter.data.locations import locomo_file
from memsifter.data.splits import LOCOMO_TEST
from memsifter.data.units import to_units
from memsifter.llm.openai_http import OpenAIBackend
from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
from memsifter.models import resolve_model
from memsifter.qa.answerer import Answerer
from memsifter.ranker.first_token import ranking_text
from memsifter.rewards import AnswererSettings, RewardConfig, RewardRequest, RewardService
from memsifter.rewards.tiers import fibonacci_tiers

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "eval" / "results" / "bench_reward_rate"
MODEL = "smollm2-135m-instruct"
# The assumption the projection rests on (not measured here): Qwen3-8B's prefill on one H200 in
# vLLM, bf16. 2 x 8.2e9 FLOPs a token at ~40% of the H200's 989 dense bf16 TFLOP/s.
H200_QWEN3_8B_PREFILL_TOKENS_S = 24_000


class TimedTransport(httpx.AsyncHTTPTransport):
    """Times every request (headers to last byte) and keeps the server's prompt token count."""

    def __init__(self) -> None:
        super().__init__()
        self.latencies: list[float] = []
        self.prompt_tokens: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.perf_counter()
        response = await super().handle_async_request(request)
        body = await response.aread()
        self.latencies.append(time.perf_counter() - t0)
        if request.url.path.endswith("/completions") and response.status_code == 200:
            self.prompt_tokens.append(int(json.loads(body)["usage"]["prompt_tokens"]))
        return httpx.Response(response.status_code, headers=response.headers, content=body,
                              request=request)  # fmt: skip


def _requests(n_prompts: int, n_completions: int, n_candidates: int, seed: int) -> list[Any]:
    dataset = load_locomo(locomo_file()).filter_conversations(list(LOCOMO_TEST))
    bm25 = build_filter("bm25")
    rng = random.Random(seed)
    out = []
    for q in dataset.queries:
        if len(out) == n_prompts:
            break
        units = to_units(q, "page", turns_per_page=1)
        if units.meta["session_level_gold"] or not units.gold_session_ids:
            continue
        ranked = bm25.score(q.question, list(units.haystack)).ids[:n_candidates]
        by_id = {u.id: u for u in units.haystack}
        shown = [by_id[i] for i in sorted(ranked, key=[u.id for u in units.haystack].index)]
        pos = {s.id: i for i, s in enumerate(shown)}
        order = [pos[i] for i in ranked]
        completions = tuple(ranking_text(pl_around(order, rng)) for _ in range(n_completions))
        out.append(
            RewardRequest(
                question=q.question, answer=str(q.answer), candidates=tuple(shown),
                completions=completions, gold_ids=units.gold_session_ids,
                question_date=q.question_date, category=q.category, data_source="locomo",
            )
        )  # fmt: skip
    return out


def _session_tokens() -> dict[str, float]:
    """Mean session length in tokens (SmolLM2's BPE): LoCoMo's ten conversations, and the
    haystacks of LongMemEval-S's first 50 questions."""
    from memsifter.data import load_longmemeval
    from memsifter.data.locations import LONGMEMEVAL_FILES, shared_data
    from memsifter.models import load_tokenizer

    tok = load_tokenizer(resolve_model(MODEL).path)

    def mean(sessions: Any) -> float:
        return statistics.fmean(len(tok(s.render())["input_ids"]) for s in sessions)

    lme = load_longmemeval(shared_data(LONGMEMEVAL_FILES["s"]))
    return {
        "locomo": mean(load_locomo(locomo_file()).sessions.values()),
        "longmemeval": mean({s.id: s for q in lme.queries[:50] for s in q.haystack}.values()),
    }


def main(
    prompts: Annotated[int, typer.Option(help="GRPO groups in the step's reward call")] = 16,
    completions: Annotated[int, typer.Option(help="rankings a group")] = 6,
    candidates: Annotated[int, typer.Option(help="units shown a prompt")] = 20,
    concurrency: Annotated[int, typer.Option(help="answerer requests in flight")] = 16,
    max_k: Annotated[int, typer.Option()] = 8,
    window: Annotated[int, typer.Option(help="the answerer's window")] = 1024,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path, typer.Option()] = OUT,
) -> None:
    facts = machine()  # the load average before the run loads it
    requests = _requests(prompts, completions, candidates, seed)
    model_dir = resolve_model(MODEL).path
    transport = TimedTransport()
    cfg = RewardConfig(
        max_k=max_k, task_metrics={"locomo": "locomo"},
        answerer=AnswererSettings(memory_order="chronological"),
    )  # fmt: skip
    t_server = time.perf_counter()
    with launch_vllm_cpu_server(model_dir, served_model_name=MODEL, timeout=600) as base_url:
        server_s = time.perf_counter() - t_server
        backend = OpenAIBackend(base_url, str(model_dir), served_model_name=MODEL,
                                max_concurrency=concurrency, transport=transport)  # fmt: skip
        answerer = Answerer(backend, window, 16, memory_order="chronological")
        answerer.answer_texts([answerer.render("warm up", [], times=[])])
        transport.latencies.clear()
        transport.prompt_tokens.clear()
        service = RewardService(answerer, cfg)
        t0 = time.perf_counter()
        batch = service.score(requests, step=0)
        wall = time.perf_counter() - t0
    st = batch.stats
    lat = sorted(transport.latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    measured = {
        "prompts": len(requests), "completions": completions, "candidates": candidates,
        "concurrency": concurrency, "max_k": max_k, "answerer_window": window,
        "answer_calls": st.answer_calls, "naive_calls": st.naive_calls,
        "calls_per_naive": st.answer_calls / st.naive_calls,
        "calls_per_group": st.answer_calls / len(requests),
        "wall_s": wall, "answer_s": st.answer_s,
        "calls_per_s": st.answer_calls / st.answer_s,
        "latency_p50_s": pct(0.5), "latency_p95_s": pct(0.95),
        "prompt_tokens_mean": statistics.fmean(transport.prompt_tokens),
        "prompt_tokens_per_s": sum(transport.prompt_tokens) / st.answer_s,
        "server_start_s": server_s,
    }  # fmt: skip

    # -- the recipe on paper ------------------------------------------------------------------
    tiers = [0, *fibonacci_tiers(max_k)]  # s_0's prompt holds no session
    session_tokens = _session_tokens()
    overhead = 200  # the answerer's instructions, question and answer slot
    window = 40_960  # configs/rewards/qwen3_4b.yaml's answerer window caps a tier's prompt
    per_call = {
        src: statistics.fmean(min(k * n + overhead, window) for k in tiers)
        for src, n in session_tokens.items()
    }
    # configs/data/qwen3_4b.yaml draws 500 prompts from LoCoMo and 500 from each of
    # LongMemEval S and M: a third of a step's prompts are LoCoMo's.
    mix = {"locomo": 1 / 3, "longmemeval": 2 / 3}
    tokens_per_call = sum(mix[s] * per_call[s] for s in mix)
    recipe_prompts = 32  # configs/train/qwen3_4b.yaml: 32 prompts x 6 completions a step
    calls = recipe_prompts * measured["calls_per_group"]
    gpu_s = calls * tokens_per_call / H200_QWEN3_8B_PREFILL_TOKENS_S
    projection = {
        "recipe_prompts_per_step": recipe_prompts,
        "calls_per_step": calls,
        "session_tokens_mean": session_tokens,
        "tokens_per_call_mean": per_call,
        "tokens_per_call_recipe_mix": tokens_per_call,
        "answerer_window": window,
        "assumed_h200_qwen3_8b_prefill_tokens_s": H200_QWEN3_8B_PREFILL_TOKENS_S,
        "answerer_gpu_s_per_step": gpu_s,
        "gpus_for_scoring_within": {
            f"{m} min step": math.ceil(gpu_s / (0.5 * 60 * m)) for m in (2, 5, 10)
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_line(facts), "measured": measured, "projection": projection}
    (out / "bench_reward_rate.json").write_text(json.dumps(report, indent=2) + "\n")
    m, p = measured, projection
    lines = [
        "# The reward at the recipe's rate",
        "",
        f"Machine: {report['machine']}. Command: `flock /tmp/memsifter-heavy.lock python -m "
        "eval.bench.bench_reward_rate` "
        f"(vLLM CPU server started in {m['server_start_s']:.0f} s).",
        "",
        "## Measured: one step's reward call against the vLLM CPU server (SmolLM2-135M)",
        "",
        f"{m['prompts']} GRPO groups x {m['completions']} rankings (held-out LoCoMo questions, "
        f"{m['candidates']} turn units shown, seeded Plackett-Luce rankings around BM25's order), "
        f"tiers to {m['max_k']}, answerer window {m['answerer_window']} tokens, "
        f"{m['concurrency']} requests in flight.",
        "",
        "| calls | naive calls | calls / naive | calls a group | wall s | calls / s | "
        "p50 s | p95 s | prompt tokens (mean) | prompt tokens / s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {m['answer_calls']} | {m['naive_calls']} | {m['calls_per_naive']:.2f} | "
        f"{m['calls_per_group']:.1f} | {m['wall_s']:.1f} | {m['calls_per_s']:.2f} | "
        f"{m['latency_p50_s']:.2f} | {m['latency_p95_s']:.2f} | {m['prompt_tokens_mean']:.0f} | "
        f"{m['prompt_tokens_per_s']:.0f} |",
        "",
        "Latency is per request at the HTTP transport, queueing on the server included.",
        "",
        "## Projected on paper: Qwen3-8B on H200s at the recipe's batch",
        "",
        f"- {p['recipe_prompts_per_step']} prompts a step x {m['calls_per_group']:.1f} calls a "
        f"group (measured above) = {p['calls_per_step']:.0f} answerer calls a step.",
        f"- A call's prompt: its tier's sessions (0, {', '.join(map(str, tiers[1:]))}) x the "
        "mean session + 200, at most the answerer's 40,960-token window: LoCoMo "
        f"{p['session_tokens_mean']['locomo']:.0f} tokens a session, "
        f"{p['tokens_per_call_mean']['locomo']:.0f} a call; LongMemEval-S "
        f"{p['session_tokens_mean']['longmemeval']:.0f} a session, "
        f"{p['tokens_per_call_mean']['longmemeval']:.0f} a call. The recipe's data is a third "
        f"LoCoMo: {p['tokens_per_call_recipe_mix']:.0f} tokens a call.",
        f"- **Assumed**, not measured: {p['assumed_h200_qwen3_8b_prefill_tokens_s']:,} prefill "
        "tokens a second for Qwen3-8B in vLLM on one H200 (2 x 8.2e9 FLOPs a token at 40% of "
        "989 TFLOP/s). Decoding 48 answer tokens a call is left out.",
        f"- So scoring takes {p['answerer_gpu_s_per_step']:.0f} GPU-seconds a step. Keeping it "
        "under half of the step, the answerer GPUs needed are: "
        + ", ".join(f"{k}: {v}" for k, v in p["gpus_for_scoring_within"].items())
        + ".",
    ]
    (out / "bench_reward_rate.md").write_text("\n".join(lines) + "\n")
    typer.echo("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
