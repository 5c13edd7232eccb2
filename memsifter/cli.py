"""The ``memsifter`` command line: thin wrappers over the library (typer + rich)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from memsifter.data.locations import locomo_path
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

DEFAULT_LOCOMO = locomo_path()


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
    prompt_spec: Annotated[
        str | None,
        typer.Option(
            help="the proxy's prompt spec (a prompt_spec.json, or a folder with one) for a model "
            "without its own; a trained model's folder carries it"
        ),
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
            "prompt": prompt_spec,
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
    prompt: Annotated[
        str,
        typer.Option(
            help="answerer prompt: ours, or locomo (LoCoMo's published prompting: category-5 "
            "forced choice, category-2 date hint; LoCoMo only)"
        ),
    ] = "ours",
    conversations: Annotated[str | None, typer.Option(help="comma-separated ids/indexes")] = None,
    max_questions: Annotated[int | None, typer.Option(help="first N questions")] = None,
    model: Annotated[str, typer.Option(help="proxy model (retriever memsifter)")] = (
        "smollm2-135m-instruct"
    ),
    backend: Annotated[str, typer.Option(help="proxy backend")] = "transformers",
    base_url: Annotated[str | None, typer.Option(help="proxy openai URL")] = None,
    coarse: Annotated[str | None, typer.Option(help="coarse filter before the proxy")] = None,
    coarse_budget: Annotated[
        int | None, typer.Option(help="proxy prompt budget in tokens (window minus completion)")
    ] = None,
    completion_tokens: Annotated[
        int | None, typer.Option(help="proxy completion budget (think + ranking) in tokens")
    ] = None,
    prompt_spec: Annotated[
        str | None,
        typer.Option(
            help="the proxy's prompt_spec.json (or a folder with one), if the model has none"
        ),
    ] = None,
    out: Annotated[str, typer.Option(help="output folder")] = "outputs/qa",
    judge_model: Annotated[
        str | None,
        typer.Option(
            help="LLM judge (J); none by default. LongMemEval uses its own per-type prompts; "
            "smollm2-135m-instruct with --judge-backend transformers is an offline pipeline "
            "check, not a result"
        ),
    ] = None,
    judge_backend: Annotated[str, typer.Option(help="judge backend: openai | transformers")] = (
        "openai"
    ),
    judge_base_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible judge server URL (http://host:port/v1)")
    ] = None,
    judge_rubric: Annotated[
        str,
        typer.Option(help="J's rubric (not LongMemEval): mem0 (the Mem0 paper's) | memsifter"),
    ] = "mem0",
) -> None:
    """Answer questions from the top-k retrieved sessions; write metrics.json, report.md and
    predictions.jsonl (per question: id, category, prediction, gold, scores). On LoCoMo:
    LoCoMo's own score by category, with and without category 5; J with --judge-model; on
    LongMemEval the benchmark judge's accuracy."""
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
        answer_prompt=prompt,
        max_questions=max_questions,
        conversations=[c.strip() for c in conversations.split(",")] if conversations else None,
        model=model,
        backend=backend,
        base_url=base_url,
        coarse=coarse,
        coarse_budget=coarse_budget,
        proxy_completion_tokens=completion_tokens,
        prompt=prompt_spec,
        out=out,
        judge_model=judge_model,
        judge_backend=judge_backend,
        judge_base_url=judge_base_url,
        judge_rubric=judge_rubric,
    )
    try:
        m = run_qa_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
        return

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    line = f"{retriever}: n={m['n_questions']} f1={num(m['f1'])} em={num(m['em'])}"
    if "locomo" in m:  # LoCoMo's own score; f1/em above leave category 5 out
        lo = m["locomo"]
        line += (
            f" locomo={num(lo['overall'])}"
            f" locomo_without_5={num(lo['overall_without_adversarial'])}"
            f" adversarial_acc={num(lo['adversarial_accuracy'])}"
        )
    if m.get("judge") is not None:
        line += f" J={num(m['judge'])} ({m['judge_rubric']['name']})"
    typer.echo(line)
    if "longmemeval" in m:
        j = m["longmemeval"]
        label = " (PIPELINE CHECK: offline judge, not a result)" if j["pipeline_check"] else ""
        typer.echo(f"LongMemEval judge {j['judge_model']}: accuracy={j['accuracy']:.3f}{label}")
    console.print(f"wrote {out}/metrics.json, report.md, predictions.jsonl")


@eval_app.command("proxy")
def eval_proxy(
    data: Annotated[Path, typer.Option(help="RL data folder (memsifter data rl)")],
    split: Annotated[str, typer.Option(help="train | validation | test")] = "test",
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=PATH, repeatable; PATH a model folder, adapter folder or built-in name"
        ),
    ] = None,
    run: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=FILE, repeatable: a model's saved run (runs/*.jsonl of an earlier eval of "
            "this split), re-scored instead of regenerated"
        ),
    ] = None,
    explicit_spec: Annotated[
        list[str] | None,
        typer.Option(help="model NAME without prompt_spec.json to evaluate on the data's spec"),
    ] = None,
    fuse: Annotated[
        list[str] | None, typer.Option(help="model NAME: add NAME+<coarse> (RRF with the coarse)")
    ] = None,
    pair: Annotated[
        list[str] | None, typer.Option(help="A-B: paired bootstrap 95% CIs of A minus B")
    ] = None,
    max_questions: Annotated[
        int | None, typer.Option(help="seeded random sample of N scoreable questions")
    ] = None,
    seed: Annotated[int, typer.Option(help="question sample and bootstrap seed")] = 0,
    batch_size: Annotated[int, typer.Option(help="prompts per generate call")] = 4,
    threads: Annotated[int | None, typer.Option(help="torch threads")] = None,
    out: Annotated[str, typer.Option(help="output folder (runs/ and default reports)")] = (
        "outputs/proxy_eval"
    ),
    out_md: Annotated[str | None, typer.Option(help="markdown report; default OUT/report.md")] = (
        None
    ),
    out_json: Annotated[
        str | None, typer.Option(help="json metrics; default OUT/metrics.json")
    ] = None,
    model_name: Annotated[str | None, typer.Option(help="the json's model field")] = None,
    start: Annotated[str | None, typer.Option(help="the json's start field (sft, base, …)")] = (
        None
    ),
) -> None:
    """Compare rankers on the same RL-data prompts of one split: the coarse order, models
    (greedy, failed parses score 0), RRF fusions; paired bootstrap CIs; write runs/*.jsonl, a
    markdown report and a json."""
    from memsifter.evaluation.proxy_eval import (
        ProxyEvalConfig,
        parse_model_option,
        render_table,
        run_proxy_eval,
    )

    try:
        cfg = ProxyEvalConfig(
            data=str(data),
            split=split,
            models=[parse_model_option(m) for m in model or []],
            runs=[parse_model_option(r, "--run") for r in run or []],
            explicit_spec=list(explicit_spec or []),
            fuse=list(fuse or []),
            pairs=list(pair or []),
            max_questions=max_questions,
            seed=seed,
            batch_size=batch_size,
            threads=threads,
            out=out,
            out_md=out_md,
            out_json=out_json,
            model_name=model_name,
            start=start,
        )
        result = run_proxy_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
        return
    typer.echo(render_table(result.rows))
    console.print(f"wrote {cfg.md_path}, {cfg.json_path}, {Path(out) / 'runs'}/")


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


@data_app.command("rl")
def data_rl(
    recipe: Annotated[Path, typer.Option(help="dataset recipe (configs/data/*.yaml)")],
    out: Annotated[Path, typer.Option(help="output folder (parquet splits, card, split.json)")],
    data: Annotated[
        list[str] | None,
        typer.Option(help="dataset file: NAME=PATH per source, or PATH for a one-source recipe"),
    ] = None,
    rankings: Annotated[
        Path | None,
        typer.Option(help='previous model\'s rankings, JSONL {"qid", "ranking"}; default: coarse'),
    ] = None,
    strategy: Annotated[str | None, typer.Option(help="override: curriculum | random")] = None,
    dry_run: Annotated[
        bool, typer.Option(help="load and split the sources, print the plan, build nothing")
    ] = False,
) -> None:
    """Build the GRPO dataset: budgeted proxy prompts and reward columns, split by conversation,
    the train split sampled by the curriculum. Writes OUT/{train,validation,test}.parquet,
    train_pool.parquet, README.md, prompt_spec.json, split.json, recipe.yaml, curriculum.json
    and curriculum_ndcg.png."""
    from rich.table import Table

    from memsifter.data.splits import SPLITS
    from memsifter.training.rl_data import (
        load_rl_data_config,
        parse_data_overrides,
        plan_sources,
        prepare_rl_data,
        with_data_paths,
    )

    try:
        cfg = load_rl_data_config(recipe)
        cfg = with_data_paths(cfg, parse_data_overrides(data or [], cfg))
        if strategy is not None:
            curriculum = dataclasses.replace(cfg.curriculum, strategy=strategy)
            cfg = dataclasses.replace(cfg, curriculum=curriculum)
        if dry_run:
            table = Table("source", "split", "conversations", "questions", "no evidence")
            for plan in plan_sources(cfg):
                for split, c in plan.counts().items():
                    table.add_row(
                        plan.config.name,
                        split,
                        str(c["conversations"]),
                        str(c["questions"]),
                        str(c["dropped_no_evidence"]),
                    )
            console.print(table)
            return
        result = prepare_rl_data(cfg, out, rankings, console=console)
    except (MemSifterError, ValueError) as e:
        _fail(e)
        return
    from rich import box

    # Borderless so the table fits an 80-column terminal.
    table = Table(
        "source", "split", "conv", "questions", "dropped", "rows", "no gold", "cands", "kept",
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for s in result.sources:
        for split in SPLITS:
            c = s.counts[split]
            table.add_row(
                s.source,
                split,
                str(c["conversations"]),
                str(c["questions"]),
                str(c["dropped_no_evidence"]),
                str(c["rows"]),
                str(c["no_gold_in_prompt"]),
                f"{c['candidates_mean']:.1f}",
                str(c.get("selected", c["rows"])),
            )
    console.print(table)
    rep = result.curriculum
    console.print(f"curriculum: {rep.strategy}, scored by {rep.scored_by}: {escape(rep.note)}")
    for sel in rep.sources:
        before = "-" if sel.ndcg_mean_before is None else f"{sel.ndcg_mean_before:.3f}"
        after = "-" if sel.ndcg_mean_after is None else f"{sel.ndcg_mean_after:.3f}"
        console.print(
            f"  {sel.source}: NDCG@{rep.k} mean {before} -> {after}; histogram "
            f"{sel.hist_before} -> {sel.hist_after}"
        )
        if sel.coarse_top1_gold_before is not None:
            console.print(
                f"  {sel.source}: coarse top-1 is gold in {sel.coarse_top1_gold_before:.3f} of "
                f"the pool -> {sel.coarse_top1_gold_after or 0.0:.3f} of the selection"
            )
    console.print(f"wrote {out} in {result.seconds:.1f}s")


@data_app.command("rank")
def data_rank(
    recipe: Annotated[Path, typer.Option(help="the recipe the next round's data will use")],
    model: Annotated[str, typer.Option(help="the previous round's model (e.g. epoch-N/averaged)")],
    out: Annotated[Path, typer.Option(help="rankings JSONL to write")],
    data: Annotated[list[str] | None, typer.Option(help="NAME=PATH or PATH overrides")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="completion budget")] = 512,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """Rank every training candidate of a recipe with a previous model, for the next round's
    curriculum (`memsifter data rl --rankings OUT`)."""
    from memsifter.training.rl_data import (
        build_rl_dataset,
        load_rl_data_config,
        parse_data_overrides,
        with_data_paths,
    )
    from memsifter.training.validation import rank_rows

    try:
        cfg = load_rl_data_config(recipe)
        cfg = with_data_paths(cfg, parse_data_overrides(data or [], cfg))
        # The whole pool: the curriculum selects from it afterwards, with these rankings.
        pool = dataclasses.replace(
            cfg, sources=[dataclasses.replace(s, count=None) for s in cfg.sources]
        )
        rows = build_rl_dataset(pool, console=console).dataset["train"]
        path, parse_rate = rank_rows(
            model, rows, out, max_new_tokens=max_new_tokens, threads=threads
        )
        console.print(f"wrote {len(rows)} rankings to {path} (parse rate {parse_rate:.2f})")
    except (MemSifterError, ValueError, FileNotFoundError) as e:
        _fail(e)


@app.command("train")
def train(
    config: Annotated[Path, typer.Argument(help="configs/train/*.yaml")],
    vllm_server_host: Annotated[
        str | None, typer.Option(help="TRL vllm-serve host for rollouts (vllm_mode server)")
    ] = None,
    answerer_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible working LLM for the reward")
    ] = None,
    judge_url: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible server of the reward config's judge (sources whose task "
            "metric is judge, e.g. LongMemEval)"
        ),
    ] = None,
    output_dir: Annotated[str | None, typer.Option(help="override output_dir")] = None,
    dry_run: Annotated[
        bool, typer.Option(help="build and print the GRPO config, load no model")
    ] = False,
    plan: Annotated[
        bool,
        typer.Option(
            help="print the batch and the memory per GPU (weights, gradients, optimizer, "
            "activations, logits, vLLM) against the config's plan section; load no model"
        ),
    ] = False,
    vllm_args: Annotated[
        bool,
        typer.Option(
            help="print, one per line, the rollout server's arguments for this config's policy "
            "(model, --max-model-len, --hf-overrides rope scaling); used by train_multinode.sh"
        ),
    ] = False,
    until: Annotated[
        str | None,
        typer.Option(help="stop after this stage: sft (the rest resumes on the next run)"),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="override a config key: KEY=VALUE, dotted, YAML value (repeatable)"
        ),
    ] = None,
) -> None:
    """Train the proxy: cold-start SFT (optional), then GRPO epochs with checkpoint averaging.
    Rerunning the same command resumes where it stopped."""
    from memsifter.training.config import load_train_config

    try:
        cfg = load_train_config(config, set_ or [])
        if output_dir:
            cfg.output_dir = output_dir
        if vllm_args:
            from memsifter.training.grpo import vllm_serve_args

            print("\n".join(vllm_serve_args(cfg)))
            return
        if plan:
            from memsifter.training.plan import plan_report

            text, memory = plan_report(cfg)
            print(text)  # plain: a table that rich would wrap at the terminal's width
            if not memory.fits:
                raise typer.Exit(1)
            return
        if dry_run:
            from memsifter.training.config import has_cuda
            from memsifter.training.grpo import grpo_config_kwargs

            # A vLLM config is shown as it runs on its GPUs; anything else as it runs here.
            cuda = has_cuda() or cfg.grpo.use_vllm
            kwargs = grpo_config_kwargs(
                cfg, cfg.output_dir, cuda=cuda, vllm_server_host=vllm_server_host
            )
            console.print(f"GRPOConfig ({'GPU' if cuda else 'CPU'}):")
            for k in sorted(kwargs):
                console.print(f"  {k}: {escape(repr(kwargs[k]))}")
            return
        from memsifter.training.loop import run_training

        run_training(
            cfg,
            vllm_server_host=vllm_server_host,
            answerer_url=answerer_url,
            judge_url=judge_url,
            log=lambda m: console.print(escape(m)),
            until=until,
        )
    except (MemSifterError, ValueError, FileNotFoundError) as e:
        _fail(e)


@app.command("export-adapter")
def export_adapter_cmd(
    tuned: Annotated[Path, typer.Argument(help="the trained model folder (e.g. epoch-N/averaged)")],
    out: Annotated[Path, typer.Option(help="adapter folder to write")],
    base: Annotated[str, typer.Option(help="the base it is an adapter of")] = (
        "smollm2-135m-instruct"
    ),
    rank: Annotated[int, typer.Option(help="LoRA rank of the factorised update")] = 64,
    max_rel_error: Annotated[
        float, typer.Option(help="refuse when a matrix loses more than this (Frobenius)")
    ] = 1e-3,
) -> None:
    """Write a trained model as a LoRA adapter of its base (SVD of the weight differences), with
    the model's prompt_spec.json and tokenizer, ready to ship and to load by folder."""
    from memsifter.models import load_tokenizer
    from memsifter.ranker.spec import read_spec, write_spec
    from memsifter.training.adapter_export import export_adapter

    try:
        spec = read_spec(tuned)
        report = export_adapter(
            base, tuned, out, rank=rank, max_rel_error=max_rel_error,
            probe="Question: what did Caroline research?",
        )  # fmt: skip
        write_spec(spec, out)
        load_tokenizer(base).save_pretrained(str(out))
    except (MemSifterError, ValueError) as e:
        _fail(e)
        return
    console.print(
        f"wrote {out}: rank {report.rank}, {report.n_matrices} matrices in layers "
        f"{report.layers[0]}-{report.layers[-1]}, worst relative error {report.max_rel_error:.1e}, "
        f"max logit difference {report.max_logit_diff:.1e}, {report.bytes / 2**20:.1f} MiB"
    )


@app.command("export-gguf")
def export_gguf_cmd(
    model: Annotated[
        str,
        typer.Argument(
            help="model folder, built-in name or LoRA adapter (e.g. memsifter-smollm2-135m-locomo)"
        ),
    ],
    out: Annotated[Path, typer.Argument(help="the .gguf file to write")],
    outtype: Annotated[
        str,
        typer.Option(
            help="f32 (the weights the fp32 transformers backend uses) | f16 | bf16 | q8_0"
        ),
    ] = "f32",
) -> None:
    """Write a model as one GGUF file for llama.cpp (an adapter is merged into its base first),
    with the converter of the llama.cpp that scripts/llamacpp_server.sh --setup-only built."""
    from memsifter.llm.llamacpp import export_gguf

    try:
        path = export_gguf(model, out, outtype)
    except MemSifterError as e:
        _fail(e)
        return
    typer.echo(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {outtype})")


@app.command("merge")
def merge(
    checkpoints: Annotated[
        list[Path], typer.Argument(help="model, Trainer checkpoint-N or PEFT LoRA adapter folders")
    ],
    out: Annotated[Path, typer.Option(help="output folder (must not exist, or be empty)")],
    dtype: Annotated[
        str,
        typer.Option(
            help="bf16 | fp16 | fp32 (default: fp32 even for bf16 checkpoints, whose mean a bf16 "
            "output would round back)"
        ),
    ] = "fp32",
    base: Annotated[
        str | None,
        typer.Option(help="base model for LoRA adapters; default: their base_model_name_or_path"),
    ] = None,
) -> None:
    """Average checkpoints into one model folder: the fp32 mean of every tensor, LoRA adapters
    merged into their base first. Writes OUT/averaging.json."""
    from memsifter.training.averaging import average_checkpoints

    try:
        report = average_checkpoints(checkpoints, out, dtype=dtype, base=base)
    except MemSifterError as e:
        _fail(e)
        return
    if report.tokenizer_from is None:
        console.print("[yellow]warning:[/] no tokenizer files found; OUT has weights only")
    typer.echo(
        f"averaged {len(report.inputs)} checkpoints ({report.n_tensors} tensors, "
        f"{report.n_parameters:,} parameters, {report.dtype}) into {report.out} "
        f"in {report.seconds:.1f}s"
    )


@app.command("serve")
def serve(
    config: Annotated[
        Path | None, typer.Option(help="serve config YAML (default configs/serve/default.yaml)")
    ] = None,
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8080,
    seed_sample: Annotated[
        bool, typer.Option("--seed-sample", help="store a sample user 'alice' and print a curl")
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="worker processes (uvicorn); over 1, /metrics sums every worker "
            "(Prometheus multiprocess mode, $PROMETHEUS_MULTIPROC_DIR or a temporary folder)",
        ),
    ] = 1,
) -> None:
    """Run the recall service (FastAPI; OpenAPI at /docs)."""
    from memsifter.serving.server import serve as run_server

    try:
        run_server(
            config,
            host=host,
            port=port,
            sample=seed_sample,
            log_level=log_level,
            workers=workers,
        )
    except MemSifterError as e:
        _fail(e)


if __name__ == "__main__":
    app()
