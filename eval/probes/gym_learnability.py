"""The memory gym's learnability benchmark: does the training stack learn, and do outcome
rewards beat retrieval labels, on a world built so that they must?

    python -m eval.probes.gym_learnability            # ~10 min on 2 cores; rerunning resumes
    python -m eval.probes.gym_learnability --quick    # the same pipeline on a smaller budget
    (smoke)

Stages, each resumable (outputs under ``outputs/gym/``):

1. the tiny gym proxy (:func:`memsifter.testing.gym.build_gym_proxy`), random weights;
2. RL data: ``configs/data/gym_first_token.yaml`` on the world ``configs/gym/bench_world.yaml``,
   candidates in chronological order (the paper's: ids are dates, so no position habit passes),
   read by the first-token ranking head (the prompt ends at ``<ranking>``; the logits over the
   labels are the ranking);
3. every recipe starts from the untrained proxy (the ``start`` row): the head has no format to
   learn, so no SFT, and whatever the model ranks by comes from the reward;
4. each recipe of :data:`RECIPES` with ``memsifter train`` (the project's own trainer: the
   first-token head's Plackett–Luce GRPO, :mod:`memsifter.training.pl_grpo`; the epoch
   loop, validation, averaging): R_ret only (``labels``), R_ans (``outcome``), R_ans without
   subtracting s_0 (``outcome_absolute``), R_ans on the curriculum's selection
   (``outcome_curriculum``); ``outcome_no_averaging`` is read from the outcome run
   (:data:`DERIVED`);
5. every ranker on the **test users** (never used to choose anything): BM25's order, the start
   model, each trained model, and the oracle (useful session first), scored by
   :mod:`memsifter.evaluation.gym`; paired-bootstrap 95% CIs of the per-question differences.

Writes ``eval/results/gym_learnability/gym_learnability.{md,json}`` and the learning curves
``eval/results/gym_learnability/gym_learnability_curves.png`` (validation NDCG@1 of the useful
session by step,
from each run's own checkpoint validation).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

ROOT = Path(__file__).resolve().parents[2]

WORLD = "configs/gym/bench_world.yaml"
DATA_RECIPE = "configs/data/gym_first_token.yaml"
# row name -> training config; every one starts from the untrained proxy
RECIPES: dict[str, str] = {
    "labels": "configs/train/gym_pl_labels.yaml",
    "outcome": "configs/train/gym_pl_outcome.yaml",
    "outcome_absolute": "configs/train/gym_pl_outcome_absolute.yaml",
    "outcome_curriculum": "configs/train/gym_pl_outcome.yaml",
}
# recipes whose train split is another data recipe's selection (validation and test are the same)
RECIPE_DATA: dict[str, str] = {"outcome_curriculum": "configs/data/gym_first_token_curriculum.yaml"}
# Rows read from another recipe's run. With one epoch, averaging changes only the final model:
# the trajectory (same seed, data, reward) is the outcome run's, so "no averaging" is that run's
# best checkpoint by the same select_metric, where the recipe ships the average of its top_k.
DERIVED: dict[str, str] = {"outcome_no_averaging": "outcome"}
PAIRS = (
    ("outcome", "start"),
    ("outcome", "labels"),
    ("outcome", "bm25"),
    ("labels", "bm25"),
    ("outcome", "outcome_absolute"),
    ("outcome", "outcome_no_averaging"),
    ("outcome_curriculum", "outcome"),
)
HEADLINE = ("ndcg@1_useful", "answer_acc@1", "answer_acc@3", "parsed")


def outputs_dir(quick: bool) -> Path:
    return ROOT / ("outputs/gym_quick" if quick else "outputs/gym")


def build_data(proxy: Path, data: Path, recipe: str = DATA_RECIPE) -> Path:
    """The benchmark's RL data (``recipe`` on ``WORLD``) rendered for ``proxy``."""
    import dataclasses

    from memsifter.training.rldata.build import load_rl_data_config, prepare_rl_data

    if not (data / "prompt_spec.json").is_file():
        cfg = load_rl_data_config(ROOT / recipe)
        cfg = dataclasses.replace(
            cfg,
            prompt=dataclasses.replace(cfg.prompt, model=str(proxy)),
            sources=[dataclasses.replace(s, path=str(ROOT / WORLD)) for s in cfg.sources],
        )
        prepare_rl_data(cfg, data)
    return data


def build(out: Path, recipe: str = DATA_RECIPE, log: Any = print) -> dict[str, Path]:
    """Stages 1-3: the proxy (also every recipe's start) and the RL data (``recipe``)."""
    from memsifter.testing.gym import build_gym_proxy

    proxy = out / "proxy"
    if not (proxy / "config.json").is_file():
        log(f"building the gym proxy in {proxy}")
        build_gym_proxy(proxy)
    name = "data" if recipe == DATA_RECIPE else f"data_{Path(recipe).stem}"
    return {"proxy": proxy, "data": build_data(proxy, out / name, recipe), "start": proxy}


def _data_dir(out: Path, name: str | None = None) -> Path:
    return out / ("data" if name not in RECIPE_DATA else f"data_{name}")


def _common_overrides(
    out: Path, run_dir: Path, quick: bool, model: Path, data: Path | None = None
) -> list[str]:
    data = out / "data" if data is None else data
    over = [f"output_dir={run_dir}", f"data={data}", f"model.name={model}"]
    if quick:
        over += [
            "epochs.max_steps=12",
            "epochs.save_steps=6",
            "epochs.validation_max_questions=16",
        ]
    return over


def train_recipes(
    out: Path, start: Path, quick: bool, names: list[str], log: Any = print
) -> dict[str, Path]:
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    finals: dict[str, Path] = {}
    for name in names:
        config = RECIPES[name]
        run_dir = out / "train" / name
        data = _data_dir(out, name)
        if name in RECIPE_DATA:
            build_data(out / "proxy", data, RECIPE_DATA[name])
        over = _common_overrides(out, run_dir, quick, start, data)
        cfg = load_train_config(ROOT / config, over)
        t0 = time.perf_counter()
        result = run_training(cfg, log=log)
        finals[name] = Path(result["model"])
        log(f"{name}: {result['model']} in {time.perf_counter() - t0:.0f} s")
    return finals


def best_checkpoint(run_dir: Path, config: str, start: Path) -> Path:
    """The run's best single checkpoint by its recipe's select_metric (or the start model, when
    the recipe keeps a start that validates higher): what ``top_k: 1`` would have shipped."""
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import rank_checkpoints

    cfg = load_train_config(ROOT / config)
    metric = cfg.epochs.select_metric.replace("ndcg@", "ndcg_")
    results = json.loads((run_dir / "epoch-0" / "validation.json").read_text())
    best = rank_checkpoints(results, metric)[0]
    if cfg.epochs.keep_start_if_better and results["start"][metric] > results[best][metric]:
        return start
    return run_dir / "epoch-0" / best


def rank_with(model: Path, rows: list[dict[str, Any]], spec: Any) -> dict[str, Any]:
    from memsifter.ranker.parse import parse_ranking
    from memsifter.training.validation import ValidationEngine, generate_completions

    engine = ValidationEngine(batch_size=16, ranking_head=spec.ranking_head)
    texts = generate_completions(
        model, rows, max_new_tokens=max(spec.completion_tokens, 1), engine=engine
    )
    parsed = [parse_ranking(t, int(r["n_candidates"])) for r, t in zip(rows, texts, strict=True)]
    return {
        "rankings": [list(p.ids) for p in parsed],
        "parsed": [p.ok for p in parsed],
        "completions": texts,
    }


def learning_curves(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Validation NDCG@1 (useful session) by global step, from each run's validation files."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for name in RECIPES:
        if not (out / "train" / name).is_dir():
            continue
        points: list[tuple[int, float]] = []
        offset = 0
        for edir in sorted((out / "train" / name).glob("epoch-*")):
            vfile = edir / "validation.json"
            if not vfile.is_file():
                continue
            results = json.loads(vfile.read_text())
            steps = 0
            for key, res in results.items():
                if key.startswith("checkpoint-") and res.get("ndcg_1_useful") is not None:
                    step = int(key.split("-")[1])
                    steps = max(steps, step)
                    points.append((offset + step, res["ndcg_1_useful"]))
                elif key == "start" and res.get("ndcg_1_useful") is not None and not points:
                    points.append((offset, res["ndcg_1_useful"]))
            offset += steps
        curves[name] = sorted(points)
    return curves


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in curves.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("validation NDCG@1 (useful session)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    quick: Annotated[bool, typer.Option(help="small budget, outputs/gym_quick")] = False,
    results: Annotated[str, typer.Option(help="report folder")] = str(
        ROOT / "eval/results/gym_learnability"
    ),
    recipe: Annotated[
        list[str] | None,
        typer.Option(help="train and report only these recipes (repeatable; default: all)"),
    ] = None,
) -> None:
    """The memory gym's learnability benchmark: proxy, data, recipes and the test table."""
    unknown = sorted(set(recipe or ()) - {*RECIPES, *DERIVED})
    if unknown:
        raise typer.BadParameter(
            f"unknown recipe(s) {unknown}; choose from {[*RECIPES, *DERIVED]}",
            param_hint="--recipe",
        )
    names = recipe or [*RECIPES, *DERIVED]

    from datasets import load_dataset

    from memsifter.data.gym import load_world, world_stats
    from memsifter.evaluation.gym import means, score_rankings
    from memsifter.evaluation.proxy_eval import paired_bootstrap
    from memsifter.machine import machine_facts, machine_line
    from memsifter.ranker.checkpoint import read_spec

    t0 = time.perf_counter()
    out = outputs_dir(quick)
    built = build(out)
    trained = [n for n in names if n in RECIPES]
    trained += [DERIVED[n] for n in names if n in DERIVED and DERIVED[n] not in trained]
    finals = train_recipes(out, built["start"], quick, trained)
    for name in names:
        if name in DERIVED:
            finals[name] = best_checkpoint(
                out / "train" / DERIVED[name], RECIPES[DERIVED[name]], built["start"]
            )
    spec = read_spec(built["data"])
    test = [
        r
        for r in load_dataset(
            "parquet", data_files=str(built["data"] / "test.parquet"), split="train"
        )
    ]
    memory = [r for r in test if r["useful_positions"]]
    no_memory = [r for r in test if not r["useful_positions"]]

    runs: dict[str, dict[str, Any]] = {
        "bm25": {"rankings": [list(r["coarse_order"]) for r in memory]},
        "start": rank_with(built["start"], memory, spec),
    }
    for name, path in finals.items():
        runs[name] = rank_with(path, memory, spec)
    runs["oracle"] = {
        "rankings": [
            list(r["useful_positions"])
            + [i for i in range(r["n_candidates"]) if i not in r["useful_positions"]]
            for r in memory
        ]
    }
    values = {
        n: score_rankings(memory, run["rankings"], run.get("parsed")) for n, run in runs.items()
    }
    rankers = {n: means(v) for n, v in values.items()}
    pairs = {
        f"{a}-{b}": paired_bootstrap(values[a], values[b])
        for a, b in PAIRS
        if a in values and b in values
    }
    none_s0 = (
        float(np.mean(score_rankings(no_memory, [[] for _ in no_memory])["s_0"]))
        if no_memory
        else None
    )
    curves = learning_curves(out)
    world = load_world(ROOT / WORLD)
    result = {
        "split": "test",
        "n_questions": len(memory),
        "n_no_memory_questions": len(no_memory),
        "no_memory_s_0": none_s0,
        "world": {**world.config.to_dict(), "stats": world_stats(world)},
        "quick": quick,
        "rankers": rankers,
        "paired_ci95": {p: {m: v["ci95"] for m, v in d.items()} for p, d in pairs.items()},
        "paired_mean": {p: {m: v["mean"] for m, v in d.items()} for p, d in pairs.items()},
        "curves": curves,
        "recipes": {
            n: RECIPES[n] + (f" on {RECIPE_DATA[n]}" if n in RECIPE_DATA else "")
            if n in RECIPES
            else f"the {DERIVED[n]} run's best checkpoint"
            for n in names
        },
        "machine": machine_line(machine_facts(), run=True),
        "seconds": round(time.perf_counter() - t0),
    }
    res = Path(results)
    res.mkdir(parents=True, exist_ok=True)
    stem = "gym_learnability_quick" if quick else "gym_learnability"
    if recipe:
        stem += "_" + "_".join(names)
    (res / f"{stem}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    plot_curves(curves, res / f"{stem}_curves.png")
    (res / f"{stem}.md").write_text(render(result, stem))
    print(render(result, stem))


def _f(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3f}"


def render(r: dict[str, Any], stem: str) -> str:
    cols = [
        "ndcg@1_useful",
        "answer_acc@1",
        "answer_acc@2",
        "answer_acc@3",
        "answer_acc@5",
        "parsed",
    ]
    lines = [
        "# Memory gym: learnability (test users)",
        "",
        f"`python -m eval.probes.gym_learnability{' --quick' if r['quick'] else ''}` "
        f"({r['seconds']} s; {r['machine']}). World `{WORLD}` (seed {r['world']['seed']}, level "
        f"`{r['world']['level']}`, size `{r['world']['size']}`); split **test**, "
        f"n = {r['n_questions']} memory questions (plus {r['n_no_memory_questions']} no-memory "
        f"questions, s_0 = {_f(r['no_memory_s_0'])}, the same for every ranker).",
        "",
        "Candidates in chronological order; rankings read by the first-token head "
        f"(`{DATA_RECIPE}`). `start` is the untrained proxy every recipe starts from; each "
        "trained row is `memsifter train` on its config (the head's Plackett-Luce GRPO, "
        "`memsifter.training.pl_grpo`): "
        + "; ".join(f"`{n}`: {c}" for n, c in r["recipes"].items())
        + ". `oracle`: the useful session first.",
        "",
        "| ranker | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for name, m in r["rankers"].items():
        lines.append(f"| {name} | " + " | ".join(_f(m.get(c)) for c in cols) + " |")
    lines += [
        "",
        "Paired bootstrap 95% CIs of per-question differences (10,000 resamples):",
        "",
        "| pair | " + " | ".join(HEADLINE[:3]) + " |",
        "|---|---|---|---|",
    ]
    for pair, ci in r["paired_ci95"].items():
        mean = r["paired_mean"][pair]
        cells = [
            f"{_f(mean.get(m))} [{_f(ci[m][0])}, {_f(ci[m][1])}]" if ci.get(m) else "-"
            for m in HEADLINE[:3]
        ]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    derived = [n for n in r["rankers"] if n in DERIVED]
    if derived:
        lines += [""] + [
            f"`{n}` is the `{DERIVED[n]}` run's best single checkpoint by its select_metric "
            "(what `top_k: 1` ships; with one epoch the trajectory is the same run's)."
            for n in derived
        ]
    lines += ["", f"Learning curves: `{stem}_curves.png`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    typer.run(main)
