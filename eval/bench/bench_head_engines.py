"""Engine agreement of the first-token ranking head
(eval/results/bench_head_engines/bench_head_engines.md and .json):
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

``--read marker`` measures the head's marker read instead (``head_read: marker``,
eval/results/bench_head_engines/bench_head_engines_marker.{md,json}): the same recipe rendered with
``layout: marked``
(``data/rl/locomo_smollm2_marker``, built when missing), each candidate scored by the logit of
" yes" at its closing marker; transformers in process (``head_scores(..., read="marker")``), the
servers started for that read (``marker_read=True``: vLLM as a pooling model, ``/pooling``
``token_classify``; llama-server with ``--embeddings --pooling none``, the hidden states times the
LM head's row client-side), compared as raw logits.

    python -m eval.bench.bench_head_engines [--prompts 100] [--engines vllm,llamacpp] [--read
    marker]
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

ROOT = Path(__file__).resolve().parents[2]


def _near_tie(ref: list[float], a: list[int], b: list[int], tie: float) -> bool:
    """Whether every place where orders ``a`` and ``b`` differ swaps candidates whose reference
    scores are within ``tie`` of each other."""
    for x, y in zip(a, b, strict=True):
        if x != y and abs(ref[x] - ref[y]) > tie:
            return False
    return True


MARKER = "data/rl/locomo_smollm2_marker"  # the head recipe rendered marked, read at markers


def _marker_rows() -> list[dict[str, Any]]:
    """The head recipe's test prompts rendered with ``layout: marked`` for ``head_read: marker``
    (the recipe's prompt block with those two keys changed; built once into :data:`MARKER`)."""
    import tempfile

    import yaml

    from eval.bench.bench_head_latency import HEAD, locomo_test_rows

    recipe = yaml.safe_load((ROOT / HEAD[0]).read_text())
    recipe["prompt"].update(layout="marked", head_read="marker")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "locomo_smollm2_marker.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return locomo_test_rows(str(path), MARKER)


def main(
    prompts: Annotated[int, typer.Option(help="LoCoMo test prompts")] = 100,
    engines: Annotated[str, typer.Option()] = "vllm,llamacpp",
    threads: Annotated[int, typer.Option()] = 2,
    tie: Annotated[float, typer.Option(help="logit gap counted as a near-tie")] = 1e-3,
    read: Annotated[str, typer.Option(help="the head read: label or marker")] = "label",
) -> None:
    import torch

    from eval.bench.bench_head_latency import HEAD, locomo_test_rows
    from eval.common import machine, machine_line
    from memsifter.llm import BackendSpec, build_backend
    from memsifter.llm.llamacpp import launch_llamacpp_server
    from memsifter.llm.vllm_cpu import launch_vllm_cpu_server
    from memsifter.models import resolve_model
    from memsifter.ranker.first_token import (
        HEAD_READS,
        engine_marker_scores,
        engine_scores,
        head_scores,
        order_scores,
    )

    if read not in HEAD_READS:
        raise typer.BadParameter(f"--read must be one of {HEAD_READS}, got {read!r}")
    marker = read == "marker"
    torch.set_num_threads(threads)
    facts = machine()
    name = "smollm2-135m-instruct"
    path = resolve_model(name).path
    hf = build_backend(BackendSpec(kind="transformers", model=name, batch_size=1))
    tok = hf.tokenizer
    rows = (_marker_rows() if marker else locomo_test_rows(*HEAD))[:prompts]
    ns = [int(r["n_candidates"]) for r in rows]
    texts = [r["prompt"] for r in rows]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    t0 = time.perf_counter()
    ref: list[list[float]] = []
    with torch.no_grad():
        for t, n in zip(texts, ns, strict=True):
            s = head_scores(hf.model, tok, [t], [n], read=read)[0, :n]
            # label: log-softmax among the labels (the servers' logprobs are over the whole
            # vocabulary, renormalised below); marker: the raw logits, as the servers give them
            ref.append(s.float().tolist() if marker else torch.log_softmax(s.float(), -1).tolist())
    ref_s = time.perf_counter() - t0
    ref_orders = [order_scores(s) for s in ref]
    exact_ties = sum(len(set(s)) < len(s) for s in ref)

    def launch(engine: str) -> Any:
        if engine == "vllm":
            return launch_vllm_cpu_server(
                path, served_model_name=name, timeout=600, marker_read=marker
            )
        return launch_llamacpp_server(
            name, served_model_name=name, threads=threads, timeout=600, marker_read=marker
        )

    results: dict[str, Any] = {}
    for engine in [e.strip() for e in engines.split(",") if e.strip()]:
        with launch(engine) as url:
            be = build_backend(
                BackendSpec(
                    kind="openai", model=name, base_url=url, served_model_name=name, server=engine
                )
            )
            t0 = time.perf_counter()
            got = engine_marker_scores(be, texts, ns) if marker else engine_scores(be, ids, ns)
            wall = time.perf_counter() - t0
        orders = [order_scores(s) for s in got]
        same = sum(o == r for o, r in zip(orders, ref_orders, strict=True))
        near = sum(
            o == r or _near_tie(s, o, r, tie)
            for o, r, s in zip(orders, ref_orders, ref, strict=True)
        )
        diff = 0.0
        for g, r in zip(got, ref, strict=True):
            g_t = g if marker else torch.log_softmax(torch.tensor(g), -1).tolist()
            diff = max(diff, max(abs(a - b) for a, b in zip(g_t, r, strict=True)))
        results[engine] = {
            "same": same,
            "same_or_near_tie": near,
            "n": len(rows),
            "max_marker_logit_diff" if marker else "max_label_logprob_diff": diff,
            "wall_s": wall,
            "disagree": [
                {"qid": rows[i]["qid"], "transformers": ref_orders[i], engine: orders[i]}
                for i in range(len(rows))
                if orders[i] != ref_orders[i]
            ][:10],
        }
    report = {
        "machine": facts,
        "read": read,
        "prompts": len(rows),
        "transformers_wall_s": ref_s,
        "exact_ties_in_reference": exact_ties,
        "engines": results,
    }
    stem = "bench_head_engines_marker" if marker else "bench_head_engines"
    (results("bench_head_engines") / f"{stem}.json").write_text(
        json.dumps(report, indent=2) + "\n", "utf-8"
    )
    diff_name = "max marker logit diff" if marker else "max label logprob diff"
    data = (
        f"the same recipe rendered with layout: marked ({MARKER}), read at each candidate's "
        'closing marker (the logit of " yes")'
        if marker
        else "the CPU recipe's head data"
    )
    lines = [
        "# The first-token head on three engines: the same rankings?",
        "",
        f"Machine: {machine_line(facts, run=True)}. Command: "
        "`python -m eval.bench.bench_head_engines"
        f"{' --read marker' if marker else ''}` ({threads} threads). Model: "
        "SmolLM2-135M-Instruct (fp32 in transformers and vLLM, the f32 GGUF in llama.cpp). "
        f"{len(rows)} LoCoMo test prompts of {data} (conversations 8-9), "
        f"{sum(ns) / len(ns):.1f} candidates on average; transformers' scores have exact ties "
        f"on {exact_ties}.",
        "",
        f"| engine | same ranking | same, near-ties aside | {diff_name} | wall s |",
        "|---|---|---|---|---|",
        f"| transformers (reference) | {len(rows)}/{len(rows)} | - | 0 | {ref_s:.1f} |",
    ]
    for engine, r in results.items():
        diff = r["max_marker_logit_diff" if marker else "max_label_logprob_diff"]
        lines.append(
            f"| {engine} | {r['same']}/{r['n']} | {r['same_or_near_tie']}/{r['n']} | "
            f"{diff:.2e} | {r['wall_s']:.1f} |"
        )
    how = (
        "The servers were started for the marker read: vLLM as a pooling model whose one-label "
        'token classifier is the LM head\'s row of " yes" (`/pooling`, `token_classify`), '
        "llama-server with `--embeddings --pooling none` (the hidden states times that row, "
        "client-side)."
        if marker
        else "The servers return the next token's top 20 logprobs (token ids); every label of "
        "every prompt was among them (a missing one stops the run, named)."
    )
    lines += [
        "",
        f"A near-tie: every swapped pair within {tie:g} in transformers' logits. {how} "
        "Goal: >= 99% the same.",
    ]
    (results("bench_head_engines") / f"{stem}.md").write_text("\n".join(lines) + "\n", "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
