"""Reward-service benchmark (committed as eval/results/bench_rewards/bench_rewards.md and .json):
working-LLM calls
and wall time of the reward service against the naive loop, and bit-for-bit equal rewards.

Why: the answer reward costs n x (tiers + 1) working-LLM calls per GRPO group when every
completion is scored on its own (36 for 6 completions and 5 tiers). The service computes s_0
once per prompt and shares a call between completions whose top-k prefixes render the same
prompt; this measures what that saves on real data and checks that it changes no reward.

How (every choice is also written into the report):

* 20 questions with evidence from held-out LoCoMo conversations 8 and 9 (the committed synthetic
  fixture only when the real file is missing; the report then says so).
* Memory units are LoCoMo **turns** (each with its session's date), not whole sessions, and the
  gold units are the evidence turns (``D3:7``). A LoCoMo session is ~750 SmolLM2 tokens, and on
  this 2-core CPU a working-LLM call costs ~0.5 s plus ~3.6 ms per prompt token: with whole
  sessions, eight tiers of them would not fit a small window and the naive loop alone would run
  for over an hour. Turns keep 8 tiers and 720 naive calls affordable.
* Candidates: the proxy prompt's units (BM25-budgeted into a ``--proxy-window``-token prompt with
  the SmolLM2 tokenizer; the bare-ranking prompt, so a short completion can hold a ranking).
  Six rankings per question are sampled from the untrained SmolLM2 proxy at temperature 1.0 with
  transformers (the prompt is prefilled once and its KV cache shared by the six samples, which
  samples the same distribution six times faster). Samples that do not parse are replaced by a
  seeded Plackett-Luce perturbation of the BM25 ranking (Gumbel noise on log-weights -rank): it
  keeps BM25's top unit about 63% of the time, as a policy's samples would agree at the top more
  than at the bottom. How many were replaced is reported.
* Working LLM: SmolLM2 greedy via transformers, **batch size 1** in both paths, so an answer can
  never depend on what it was batched with (a left-padded batch can flip a near-tied greedy
  token), which bit-for-bit equality needs. Tiers up to 8, LoCoMo task score,
  R = R_ans + 0.5 R_ret (warm-up step 0, so R_ret is compared too).
* Service: ``RewardService.score`` per question (one GRPO group per call), real calls, timed.
* Naive loop: ``naive_rewards`` (every parsed completion x (tiers + 1) calls, its own s_0, nothing
  shared). It runs for real (regenerating every answer) on ``--naive-real`` questions spread
  evenly over the list (one per conversation by default).
  On the rest it runs with a replay backend that returns, for each exact prompt text, the answer
  the service generated and charges that call's measured latency; a prompt the service never
  generated raises. Its rewards are then an independent check of the service's bookkeeping (which
  answer feeds which tier of which completion), and its time is the naive time those calls would
  take at the latencies measured in this run. The real questions show how close the replayed
  time is to a real naive run, and their rewards also check that regenerating an answer gives
  the same text.
* Render-only (no model calls): the call ratio if the six rankings were uniformly random
  permutations, the least sharing a group can have.

    flock /tmp/memsifter-heavy.lock python -m eval.bench.bench_rewards
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import RESULTS, machine, machine_line, pl_around
from memsifter.coarse import build_filter
from memsifter.data import load_locomo
from memsifter.data.locations import locomo_file
from memsifter.data.splits import LOCOMO_TEST
from memsifter.data.types import Query, Session
from memsifter.data.units import to_units
from memsifter.llm import BackendSpec, Generation, SamplingParams, build_backend
from memsifter.qa.answerer import Answerer
from memsifter.ranker import BuiltPrompt, PromptBuilder, parse_ranking
from memsifter.rewards import (
    AnswererSettings,
    RewardConfig,
    RewardRequest,
    RewardService,
)
from memsifter.rewards.marginal_utility import marginal_utility
from memsifter.rewards.service import prompt_key, render_prefix
from memsifter.rewards.tiers import TIER_WEIGHTS, fibonacci_tiers
from memsifter.testing.rewards import naive_rewards

ROOT = Path(__file__).resolve().parents[2]
REAL_LOCOMO = locomo_file()
FIXTURE = ROOT / "data" / "fixtures" / "locomo_mini.json"
MODEL = "smollm2-135m-instruct"
LOCAL_PROXY = BackendSpec(kind="transformers", model=MODEL, batch_size=1, threads=2)
PARTIAL = Path(tempfile.gettempdir()) / "bench_rewards.partial.jsonl"  # rows, if the run dies


class Recording:
    """Backend wrapper keeping each prompt's generation (per prompt at batch size 1)."""

    name = "recording"

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.model_name = backend.model_name
        self.log: dict[str, Generation] = {}

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        out = self.backend.generate(prompts, sampling)
        for p, g in zip(prompts, out, strict=True):
            self.log[p] = g[0]
        return out


class Replay:
    """Answers from a recording; ``charged_s`` sums the recorded latency of every call asked."""

    name = "replay"

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.model_name = recording.model_name
        self.charged_s = 0.0

    @property
    def tokenizer(self) -> Any:
        return self.recording.tokenizer

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        out = []
        for p in prompts:
            if p not in self.recording.log:
                raise RuntimeError("the naive loop asked for a prompt the service never generated")
            g = self.recording.log[p]
            self.charged_s += g.latency_s
            out.append([g])
        return out


def _turn_units(query: Query) -> tuple[list[Session], tuple[str, ...]]:
    """The conversation's turns as memory units (pages of one turn), and the units holding an
    evidence turn (none when the question has only session-level gold)."""
    units = to_units(query, "page", turns_per_page=1)
    gold = () if units.meta["session_level_gold"] else units.gold_session_ids
    return list(units.haystack), gold


def _pick(queries: list[Query], n: int) -> list[Query]:
    """``n`` questions with evidence, split evenly over the conversations, in file order."""
    by_conv: dict[str | None, list[Query]] = {}
    for q in queries:
        if q.has_evidence and _turn_units(q)[1]:
            by_conv.setdefault(q.conversation_id, []).append(q)
    per = math.ceil(n / max(len(by_conv), 1))
    return [q for qs in by_conv.values() for q in qs[:per]][:n]


def _coarse_order(prompt: BuiltPrompt, question: str, units: list[Session], bm25: Any) -> list[int]:
    if prompt.coarse_order is not None:
        return list(prompt.coarse_order)
    pos = {sid: i for i, sid in enumerate(prompt.candidate_ids)}
    by_id = {s.id: s for s in units}
    shown = [by_id[sid] for sid in prompt.candidate_ids]
    return [pos[sid] for sid in bm25.score(question, shown).ids]


def _ranking_text(ids: list[int]) -> str:
    return f"<ranking>{', '.join(map(str, ids))}</ranking>"


def _sample_group(backend: Any, text: str, n: int, max_new_tokens: int, seed: int) -> list[str]:
    """``n`` samples at temperature 1 from one prefill of ``text`` (its KV cache repeated)."""
    import torch

    tok, model = backend.tokenizer, backend.model
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    eos = set(backend._eos)
    with torch.inference_mode():
        cache = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        cache.batch_repeat_interleave(n)
        torch.manual_seed(seed)
        seqs = model.generate(
            input_ids=ids.repeat(n, 1),
            attention_mask=torch.ones_like(ids).repeat(n, 1),
            cache=cache,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos),
            pad_token_id=tok.pad_token_id,
        )
    out = []
    for row in seqs[:, ids.shape[1] :].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), len(row))
        out.append(tok.decode(row[:cut], skip_special_tokens=True))
    return out


HELD_OUT = ",".join(LOCOMO_TEST)  # the test conversations: "8,9"


def sensitivity(max_k: int) -> dict[str, list[float]]:
    """R_ans when one useful session sits at rank r (1..max_k, then below the tiers): the
    working LLM scores 1 from the first tier that shows it and 0 before, s_0 = 0. Per weighting,
    the list has max_k + 1 entries, the last for a ranking that never shows it."""
    tiers = fibonacci_tiers(max_k)
    out: dict[str, list[float]] = {}
    for mode in TIER_WEIGHTS:
        out[mode] = [
            marginal_utility({0: 0.0, **{k: float(k >= r) for k in tiers}}, weights=mode)
            for r in range(1, max_k + 2)
        ]
    return out


def reweighted(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's measured tier scores re-weighted both ways: mean R_ans per weighting, and in
    how many groups the two weightings order the completions the same way (what GRPO's
    group-relative advantages see)."""
    r_ans: dict[str, list[float]] = {m: [] for m in TIER_WEIGHTS}
    same_order = groups = 0
    for row in rows:
        per_mode = {}
        for mode in TIER_WEIGHTS:
            vals = [
                marginal_utility({int(k): v for k, v in curve.items()}, weights=mode)
                for curve in row["s_curves"]
                if curve
            ]
            r_ans[mode] += vals
            per_mode[mode] = vals
        a, b = per_mode["paper"], per_mode["tail"]
        if len(set(a)) > 1 or len(set(b)) > 1:
            groups += 1
            pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
            same_order += all(
                (a[i] > a[j]) - (a[i] < a[j]) == (b[i] > b[j]) - (b[i] < b[j]) for i, j in pairs
            )
    return {
        "mean_r_ans": {m: sum(v) / max(len(v), 1) for m, v in r_ans.items()},
        "n_completions": len(r_ans["paper"]),
        "groups_with_spread": groups,
        "groups_same_order": same_order,
    }


def main(
    data: Annotated[Path, typer.Option()] = REAL_LOCOMO,
    conversations: Annotated[str, typer.Option(help="held-out conversation indexes")] = HELD_OUT,
    n_questions: Annotated[int, typer.Option()] = 20,
    n_samples: Annotated[int, typer.Option(help="rankings per question (GRPO group)")] = 6,
    proxy_window: Annotated[int, typer.Option(help="proxy prompt + completion tokens")] = 768,
    proxy_tokens: Annotated[int, typer.Option(help="proxy completion tokens")] = 48,
    answerer_window: Annotated[int, typer.Option()] = 1024,
    answer_tokens: Annotated[int, typer.Option()] = 16,
    max_k: Annotated[int, typer.Option()] = 8,
    naive_real: Annotated[int, typer.Option(help="questions whose naive loop runs for real")] = 2,
    seed: Annotated[int, typer.Option()] = 0,
    memory_order: Annotated[
        str, typer.Option(help="rank | chronological (the reward config's default)")
    ] = RewardConfig().answerer.memory_order,
    tier_weights: Annotated[
        str, typer.Option(help="paper | tail: the weights the run's rewards use")
    ] = RewardConfig().tier_weights,
    out: Annotated[Path, typer.Option()] = RESULTS / "bench_rewards" / "bench_rewards.md",
) -> None:
    t_start = time.perf_counter()
    facts = machine()  # the load average before the run loads it
    PARTIAL.unlink(missing_ok=True)
    fallback = not data.exists()
    if fallback:
        typer.echo(f"{data} is missing: falling back to the synthetic fixture {FIXTURE}")
        dataset = load_locomo(FIXTURE)
    else:
        dataset = load_locomo(data).filter_conversations(conversations.split(","))
    queries = _pick(dataset.queries, n_questions)

    # -- rankings from the proxy --------------------------------------------------------------
    proxy = build_backend(LOCAL_PROXY)
    bm25 = build_filter("bm25")
    builder = PromptBuilder(
        proxy.tokenizer, proxy_window, proxy_tokens, coarse=bm25, ask_think=False
    )
    rng = random.Random(seed)
    requests: list[RewardRequest] = []
    uniform: list[RewardRequest] = []
    from_model: list[int] = []
    t0 = time.perf_counter()
    for i, q in enumerate(queries):
        units, gold = _turn_units(q)
        prompt = builder.build(q.question, units, q.question_date)
        samples = _sample_group(proxy, prompt.text, n_samples, proxy_tokens, seed + i)
        order = _coarse_order(prompt, q.question, units, bm25)
        completions, n_model = [], 0
        for text in samples:
            if parse_ranking(text, prompt.num_candidates).ok:
                completions.append(text)
                n_model += 1
            else:
                completions.append(_ranking_text(pl_around(order, rng)))
        from_model.append(n_model)
        by_id = {u.id: u for u in units}
        base = dict(
            question=q.question,
            answer=str(q.answer),
            candidates=tuple(by_id[sid] for sid in prompt.candidate_ids),
            gold_ids=gold,
            question_date=q.question_date,
            category=q.category,
            data_source="locomo",
        )
        requests.append(RewardRequest(completions=tuple(completions), **base))
        shuffled = [rng.sample(order, len(order)) for _ in range(n_samples)]
        uniform.append(RewardRequest(completions=tuple(map(_ranking_text, shuffled)), **base))
    proxy_s = time.perf_counter() - t0
    del proxy

    # -- rewards: service vs naive --------------------------------------------------------------
    cfg = RewardConfig(
        tier_weights=tier_weights,
        max_k=max_k,
        task_metrics={"locomo": "locomo"},
        answerer=AnswererSettings(memory_order=memory_order),
    )
    recording = Recording(build_backend(LOCAL_PROXY))
    answerer = Answerer(recording, answerer_window, answer_tokens, memory_order=memory_order)
    answerer.answer_texts([answerer.render("warm up", [], times=[])])  # first-call overheads
    naive_backend = Recording(recording.backend)
    naive_answerer = Answerer(
        naive_backend, answerer_window, answer_tokens, memory_order=memory_order
    )
    replay = Replay(recording)
    replay_answerer = Answerer(replay, answerer_window, answer_tokens, memory_order=memory_order)
    service = RewardService(answerer, cfg)
    # The real naive runs are spread evenly over the questions (one per conversation by default).
    real_idx = {j * len(queries) // max(naive_real, 1) for j in range(naive_real)}
    rows: list[dict[str, Any]] = []
    for i, (q, req, n_model) in enumerate(zip(queries, requests, from_model, strict=True)):
        t0 = time.perf_counter()
        batch = service.score([req], step=0)
        service_s = time.perf_counter() - t0
        got = [c.reward for c in batch.rewards[0]]

        # Replayed naive time: the loop's own work (rendering, scoring) as measured, plus the
        # measured latency of every working-LLM call it asks for.
        replay.charged_s = 0.0
        t0 = time.perf_counter()
        replayed, naive_calls = naive_rewards([req], replay_answerer, cfg, step=0)
        replay_s = time.perf_counter() - t0 + replay.charged_s
        real_s = real_identical = None
        if i in real_idx:
            t0 = time.perf_counter()
            real, real_calls = naive_rewards([req], naive_answerer, cfg, step=0)
            real_s = time.perf_counter() - t0
            assert real_calls == naive_calls
            real_identical = [float.hex(x) for x in got] == [float.hex(x) for x in real[0]]
        tiers = req.tiers(cfg.max_k)
        prefixes = {
            tuple(sorted(p.ids[:k]) if memory_order == "chronological" else p.ids[:k])
            for p in (parse_ranking(c, len(req.candidates)) for c in req.completions)
            if p.ok
            for k in tiers
        }
        naive_s = real_s if real_s is not None else replay_s
        rows.append(
            {
                "qid": q.qid,
                "candidates": len(req.candidates),
                "gold_in_prompt": len(req.gold_positions()),
                "tiers": list(tiers),
                "from_model": n_model,
                "answer_calls": batch.stats.answer_calls,
                "unique_prefixes": len(prefixes) + 1,
                "naive_calls": naive_calls,
                "service_s": service_s,
                "naive_s": naive_s,
                "naive_mode": "real" if real_s is not None else "replayed",
                "replayed_naive_s": replay_s,
                "real_naive_s": real_s,
                "identical": [float.hex(x) for x in got] == [float.hex(x) for x in replayed[0]]
                and real_identical is not False,
                "identical_real": real_identical,
                "rewards": got,
                "r_ans": [c.r_ans for c in batch.rewards[0]],
                "r_ret": [c.r_ret for c in batch.rewards[0]],
                "s_curves": [
                    {str(k): v for k, v in c.tier_scores.items()} for c in batch.rewards[0]
                ],
            }
        )
        r = rows[-1]
        with PARTIAL.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(r) + "\n")  # what survives if the run is killed
        typer.echo(
            f"{q.qid}: calls {r['answer_calls']}/{naive_calls}, service {service_s:.1f}s, "
            f"naive {naive_s:.1f}s ({r['naive_mode']}; replayed {replay_s:.1f}s), "
            f"identical={r['identical']}"
        )

    # Render-only counts (no model calls): prompts the service would send for the same
    # rankings in either memory order, and for uniformly random permutations.
    def render_only(reqs: list[RewardRequest], order: str) -> tuple[int, int]:
        shows = Answerer(recording, answerer_window, answer_tokens, memory_order=order)
        calls = naive = 0
        for req in reqs:
            tiers = req.tiers(cfg.max_k)
            keys = {prompt_key(render_prefix(shows, req, ()))}
            for c in req.completions:
                ids = parse_ranking(c, len(req.candidates)).ids
                for k in tiers:
                    keys.add(prompt_key(render_prefix(shows, req, ids[:k])))
            calls += len(keys)
            naive += len(req.completions) * (len(tiers) + 1)
        return calls, naive

    sens = sensitivity(max_k)
    rew = reweighted(rows)
    counts = {
        "samples, rank": render_only(requests, "rank"),
        "samples, chronological": render_only(requests, "chronological"),
        "uniform permutations, rank": render_only(uniform, "rank"),
        "uniform permutations, chronological": render_only(uniform, "chronological"),
    }

    total = {
        k: sum(r[k] for r in rows)
        for k in ("answer_calls", "unique_prefixes", "naive_calls", "service_s", "naive_s")
    }
    real_rows = [r for r in rows if r["real_naive_s"] is not None]
    all_identical = all(r["identical"] for r in rows)
    n_model = sum(from_model)
    n_all = n_samples * len(queries)
    prompt_tokens = [g.prompt_tokens for g in recording.log.values()]
    call_s = [g.latency_s for g in recording.log.values()]
    wall_s = time.perf_counter() - t_start
    command = "flock /tmp/memsifter-heavy.lock python -m eval.bench.bench_rewards"
    data_line = (
        f"**synthetic fixture** `{FIXTURE.name}` (the real LoCoMo file `{data}` was missing)"
        if fallback
        else f"LoCoMo `{data.name}`, held-out conversations {conversations}"
    )
    lines = [
        "# Reward service vs naive loop: working-LLM calls, wall time, identical rewards",
        "",
        f"Machine: {machine_line(facts, run=True)}; {date.today().isoformat()}. "
        f"Command: `{command}` (whole run {wall_s / 60:.1f} min).",
        "",
        f"Data: {data_line}; {len(queries)} questions with evidence. Memory units are LoCoMo "
        "turns with their session's date (gold: the evidence turns), not whole sessions, to keep "
        "720 naive calls affordable on this CPU (see the script's docstring). Candidates: the "
        f"proxy prompt's units (BM25-budgeted into a {proxy_window}-token prompt, mean "
        f"{sum(len(r.candidates) for r in requests) / len(requests):.1f} candidates). "
        f"Rankings: {n_samples} per question sampled from the untrained {MODEL} proxy "
        f"(transformers, temperature 1.0, {proxy_tokens} tokens, bare-ranking prompt; "
        f"{proxy_s:.0f} s); {n_model} of {n_all} parsed, the other {n_all - n_model} were "
        "replaced by seeded Plackett-Luce perturbations of the BM25 ranking. Working LLM: "
        f"{MODEL} greedy via transformers, batch size 1, window {answerer_window}, "
        f"{answer_tokens} answer tokens, memory shown {memory_order} "
        f"(prompts {min(prompt_tokens)}-{max(prompt_tokens)} "
        f"tokens, mean {sum(prompt_tokens) / len(prompt_tokens):.0f}; "
        f"{sum(call_s) / len(call_s):.2f} s a call); tiers up to {max_k}, `tier_weights: "
        f"{tier_weights}`; LoCoMo task score; R = R_ans + 0.5 R_ret (warm-up step 0).",
        "",
        "`calls`: prompts the service sent; `prefixes`: distinct s_0 + top-k prefixes (as sets "
        "when memory is shown chronologically; equal to "
        "`calls` unless the answerer's window cut two prefixes to the same prompt); `naive`: "
        "parsed completions x (tiers + 1). `naive s`: a real naive loop (`real`) or the naive "
        "loop replaying the service's answers at their measured latencies (`replayed`, see the "
        "script). `identical`: every reward equal to the naive loop's, compared as `float.hex`.",
        "",
        "| question | cand. | tiers | from model | calls | prefixes | naive | calls/naive "
        "| service s | naive s | time/naive | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['qid']} | {r['candidates']} | {','.join(map(str, r['tiers']))} | "
            f"{r['from_model']}/{n_samples} | {r['answer_calls']} | {r['unique_prefixes']} | "
            f"{r['naive_calls']} | {r['answer_calls'] / r['naive_calls']:.2f} | "
            f"{r['service_s']:.1f} | {r['naive_s']:.1f} ({r['naive_mode']}) | "
            f"{r['service_s'] / r['naive_s']:.2f} | {'yes' if r['identical'] else '**NO**'} |"
            for r in rows
        ],
        f"| **total** | | | {n_model}/{n_all} | **{total['answer_calls']}** | "
        f"{total['unique_prefixes']} | **{total['naive_calls']}** | "
        f"**{total['answer_calls'] / total['naive_calls']:.2f}** | {total['service_s']:.0f} | "
        f"{total['naive_s']:.0f} | **{total['service_s'] / total['naive_s']:.2f}** | "
        f"{'**all**' if all_identical else '**NO**'} |",
        "",
        f"Calls: **{total['answer_calls'] / total['naive_calls']:.2f}x naive** (goal <= 0.5x); "
        f"wall time **{total['service_s'] / total['naive_s']:.2f}x naive**; rewards identical "
        f"bit for bit: **{'yes, all' if all_identical else 'NO'}** "
        f"({sum(len(r['rewards']) for r in rows)} rewards).",
        "",
        "Real naive loop vs its replayed estimate, on the questions where it ran for real: "
        + "; ".join(
            f"{r['qid']}: real {r['real_naive_s']:.1f} s, replayed {r['replayed_naive_s']:.1f} s, "
            f"rewards identical to the service's: {'yes' if r['identical_real'] else 'NO'}"
            for r in real_rows
        )
        + ".",
        "",
        "Render-only counts (prompts the service would send, no model calls) for the same "
        "questions and candidates, in both memory orders (`chronological`: the working LLM sees "
        "the top-k set oldest first, so rankings that differ only in order within a tier share "
        "a call; `rank`: best first), and with uniformly random permutations instead of the "
        "samples (the least agreement a group can have). The run above used "
        f"`memory_order: {memory_order}`.",
        "",
        "| rankings, memory order | calls | naive | calls/naive |",
        "|---|---|---|---|",
        *[f"| {name} | {c} | {n} | {c / n:.2f} |" for name, (c, n) in counts.items()],
        "",
        "## The two tier weightings",
        "",
        "`paper` (the default) weighs every tier against the next Fibonacci number, "
        "w_n = C(F_n) - C(F_{n+1}) with C(k) = 1/log2(k+1); `tail` (the official code's) gives "
        "the last tier C(F_N) (`memsifter/rewards/tiers.py`). Ranking sensitivity: R_ans when "
        "the one useful session sits at rank r (the working LLM scores 1 once a tier shows it, "
        f"s_0 = 0; tiers {', '.join(map(str, fibonacci_tiers(max_k)))}; no model calls):",
        "",
        "| weights | "
        + " | ".join(f"rank {r}" for r in range(1, max_k + 1))
        + f" | below {max_k} | rank 1 / rank {max_k} |",
        "|---|" + "---|" * (max_k + 2),
        *[
            f"| {mode} | "
            + " | ".join(f"{v:.4f}" for v in vals)
            + f" | {vals[0] / vals[max_k - 1]:.1f}x |"
            for mode, vals in sens.items()
        ],
        "",
        f"This run's measured tier scores ({rew['n_completions']} completions), re-weighted: "
        f"mean R_ans {rew['mean_r_ans']['paper']:.4f} (paper) vs "
        f"{rew['mean_r_ans']['tail']:.4f} (tail). Of the {rew['groups_with_spread']} groups whose "
        f"R_ans is not constant, {rew['groups_same_order']} order their completions the same "
        "way under both weightings (GRPO's group-relative advantages differ in size, not sign)"
        + (
            "; the others are groups where `tail` pays a late hit about as much as `paper` pays "
            "an early one."
            if rew["groups_same_order"] < rew["groups_with_spread"]
            else "."
        ),
        "",
    ]
    out.write_text("\n".join(lines))
    PARTIAL.unlink(missing_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "machine": facts,
                "command": command,
                "fallback_fixture": fallback,
                "config": {
                    "n_questions": len(queries),
                    "n_samples": n_samples,
                    "proxy_window": proxy_window,
                    "proxy_tokens": proxy_tokens,
                    "answerer_window": answerer_window,
                    "answer_tokens": answer_tokens,
                    "max_k": max_k,
                    "naive_real": naive_real,
                    "seed": seed,
                    "memory_order": memory_order,
                    "tier_weights": tier_weights,
                },
                "proxy_s": proxy_s,
                "from_model": n_model,
                "totals": total,
                "call_ratio": total["answer_calls"] / total["naive_calls"],
                "time_ratio": total["service_s"] / total["naive_s"],
                "all_identical": all_identical,
                "render_only": {k: {"calls": c, "naive": n} for k, (c, n) in counts.items()},
                "sensitivity": sens,
                "reweighted": rew,
                "wall_s": wall_s,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    typer.echo(out.read_text())


if __name__ == "__main__":
    typer.run(main)
