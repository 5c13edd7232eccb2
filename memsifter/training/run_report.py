"""What a training run leaves for a person to read: ``report.md`` (validation of every checkpoint
per epoch, what was averaged and carried forward, the trainer's per-epoch means) and
``curves.png`` (training curves and validation points over the run's steps).

Written by :func:`memsifter.training.loop.run_training` at the end of a run, from the files the
run already wrote (``summary``, each epoch's ``trainer_state.json`` and ``validation.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, summary: dict[str, Any]) -> Path:
    """Markdown: validation of every checkpoint per epoch, what was averaged, training stats."""
    lines = [
        "# Training run",
        "",
        f"Output: `{out}`; final model: `{summary['model']}`; wall time "
        f"{summary['wall_s'] / 60:.1f} min.",
        "",
        "| epoch | model | NDCG@1 | NDCG@5 | reward | parse rate | questions | averaged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kept = []
    for epoch, entry in enumerate(summary["epochs"]):
        top = set(entry.get("top", []))
        for name, r in entry.get("validation", {}).items():
            lines.append(
                f"| {epoch} | {name} | {r['ndcg_1']:.3f} | {r['ndcg_5']:.3f} | {r['reward']:.4f} "
                f"| {r['parse_rate']:.2f} | {r['questions']} | {'yes' if name in top else ''} |"
            )
        if entry.get("next"):
            which = "the average" if entry["next"] == entry.get("averaged") else "its start model"
            kept.append(f"- epoch {epoch} carried forward {which}: `{entry['next']}`")
    if kept:
        lines += ["", *kept]
    lines += ["", "Per epoch (from the trainer's log history; means over logged steps):", ""]
    keys = (
        "reward",
        "reward/r_ans",
        "reward/r_ret",
        "reward/parse_rate",
        "reward/call_ratio",
        "dynamic_sampling/effective_groups",
        "dynamic_sampling/extra_rounds",
        "step_time",
    )
    lines += ["| epoch | steps | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for epoch, entry in enumerate(summary["epochs"]):
        state_path = out / f"epoch-{epoch}" / "trainer_state.json"
        if not state_path.exists():
            continue
        history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
        cells = []
        for k in keys:
            # TRL writes None for a metric with no valid value in a logging window.
            vals = [float(h[k]) for h in history if h.get(k) is not None]
            cells.append(f"{sum(vals) / len(vals):.3f}" if vals else "")
        lines.append(f"| {epoch} | {entry.get('steps', '')} | " + " | ".join(cells) + " |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


_CURVES = (
    ("reward", "reward (mean)"),
    ("rewards/memsifter_reward/mean", "outcome reward R"),
    ("reward/r_ans", "R_ans"),
    ("reward/r_ret", "R_ret"),
    ("reward/beta", "beta (warm-up)"),
    ("reward/parse_rate", "parse rate"),
    ("reward/call_ratio", "working-LLM calls / naive"),
    ("dynamic_sampling/effective_groups", "effective groups"),
    ("loss", "loss"),
    ("completions/mean_length", "completion length"),
)


def plot_curves(out: Path, epochs: int) -> Path | None:
    """Training curves (per epoch, concatenated by step) and validation points to PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {k: [] for k, _ in _CURVES}
    val: dict[str, list[tuple[int, float]]] = {"ndcg_5": [], "reward": []}
    offset = 0
    for epoch in range(epochs):
        edir = out / f"epoch-{epoch}"
        state_path = edir / "trainer_state.json"
        if not state_path.exists():
            continue
        history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
        last = 0
        for row in history:
            step = int(row.get("step", 0))
            last = max(last, step)
            for k, _ in _CURVES:
                if row.get(k) is not None:  # None: no valid value in that logging window
                    series[k].append((offset + step, float(row[k])))
        vpath = edir / "validation.json"
        if vpath.exists():
            for name, r in json.loads(vpath.read_text(encoding="utf-8")).items():
                if not name.startswith("checkpoint-") and name != "start":
                    continue  # the average is not a point on the step axis
                step = 0 if name == "start" else int(name.split("-")[1])
                for k in val:
                    val[k].append((offset + step, float(r[k])))
        offset += last
    shown = [(k, label) for k, label in _CURVES if series[k]]
    if not shown and not any(val.values()):
        return None
    n = len(shown) + 1
    cols = 3
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax, (k, label) in zip(flat, shown, strict=False):
        xs, ys = zip(*series[k], strict=True)
        ax.plot(xs, ys, marker=".", linewidth=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    ax = flat[len(shown)]
    for k, style in (("ndcg_5", "o-"), ("reward", "s--")):
        if val[k]:
            xs, ys = zip(*sorted(val[k]), strict=True)
            ax.plot(xs, ys, style, label=k)
    ax.set_title("held-out validation per checkpoint", fontsize=9)
    ax.legend(fontsize=7)
    for extra in flat[len(shown) + 1 :]:
        extra.axis("off")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
