"""The first-token head on LoCoMo with no position to copy: candidates by date, BM25's opinion as
a prior on each candidate's score (issue 40, items 2-4), on the held-out test conversations.

    python -m eval.probes.locomo_residual            # ~75 min on 2 cores; rerunning resumes

Every LoCoMo head trained with the candidates in BM25's order learned to copy a position
(``eval/results/proxy_locomo_test/``). Here the prompt shows the pages by date
(``configs/data/locomo_smollm2_residual.yaml``), the head reads a score at each page's closing
marker, and the Plackett-Luce policy is over ``h_i + lambda * -ln(1 + BM25 rank_i)``
(:mod:`memsifter.ranker.coarse_prior`): an untrained proxy ranks mostly as BM25 does, and
training can only add what the content tells it. Stages (outputs under ``outputs/`` and
``eval/results/proxy_locomo_residual/``):

1. the RL data (``memsifter data rl``), the recipe's lambda being what stage 2 measures;
2. the lambda sweep on the **validation** conversation with the start model: its marker scores
   once, fused offline with each lambda of a grid; NDCG@1 of the gold page and the share of
   prompts whose first page is BM25's (``lambda_sweep.json``). The recipe's lambda is the
   smallest whose fused start puts BM25's first page first on >= 3/4 of the prompts (a start
   near BM25 that still samples other first places); the run stops if the data's differs;
3. ``memsifter train configs/train/smollm2_cpu_residual.yaml``: the listwise cold start on the
   gold pages (the gym's pointing settings: LoRA top 6, lr 1e-3, batch 8), then PL-GRPO with
   the prefix KL (beta 0.05, 64 rankings a prompt) on R_ret; checkpoints chosen on
   conversation 7;
4. ``memsifter eval proxy`` on the test conversations (8-9): the start, the cold start and the
   GRPO run's averaged checkpoints (whichever the loop chose on validation, both are reported)
   against BM25 on the same candidates, with conversation-cluster paired CIs and
   the order-invariance check (5 permutations of 40 questions).

With ``--warm`` (issue 40, item 4) the head is first warmed on the reading gym rendered in
LoCoMo's format (``configs/data/gym_read_locomo_pages.yaml``: the same prompt spec, the gym's
sessions; ``configs/train/smollm2_cpu_gym_warm.yaml`` runs its listwise cold start on 512 of
the gym's training questions), and stage 3 trains
``configs/train/smollm2_cpu_residual_gym_warm.yaml`` from it. Stage 4 adds the warmed head as
its own row (``warm``: what the gym alone taught, before any LoCoMo step); the results go to
``eval/results/proxy_locomo_residual_gym_warm/``.

Test conversations never choose anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import git_head, machine, machine_line, results, rl_data, split_rows

ROOT = Path(__file__).resolve().parents[2]
DATA = ("configs/data/locomo_smollm2_residual.yaml", "data/rl/locomo_smollm2_residual")
RECIPE = "configs/train/smollm2_cpu_residual.yaml"
TRAINED = ROOT / "outputs/train/smollm2_cpu_residual"
NAME = "proxy_locomo_residual"
LAMBDAS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
AGREE = 0.75  # the share of first places the fused start must take from BM25


def sweep(folder: Path, out: Path) -> dict[str, Any]:
    """The start model's marker scores on validation, fused with each lambda of the grid."""
    if out.is_file():
        return json.loads(out.read_text())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.models import resolve_model
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.ranker.coarse_prior import fuse
    from memsifter.ranker.first_token import order_scores, prompt_scores

    spec = read_spec(folder)
    rows = [r for r in split_rows(folder, "validation") if r["gold_positions"]]
    path = resolve_model(spec.model).path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    scores = prompt_scores(
        model,
        tok,
        [r["prompt"] for r in rows],
        [int(r["n_candidates"]) for r in rows],
        4,
        labels=spec.labels,
        read=spec.head_read,
    )
    bm25_top = [r["coarse_order"][0] for r in rows]
    gold = [set(r["gold_positions"]) for r in rows]
    n = len(rows)

    def share(hits: Any) -> float:
        return sum(hits) / n

    grid = []
    for lam in LAMBDAS:
        firsts = [
            order_scores(fuse(s, r["coarse_order"], lam))[0]
            for s, r in zip(scores, rows, strict=True)
        ]
        grid.append(
            {
                "lambda": lam,
                "ndcg@1": share(f in g for f, g in zip(firsts, gold, strict=True)),
                "first_as_bm25": share(f == b for f, b in zip(firsts, bm25_top, strict=True)),
            }
        )
    chosen = next(g["lambda"] for g in grid if g["first_as_bm25"] >= AGREE)
    result = {
        "split": "validation",
        "n": n,
        "bm25_ndcg@1": share(b in g for b, g in zip(bm25_top, gold, strict=True)),
        "rule": f"the smallest lambda whose fused start puts BM25's first page first on >= {AGREE}",
        "chosen": chosen,
        "grid": grid,
        "code_version": git_head(),
        "command": "python -m eval.probes.locomo_residual",
        "machine": machine_line(machine(), run=True),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


WARM_DATA = ("configs/data/gym_read_locomo_pages.yaml", "data/rl/gym_read_locomo_pages")
WARM_UP = "configs/train/smollm2_cpu_gym_warm.yaml"
WARM_RECIPE = "configs/train/smollm2_cpu_residual_gym_warm.yaml"


def main(
    invariance_questions: Annotated[
        int, typer.Option(help="questions in the order-invariance check")
    ] = 40,
    warm: Annotated[
        bool,
        typer.Option(
            "--warm",
            help="first warm the head on the reading gym rendered in LoCoMo's format "
            f"({WARM_UP}, --until sft), then train {WARM_RECIPE} from it; reported under "
            f"eval/results/{NAME}_gym_warm/ with the warmed head as its own row",
        ),
    ] = False,
) -> None:
    """Train and evaluate the residual head on LoCoMo (stages in the module doc)."""
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    folder = rl_data(*DATA)
    # The recipe's lambda is the plain run's sweep on validation, whichever start follows.
    lam = sweep(folder, results(NAME) / "lambda_sweep.json")
    spec = read_spec(folder)
    if spec.coarse_weight != lam["chosen"]:
        raise SystemExit(
            f"{DATA[0]} has coarse_weight {spec.coarse_weight}, the validation sweep chose "
            f"{lam['chosen']}: set it and rebuild {DATA[1]}"
        )
    name, recipe, models, pairs = NAME, RECIPE, [f"start={spec.model}"], []
    if warm:
        warm_spec = read_spec(rl_data(*WARM_DATA))
        if warm_spec.to_dict() != spec.to_dict():  # the same format is the point of the warm-up
            raise SystemExit(f"{WARM_DATA[0]}'s prompt spec differs from {DATA[0]}'s")
        warmed = Path(run_training(load_train_config(ROOT / WARM_UP), until="sft")["model"])
        name, recipe = f"{NAME}_gym_warm", WARM_RECIPE
        models.append(f"warm={warmed.relative_to(ROOT) if warmed.is_absolute() else warmed}")
        pairs += ["warm-bm25", "warm-start", "cold-warm"]
    cfg = load_train_config(ROOT / recipe)
    trained = ROOT / cfg.output_dir
    dest = results(name)
    chosen = Path(run_training(cfg)["model"])  # the loop's choice on validation
    for src in sorted(trained.glob("*/validation.json")):  # the run's record, beside the table
        (dest / f"{src.parent.name}_validation.json").write_bytes(src.read_bytes())
    (dest / "summary.json").write_bytes((trained / "summary.json").read_bytes())
    cold, grpo = (
        (trained / "sft" / "final").relative_to(ROOT),
        (trained / "epoch-0" / "averaged").relative_to(ROOT),
    )
    print(f"the loop chose {chosen} on validation; both are evaluated")
    models += [f"cold={cold}", f"grpo={grpo}"]
    pairs += ["cold-bm25", "grpo-bm25", "start-bm25", "cold-start", "grpo-start", "grpo-cold"]
    cmd = [sys.executable, "-m", "memsifter.cli", "eval", "proxy", "--data", DATA[1],
           "--split", "test", "--explicit-spec", "start"]  # fmt: skip
    for m in models:
        cmd += ["--model", m]
    for p in pairs:
        cmd += ["--pair", p]
    cmd += [
        "--invariance-questions", str(invariance_questions),
        "--seed", "0", "--out", f"outputs/{name}",
        "--out-md", str((dest / f"{name}.md").relative_to(ROOT)),
        "--out-json", str((dest / f"{name}.json").relative_to(ROOT)),
        "--model-name", "smollm2-135m-residual" + ("-gym-warm" if warm else ""),
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)


if __name__ == "__main__":
    typer.run(main)
