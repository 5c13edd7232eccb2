"""The ``memsifter`` command line: thin wrappers over the library (typer + rich)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from memsifter.errors import MemSifterError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="MemSifter: train, evaluate and serve a think-and-rank memory proxy.",
)
eval_app = typer.Typer(no_args_is_help=True, help="Benchmarks.")
data_app = typer.Typer(no_args_is_help=True, help="Inspect and convert datasets.")
app.add_typer(eval_app, name="eval")
app.add_typer(data_app, name="data")
console = Console(stderr=True)

DEFAULT_LOCOMO = os.environ.get("MEMSIFTER_LOCOMO", "../shared/data/locomo/locomo10.json")


def _fail(e: Exception) -> None:
    # escape(): our messages end in "[file=..., record=..., field=...]", which rich would
    # otherwise swallow as markup.
    console.print(f"[bold red]error:[/] {escape(str(e))}")
    raise typer.Exit(2)


@eval_app.command("retrieval")
def eval_retrieval(
    dataset: Annotated[str | None, typer.Option(help="locomo | longmemeval | jsonl")] = None,
    data: Annotated[str | None, typer.Option(help="dataset file")] = None,
    retriever: Annotated[
        list[str] | None,
        typer.Option(
            help="coarse filter spec; repeat for several (bm25, minilm, wordllama, bge-m3[:DIR], "
            "st:MODEL, hybrid:A+B)"
        ),
    ] = None,
    haystack: Annotated[str | None, typer.Option(help="native | 32k | 128k | 1m")] = None,
    conversations: Annotated[
        str | None, typer.Option(help="comma-separated conversation ids or 0-based indexes")
    ] = None,
    out: Annotated[str | None, typer.Option(help="output folder")] = None,
    seed: Annotated[int | None, typer.Option(help="haystack seed")] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer (hub id or folder) for token budgets; default: approx regex"),
    ] = None,
    max_questions: Annotated[int | None, typer.Option(help="smoke runs: first N")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config (configs/eval/*.yaml)")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="proxy model for --retriever memsifter (hub id, folder, smollm2-135m-instruct)"
        ),
    ] = None,
    backend: Annotated[str | None, typer.Option(help="transformers | openai | vllm")] = None,
    base_url: Annotated[str | None, typer.Option(help="openai backend server URL")] = None,
    coarse: Annotated[str | None, typer.Option(help="coarse filter in front of the proxy")] = None,
    coarse_budget: Annotated[
        int | None,
        typer.Option(help="proxy prompt budget in tokens (its window minus the completion budget)"),
    ] = None,
    completion_tokens: Annotated[
        int | None, typer.Option(help="proxy completion budget (think + ranking) in tokens")
    ] = None,
) -> None:
    """Rank every question's haystack with coarse filters or the proxy (`--retriever memsifter`);
    write metrics.json, report.md and a recall@k plot."""
    from memsifter.config import load_config
    from memsifter.evaluation.retrieval import RetrievalEvalConfig, render_table, run_retrieval_eval

    try:
        cfg = (
            load_config(RetrievalEvalConfig, config)
            if config
            else RetrievalEvalConfig(data=DEFAULT_LOCOMO)
        )
        overrides = {
            "dataset": dataset,
            "data": data,
            "retrievers": retriever or None,
            "haystack": haystack,
            "out": out,
            "seed": seed,
            "tokenizer": tokenizer,
            "max_questions": max_questions,
            "model": model,
            "backend": backend,
            "base_url": base_url,
            "coarse": coarse,
            "coarse_budget": coarse_budget,
            "proxy_completion_tokens": completion_tokens,
            "conversations": [c.strip() for c in conversations.split(",")]
            if conversations
            else None,
        }
        cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
        results = run_retrieval_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
        return
    typer.echo(render_table(results, cfg.haystack))
    console.print(f"wrote {cfg.out}/metrics.json, report.md, recall_at_k.png")


@eval_app.command("qa")
def eval_qa(
    dataset: Annotated[str, typer.Option(help="locomo | longmemeval | jsonl")] = "locomo",
    data: Annotated[str, typer.Option(help="dataset file")] = DEFAULT_LOCOMO,
    retriever: Annotated[
        str, typer.Option(help="coarse filter spec, memsifter (the proxy), full, or none")
    ] = "bm25",
    answerer: Annotated[str, typer.Option(help="working LLM")] = "smollm2-135m-instruct",
    answerer_backend: Annotated[str, typer.Option(help="transformers | openai | vllm")] = (
        "transformers"
    ),
    answerer_base_url: Annotated[str | None, typer.Option(help="openai answerer URL")] = None,
    answerer_window: Annotated[int, typer.Option(help="answerer context window")] = 8192,
    top_k: Annotated[int, typer.Option(help="sessions given to the answerer")] = 5,
    memory_order: Annotated[
        str, typer.Option(help="how the answerer shows the top k: rank | chronological")
    ] = "rank",
    conversations: Annotated[str | None, typer.Option(help="comma-separated ids/indexes")] = None,
    max_questions: Annotated[int | None, typer.Option(help="first N questions")] = None,
    model: Annotated[str, typer.Option(help="proxy model (retriever memsifter)")] = (
        "smollm2-135m-instruct"
    ),
    backend: Annotated[str, typer.Option(help="proxy backend")] = "transformers",
    base_url: Annotated[str | None, typer.Option(help="proxy openai URL")] = None,
    coarse: Annotated[str, typer.Option(help="coarse filter before the proxy")] = "bm25",
    out: Annotated[str, typer.Option(help="output folder")] = "outputs/qa",
) -> None:
    """Answer questions from the top-k retrieved sessions; write metrics.json (f1, em)."""
    from memsifter.evaluation.qa import QAEvalConfig, run_qa_eval

    cfg = QAEvalConfig(
        dataset=dataset,
        data=data,
        retriever=retriever,
        answerer=answerer,
        answerer_backend=answerer_backend,
        answerer_base_url=answerer_base_url,
        answerer_window=answerer_window,
        top_k=top_k,
        memory_order=memory_order,
        max_questions=max_questions,
        conversations=[c.strip() for c in conversations.split(",")] if conversations else None,
        model=model,
        backend=backend,
        base_url=base_url,
        coarse=coarse,
        out=out,
    )
    try:
        m = run_qa_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
        return
    typer.echo(
        f"{retriever}: n={m['n_questions']} f1={m['f1']:.3f} em={m['em']:.3f} "
        f"locomo={m['locomo_score']:.3f}"
    )
    console.print(f"wrote {out}/metrics.json, predictions.jsonl")


@data_app.command("stats")
def data_stats(
    dataset: Annotated[str, typer.Option(help="locomo | longmemeval | jsonl")] = "locomo",
    data: Annotated[str, typer.Option(help="dataset file")] = DEFAULT_LOCOMO,
) -> None:
    """Load a dataset and print what the loader saw (and repaired)."""
    from memsifter.data import load_dataset

    try:
        ds = load_dataset(dataset, data)
    except MemSifterError as e:
        _fail(e)
        return
    typer.echo(ds.report.summary())


@data_app.command("to-jsonl")
def data_to_jsonl(
    out: Annotated[Path, typer.Argument(help="output .jsonl")],
    dataset: Annotated[str, typer.Option(help="locomo | longmemeval | jsonl")] = "locomo",
    data: Annotated[str, typer.Option(help="dataset file")] = DEFAULT_LOCOMO,
) -> None:
    """Convert any supported dataset into MemSifter's own JSONL format."""
    from memsifter.data import dump_jsonl, load_dataset

    try:
        dump_jsonl(load_dataset(dataset, data), out)
    except MemSifterError as e:
        _fail(e)
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    app()
