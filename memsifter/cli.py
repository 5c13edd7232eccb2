"""The ``memsifter`` command line: thin wrappers over the library (typer + rich)."""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from memsifter.config import apply_overrides, from_dict, read_yaml, setting
from memsifter.config_cli import Flag, config_options
from memsifter.data.gym import GymConfig
from memsifter.data.locations import locomo_path
from memsifter.errors import MemSifterError
from memsifter.evaluation.config import (
    ProxyEvalConfig,
    QAEvalConfig,
    RetrievalEvalConfig,
    parse_model_option,
)
from memsifter.serving.config import DEFAULT_CONFIG, ServeConfig
from memsifter.training.config import TrainConfig
from memsifter.training.rldata.recipe import RLDataConfig

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


def _fail(e: Exception) -> NoReturn:
    # escape(): our messages end in "[file=..., record=..., field=...]", which rich would
    # otherwise swallow as markup.
    console.print(f"[bold red]error:[/] {escape(str(e))}")
    raise typer.Exit(2)


# The eval commands' options are their configs' fields (memsifter.config_cli); these tables keep
# the flags that predate that and differ from the field.
EVAL_FLAGS = {
    "proxy_completion_tokens": Flag("--completion-tokens"),
    "prompt": Flag("--prompt-spec"),
    "conversations": Flag(comma=True),
    "data": Flag(default=DEFAULT_LOCOMO),  # $MEMSIFTER_LOCOMO when it is set
}
RETRIEVAL_FLAGS = {**EVAL_FLAGS, "retrievers": Flag("--retriever")}
QA_FLAGS = {**EVAL_FLAGS, "answer_prompt": Flag("--prompt")}
PROXY_EVAL_FLAGS = {
    "data": Flag(parse=lambda value, _flag: str(Path(value))),  # data/rl/x/ -> data/rl/x
    "models": Flag("--model", parse=parse_model_option),
    "runs": Flag("--run", parse=parse_model_option),
    "pairs": Flag("--pair"),
}


@eval_app.command("retrieval")
@config_options(
    RetrievalEvalConfig,
    flags=RETRIEVAL_FLAGS,
    config_help="YAML config (configs/eval/*.yaml); the flags override it",
    on_error=_fail,
)
def eval_retrieval(cfg: RetrievalEvalConfig) -> None:
    """Rank every question's haystack with coarse filters or the proxy (`--retriever memsifter`);
    write metrics.json, report.md and a recall@k plot."""
    from memsifter.evaluation.retrieval import render_table, run_retrieval_eval

    try:
        results = run_retrieval_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
    typer.echo(render_table(results, cfg.haystack))
    console.print(f"wrote {cfg.out}/metrics.json, report.md, recall_at_k.png")


@eval_app.command("qa")
@config_options(QAEvalConfig, flags=QA_FLAGS, on_error=_fail)
def eval_qa(cfg: QAEvalConfig) -> None:
    """Answer questions from the top-k retrieved sessions; write metrics.json, report.md and
    predictions.jsonl (per question: id, category, prediction, gold, scores). On LoCoMo:
    LoCoMo's own score by category, with and without category 5; J with --judge-model; on
    LongMemEval the benchmark judge's accuracy."""
    from memsifter.evaluation.qa import run_qa_eval

    try:
        m = run_qa_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    line = f"{cfg.retriever}: n={m['n_questions']} f1={num(m['f1'])} em={num(m['em'])}"
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
    console.print(f"wrote {cfg.out}/metrics.json, report.md, predictions.jsonl")


@eval_app.command("proxy")
@config_options(ProxyEvalConfig, flags=PROXY_EVAL_FLAGS, on_error=_fail)
def eval_proxy(cfg: ProxyEvalConfig) -> None:
    """Compare rankers on the same RL-data prompts of one split: the coarse order, models
    (greedy, failed parses score 0), RRF fusions; paired bootstrap CIs; write runs/*.jsonl, a
    markdown report and a json."""
    from memsifter.evaluation.proxy_eval import render_table, run_proxy_eval

    try:
        result = run_proxy_eval(cfg, console=console)
    except MemSifterError as e:
        _fail(e)
    typer.echo(render_table(result.rows))
    console.print(f"wrote {cfg.md_path}, {cfg.json_path}, {Path(cfg.out) / 'runs'}/")


@data_app.command("stats")
def data_stats(
    dataset: Annotated[
        str, typer.Option(help="locomo | longmemeval | memsifter | jsonl | gym")
    ] = "locomo",
    data: Annotated[str, typer.Option(help="dataset file (or folder: memsifter)")] = DEFAULT_LOCOMO,
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
    dataset: Annotated[
        str, typer.Option(help="locomo | longmemeval | memsifter | jsonl | gym")
    ] = "locomo",
    data: Annotated[str, typer.Option(help="dataset file (or folder: memsifter)")] = DEFAULT_LOCOMO,
) -> None:
    """Convert any supported dataset into MemSifter's own JSONL format."""
    from memsifter.data import dump_jsonl, load_dataset

    try:
        dump_jsonl(load_dataset(dataset, data), out)
    except MemSifterError as e:
        _fail(e)
    typer.echo(f"wrote {out}")


@dataclasses.dataclass(frozen=True)
class GymCommand(GymConfig):
    out: Path = setting(Path("outputs/gym/world"), help="folder for world.json and its card")


@data_app.command("gym")
@config_options(GymCommand, on_error=_fail)
def data_gym(cfg: GymCommand) -> None:
    """Generate a memory-gym world (memsifter.data.gym): world.json, its card README.md and
    stats.json. The same config writes the same bytes."""
    from memsifter.data.gym import generate_world, world_stats, write_world

    try:
        world = generate_world(
            GymConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(GymConfig)})
        )
    except MemSifterError as e:
        _fail(e)
    path = write_world(world, cfg.out)
    for split, st in world_stats(world).items():
        typer.echo(
            f"{split}: {st['users']} users, {st['questions']} questions {st['by_kind']}, "
            f"labels disagree on {st['labels_disagree_share']:.1%} of memory questions"
        )
    typer.echo(f"wrote {path} (load it with --dataset gym --data {path})")


@data_app.command("rl")
@config_options(
    RLDataConfig,
    flags={"seed": Flag(help="hash split and curriculum tie-breaks / random sampling")},
    config_param=Annotated[Path, typer.Option("--recipe", help="configs/data/*.yaml")],
    config_default=inspect.Parameter.empty,
    on_error=_fail,
)
def data_rl(
    cfg: RLDataConfig,
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
    from memsifter.training.rldata.build import parse_data_overrides as overrides
    from memsifter.training.rldata.build import plan_sources, prepare_rl_data, with_data_paths

    try:
        cfg = with_data_paths(cfg, overrides(data or [], cfg))
        if strategy is not None:
            curriculum = dataclasses.replace(cfg.curriculum, strategy=strategy)
            cfg = dataclasses.replace(cfg, curriculum=curriculum)
        if dry_run:
            table = Table("source", "split", "conversations", "questions", "no evidence")
            for plan in plan_sources(cfg):
                for split, c in plan.counts().items():
                    keys = ("conversations", "questions", "dropped_no_evidence")
                    table.add_row(plan.config.name, split, *(str(c[k]) for k in keys))
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
            keys = ("conversations", "questions", "dropped_no_evidence", "rows")
            keys += ("no_gold_in_prompt",)
            table.add_row(
                s.source,
                split,
                *(str(c[k]) for k in keys),
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
    model_recipe: Annotated[
        Path | None,
        typer.Option(
            help="the recipe whose prompts the model reads, when not --recipe's (e.g. a "
            "first-token head ranking for a written-ranking recipe): its rankings are carried "
            "to --recipe's prompts by session id"
        ),
    ] = None,
) -> None:
    """Rank every training candidate of a recipe with a previous model, for the next round's
    curriculum (`memsifter data rl --rankings OUT`) or a cold start's targets (`sft.target:
    rankings`)."""
    from memsifter.training.rldata.build import (
        build_rl_dataset,
        load_rl_data_config,
        parse_data_overrides,
        with_data_paths,
    )
    from memsifter.training.rldata.curriculum import carry_rankings, read_rankings, write_rankings
    from memsifter.training.validation import ValidationEngine, rank_rows

    def pool(path: Path) -> tuple[Any, Any]:
        cfg = load_rl_data_config(path)
        cfg = with_data_paths(cfg, parse_data_overrides(data or [], cfg))
        # The whole pool: the curriculum selects from it afterwards, with these rankings.
        whole = dataclasses.replace(
            cfg, sources=[dataclasses.replace(s, count=None) for s in cfg.sources]
        )
        return cfg, build_rl_dataset(whole, console=console).dataset["train"]

    try:
        cfg, rows = pool(recipe)
        read_cfg, read_rows = pool(model_recipe) if model_recipe else (cfg, rows)
        ranked = out if model_recipe is None else out.with_suffix(".ranked.jsonl")
        path, parse_rate = rank_rows(
            model,
            read_rows,
            ranked,
            max_new_tokens=max_new_tokens,
            # an untrained base model has no spec of its own: the data's says how to read it
            engine=ValidationEngine.for_spec(read_cfg.prompt, threads=threads),
        )
        if model_recipe is not None:
            own = read_rankings(ranked, {str(r["qid"]): int(r["n_candidates"]) for r in read_rows})
            carried = carry_rankings(own, read_rows, rows)
            path = write_rankings(out, carried.rankings.items())  # in the rows' order
            console.print(
                f"carried to {recipe}'s prompts by session id: {carried.dropped} ranked "
                f"session(s) not shown there, {carried.unranked} shown there but not ranked"
            )
        console.print(f"wrote {len(rows)} rankings to {path} (parse rate {parse_rate:.2f})")
    except (MemSifterError, ValueError, FileNotFoundError) as e:
        _fail(e)


# source/overrides: the command's own record. --set edits the file, under the typed flags.
TRAIN_FLAGS = {
    "output_dir": Flag(help="override output_dir"),
    "data": Flag(help="the RL data folder (`memsifter data rl --out`)"),
    "reward": Flag(help="reward config YAML (configs/rewards/*.yaml)"),
    "threads": Flag(help="torch CPU threads (default: torch's own)"),
    "barrier_timeout_s": Flag(help="seconds the other processes wait at a barrier"),
    **dict.fromkeys(("source", "overrides"), Flag(off=True)),
}


def _train_yaml(path: Path | None, own: Mapping[str, Any]) -> Any:
    data, sets = read_yaml(path or ""), own["set_"] or []
    return apply_overrides(data, sets, file=str(path)) if sets and isinstance(data, dict) else data


@app.command("train")
@config_options(
    TrainConfig,
    flags=TRAIN_FLAGS,
    config_param=Annotated[Path, typer.Argument(help="configs/train/*.yaml")],
    config_default=inspect.Parameter.empty,
    load=_train_yaml,
    on_error=_fail,
)
def train(
    cfg: TrainConfig,
    config: Path,
    vllm_server_host: Annotated[
        str | None, typer.Option(help="TRL vllm-serve rollout host")
    ] = None,
    answerer_url: Annotated[str | None, typer.Option(help="the reward's working LLM")] = None,
    judge_url: Annotated[
        str | None, typer.Option(help="OpenAI server of the reward's judge")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="print the GRPO config, load no model")] = False,
    plan: Annotated[
        bool, typer.Option(help="print the batch and memory per GPU vs the plan; load no model")
    ] = False,
    vllm_args: Annotated[
        bool, typer.Option(help="print the rollout server's arguments (train_multinode.sh)")
    ] = False,
    until: Annotated[
        str | None, typer.Option(help="stop after this stage: sft (resumable)")
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
    cfg.source, cfg.overrides = str(config), list(set_ or [])
    try:
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
    from memsifter.ranker.checkpoint import read_spec, save_spec
    from memsifter.training.adapter_export import export_adapter

    try:
        spec = read_spec(tuned)
        report = export_adapter(
            base, tuned, out, rank=rank, max_rel_error=max_rel_error,
            probe="Question: what did Caroline research?",
        )  # fmt: skip
        save_spec(spec, out)
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
@config_options(
    ServeConfig,
    config_help="serve config YAML (default configs/serve/default.yaml); the flags override it",
    load=lambda path, _own: read_yaml(path or DEFAULT_CONFIG),
    on_error=_fail,
)
def serve(
    cfg: ServeConfig,
    config: Path | None,
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
    """Run the recall service (FastAPI; OpenAPI schema at /openapi.json)."""
    from memsifter.serving.server import serve as run_server

    source, copy = config or DEFAULT_CONFIG, None
    try:
        # The server (and each --workers process) reads a file: typed flags reach it as a copy
        # of the config with them applied; without any, the file itself, as before.
        if cfg != from_dict(ServeConfig, read_yaml(source), file=str(source)):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump(dataclasses.asdict(cfg), f, sort_keys=False)
            config = copy = Path(f.name)
        run_server(
            config, host=host, port=port, sample=seed_sample, log_level=log_level, workers=workers
        )
    except MemSifterError as e:
        _fail(e)
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)


@app.command("mcp")
def mcp_cmd(
    user: Annotated[str, typer.Option(help="the user whose memory the tools read and write")],
    config: Annotated[
        Path | None, typer.Option(help="serve config YAML (default configs/serve/default.yaml)")
    ] = None,
    key_env: Annotated[
        str, typer.Option(help="environment variable holding the tenant API key")
    ] = "MEMSIFTER_API_KEY",
    log_level: Annotated[
        str, typer.Option(help="debug | info | warning | error (logs go to stderr)")
    ] = "warning",
    create_db: Annotated[
        bool,
        typer.Option(
            "--create-db",
            help="start an empty memory if the config's database has none (by default "
            "`memsifter mcp` only opens an existing one, as `memsifter serve` made it)",
        ),
    ] = False,
) -> None:
    """Serve one user's memory as MCP tools over stdio (recall, remember, add_fact, facts,
    forget) for an MCP client such as a desktop assistant; see docs/mcp.md."""
    from memsifter.serving.mcp import run_stdio

    try:
        run_stdio(config, user=user, key_env=key_env, log_level=log_level, create_db=create_db)
    except MemSifterError as e:
        _fail(e)


if __name__ == "__main__":
    app()
