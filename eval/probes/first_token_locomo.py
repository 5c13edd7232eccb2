"""The memory gym's lesson carried to LoCoMo: the CPU recipe on the first-token ranking head,
on the test conversations, beside the generate recipe's committed runs.

    python -m eval.probes.first_token_locomo     # ~75 min on 2 cores; rerunning resumes

Stages (outputs under ``outputs/first_token_locomo/`` and ``data/rl/``):

1. the generate recipe's RL data (``configs/data/locomo_smollm2_cpu.yaml``) and the head's
   (``configs/data/locomo_smollm2_first_token.yaml``: the same prompt followed by
   ``<ranking>``); every test question must show the same candidates, in the same order, with
   the same gold, in both (checked; a mismatch stops the run), so that the head's rankings are
   scored on exactly the generate table's questions and candidates;
2. ``memsifter train configs/train/smollm2_cpu_first_token.yaml``: from SmolLM2-135M-Instruct
   (LoRA on the top 10 layers), the listwise cross-entropy cold start on the train pool's gold,
   then Plackett–Luce GRPO on R_ret over the whole pool, checkpoints (and the cold start
   itself) chosen on the validation conversation;
3. the head's greedy rankings of the test split with the start (the instruct model), the cold
   start and the trained model, written as saved runs;
4. ``memsifter eval proxy`` on the generate data's test split with the committed generate runs
   (``eval/results/proxy_locomo_test/runs/``) and the two head runs, BM25 fusion of the trained
   head, and paired bootstrap CIs. Writes
   ``eval/results/proxy_locomo_test/proxy_locomo_test.{md,json}``.

Test conversations never choose anything: checkpoints are chosen on conversation 7.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer

from eval.common import rl_data, split_rows

ROOT = Path(__file__).resolve().parents[2]

GENERATE_DATA = ("configs/data/locomo_smollm2_cpu.yaml", "data/rl/locomo_smollm2")
HEAD_DATA = ("configs/data/locomo_smollm2_first_token.yaml", "data/rl/locomo_smollm2_first_token")
RECIPE = "configs/train/smollm2_cpu_first_token.yaml"
OUT = ROOT / "outputs/first_token_locomo"
RUNS = ROOT / "eval/results/proxy_locomo_test/runs"
SAME = ("qid", "candidates", "gold_positions", "coarse_order", "n_candidates")


def check_same_candidates(generate: list[dict[str, Any]], head: list[dict[str, Any]]) -> None:
    by_qid = {r["qid"]: r for r in generate}
    bad = [
        r["qid"]
        for r in head
        if r["qid"] not in by_qid or any(r[k] != by_qid[r["qid"]][k] for k in SAME)
    ]
    if bad or len(head) != len(generate):
        raise SystemExit(
            f"the head's test rows differ from the generate recipe's on {len(bad)} questions "
            f"(first: {bad[:3]}; {len(head)} vs {len(generate)} rows): their rankings would not "
            "be scored on the same candidates"
        )


def write_run(model: Path | str, rows: list[dict[str, Any]], path: Path) -> Path:
    from memsifter.ranker.parse import parse_ranking
    from memsifter.training.validation import ValidationEngine, generate_completions

    if path.is_file():
        return path
    t0 = time.perf_counter()
    engine = ValidationEngine(batch_size=4, threads=2, ranking_head="first_token")
    texts = generate_completions(model, rows, max_new_tokens=1, engine=engine)
    ms = (time.perf_counter() - t0) * 1000 / max(len(rows), 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row, text in zip(rows, texts, strict=True):
            parsed = parse_ranking(text, int(row["n_candidates"]))
            f.write(
                json.dumps(
                    {"qid": row["qid"], "ranking": list(parsed.ids), "parsed_ok": parsed.ok,
                     "completion": text, "latency_ms": round(ms, 1)}
                ) + "\n"
            )  # fmt: skip
    return path


def main() -> None:
    """The CPU recipe on the first-token head on LoCoMo, beside the generate recipe's runs."""
    from memsifter.models import resolve_model
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import merged_for_eval, run_training

    generate = rl_data(*GENERATE_DATA)
    head = rl_data(*HEAD_DATA)
    check_same_candidates(split_rows(generate, "test"), split_rows(head, "test"))
    cfg = load_train_config(ROOT / RECIPE, [f"output_dir={OUT / 'train'}", f"data={head}"])
    trained = Path(run_training(cfg)["model"])
    # The questions `memsifter eval proxy` scores: those whose prompt shows gold.
    rows = [r for r in split_rows(head, "test") if r["gold_positions"]]
    start = resolve_model(cfg.model.name).path
    runs = {
        "first_token_start": write_run(start, rows, OUT / "runs" / "first_token_start.jsonl"),
        "first_token_cold": write_run(
            OUT / "train" / "sft" / "final", rows, OUT / "runs" / "first_token_cold.jsonl"
        ),
        "first_token_trained": write_run(
            merged_for_eval(trained, OUT / "merged"),
            rows,
            OUT / "runs" / "first_token_trained.jsonl",
        ),
    }
    for name, path in runs.items():
        (RUNS / f"{name}.jsonl").write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    runs_dir = RUNS.relative_to(ROOT)  # the report names the committed run files, not this disk
    cmd = [
        sys.executable, "-m", "memsifter.cli", "eval", "proxy", "--data", GENERATE_DATA[1],
        "--split", "test",
        "--run", f"untrained={runs_dir / 'untrained.jsonl'}",
        "--run", f"sft={runs_dir / 'sft.jsonl'}",
        "--run", f"trained={runs_dir / 'trained.jsonl'}",
        "--run", f"first_token_start={runs_dir / 'first_token_start.jsonl'}",
        "--run", f"first_token_cold={runs_dir / 'first_token_cold.jsonl'}",
        "--run", f"first_token_trained={runs_dir / 'first_token_trained.jsonl'}",
        "--fuse", "trained", "--fuse", "first_token_trained",
        "--pair", "trained-start", "--pair", "trained-bm25", "--pair", "trained-sft",
        "--pair", "sft-untrained", "--pair", "sft-bm25", "--pair", "trained+bm25-bm25",
        "--pair", "first_token_trained-first_token_start",
        "--pair", "first_token_trained-bm25",
        "--pair", "first_token_cold-first_token_start", "--pair", "first_token_cold-bm25",
        "--pair", "first_token_trained-first_token_cold",
        "--pair", "first_token_trained+bm25-bm25",
        "--seed", "0", "--out", str(OUT.relative_to(ROOT) / "eval"),
        "--out-md", "eval/results/proxy_locomo_test/proxy_locomo_test.md",
        "--out-json", "eval/results/proxy_locomo_test/proxy_locomo_test.json",
        "--model-name", "memsifter-smollm2-135m-locomo", "--start", "sft",
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)


if __name__ == "__main__":
    typer.run(main)
