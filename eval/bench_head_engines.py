"""Engine agreement of the first-token ranking head (eval/bench_head_engines.md and .json):
the same 100 LoCoMo test prompts of the CPU recipe (``data/rl/locomo_smollm2_first_token``,
conversations 8-9, built when missing) ranked by SmolLM2-135M-Instruct on three engines:

- ``transformers``: in process, fp32, the logits at the last position (the reference);
- ``vllm``: the vLLM CPU server (``scripts/vllm_cpu_server.sh``), ``max_tokens`` 1 with the top
  20 logprobs as token ids;
- ``llamacpp``: llama-server on the f32 GGUF export (``scripts/llamacpp_server.sh``), the same
  request (``n_probs`` 20).

The servers get the prompts as token ids, as the proxy sends them. Per engine: rankings equal to
transformers' (exact), rankings equal once exact ties and near-ties are set aside (a disagreement
is a near-tie when the two candidates it swaps are within ``--tie`` in transformers' logits), the
largest label-logprob difference (log-softmax, so the engines' numbers compare directly) and the
wall time. Goal (issue 24): >= 99% of the prompts rank the same.

    python eval/bench_head_engines.py [--prompts 100] [--engines vllm,llamacpp]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def _near_tie(ref: list[float], a: list[int], b: list[int], tie: float) -> bool:
    """Whether every place where orders ``a`` and ``b`` differ swaps candidates whose reference
    scores are within ``tie`` of each other."""
    for x, y in zip(a, b, strict=True):
        if x != y and abs(ref[x] - ref[y]) > tie:
            return False
    return True


def main(
    prompts: Annotated[int, typer.Option(help="LoCoMo test prompts")] = 100,
    engines: Annotated[str, typer.Option()] = "vllm,llamacpp",
    threads: Annotated[int, typer.Option()] = 2,
    tie: Annotated[float, typer.Option(help="logit gap counted as a near-tie")] = 1e-3,
) -> None:
    import torch
    from bench_head_latency import HEAD, _rows
    from benchlib import machine, machine_line

    from memsifter.llm import BackendSpec, build_backend
    from memsifter.llm.llamacpp import launch_llamacpp_server
    from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
    from memsifter.models import resolve_model
    from memsifter.ranker.first_token import engine_scores, head_scores, order_scores

    torch.set_num_threads(threads)
    facts = machine()
    name = "smollm2-135m-instruct"
    path = resolve_model(name).path
    hf = build_backend(BackendSpec(kind="transformers", model=name, batch_size=1))
    tok = hf.tokenizer
    rows = _rows(*HEAD)[:prompts]
    ns = [int(r["n_candidates"]) for r in rows]
    ids = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    t0 = time.perf_counter()
    ref: list[list[float]] = []
    with torch.no_grad():
        for r, n in zip(rows, ns, strict=True):
            s = head_scores(hf.model, tok, [r["prompt"]], [n])[0]
            ref.append(torch.log_softmax(s.float(), -1).tolist())  # among the labels
    ref_s = time.perf_counter() - t0
    ref_orders = [order_scores(s) for s in ref]
    exact_ties = sum(len(set(s)) < len(s) for s in ref)

    def launch(engine: str) -> Any:
        if engine == "vllm":
            return launch_vllm_cpu_server(path, served_model_name=name, timeout=600)
        return launch_llamacpp_server(name, served_model_name=name, threads=threads, timeout=600)

    results: dict[str, Any] = {}
    for engine in [e.strip() for e in engines.split(",") if e.strip()]:
        with launch(engine) as url:
            be = build_backend(
                BackendSpec(kind="openai", model=name, base_url=url, served_model_name=name)
            )
            t0 = time.perf_counter()
            got = engine_scores(be, ids, ns)
            wall = time.perf_counter() - t0
        orders = [order_scores(s) for s in got]
        same = sum(o == r for o, r in zip(orders, ref_orders, strict=True))
        near = sum(
            o == r or _near_tie(s, o, r, tie)
            for o, r, s in zip(orders, ref_orders, ref, strict=True)
        )
        # Log-softmax among the labels on both sides: the engines' logprobs are over the whole
        # vocabulary, so they are renormalised over the labels first.
        diff = 0.0
        for g, r in zip(got, ref, strict=True):
            g_t = torch.log_softmax(torch.tensor(g), -1).tolist()
            diff = max(diff, max(abs(a - b) for a, b in zip(g_t, r, strict=True)))
        results[engine] = {
            "same": same,
            "same_or_near_tie": near,
            "n": len(rows),
            "max_label_logprob_diff": diff,
            "wall_s": wall,
            "disagree": [
                {"qid": rows[i]["qid"], "transformers": ref_orders[i], engine: orders[i]}
                for i in range(len(rows))
                if orders[i] != ref_orders[i]
            ][:10],
        }
    report = {
        "machine": facts,
        "prompts": len(rows),
        "transformers_wall_s": ref_s,
        "exact_ties_in_reference": exact_ties,
        "engines": results,
    }
    (HERE / "bench_head_engines.json").write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    lines = [
        "# The first-token head on three engines: the same rankings?",
        "",
        f"Machine: {machine_line(facts, run=True)}. Command: `python eval/bench_head_engines.py`"
        f" ({threads} threads). Model: SmolLM2-135M-Instruct (fp32 in transformers and vLLM, "
        f"the f32 GGUF in llama.cpp). {len(rows)} LoCoMo test prompts of the CPU recipe's head "
        f"data (conversations 8-9), {sum(ns) / len(ns):.1f} candidates on average; "
        f"transformers' scores have exact ties on {exact_ties}.",
        "",
        "| engine | same ranking | same, near-ties aside | max label logprob diff | wall s |",
        "|---|---|---|---|---|",
        f"| transformers (reference) | {len(rows)}/{len(rows)} | - | 0 | {ref_s:.1f} |",
    ]
    for engine, r in results.items():
        lines.append(
            f"| {engine} | {r['same']}/{r['n']} | {r['same_or_near_tie']}/{r['n']} | "
            f"{r['max_label_logprob_diff']:.2e} | {r['wall_s']:.1f} |"
        )
    lines += [
        "",
        f"A near-tie: every swapped pair within {tie:g} in transformers' logits. The servers "
        "return the next token's top 20 logprobs (token ids); every label of every prompt was "
        "among them (a missing one stops the run, named). Goal: >= 99% the same.",
    ]
    (HERE / "bench_head_engines.md").write_text("\n".join(lines) + "\n", "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
