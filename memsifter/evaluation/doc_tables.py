"""Result tables in the README and docs/, rendered from the committed JSON they quote, so a number
is typed once (by the command that measured it) and never copied by hand.

A table in a markdown file sits between two markers naming it::

    <!-- table: proxy_locomo_test -->
    | ranker | NDCG@1 | ... |
    <!-- /table: proxy_locomo_test -->

:data:`TABLES` says which JSON each one is rendered from, and how. ``python -m
memsifter.evaluation.doc_tables`` rewrites every marked table under the repository root (the
working directory); ``--check`` changes nothing and exits 1, naming each file and table that
differs from its JSON (tests/evaluation/test_doc_tables.py runs it, so drift fails CI).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsifter.errors import DataError

MARKER = re.compile(
    r"<!-- table: (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /table: (?P=name) -->\n", re.DOTALL
)
DOC_GLOBS = ("README.md", "docs/*.md")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


# The LoCoMo test comparison the README shows: the generate-mode recipe's rows, by their names in
# eval/results/proxy_locomo_test/proxy_locomo_test.json (the first-token rows and the slices are
# in that report).
LOCOMO_ROWS = {
    "bm25": "BM25 order",
    "untrained": "untrained SmolLM2",
    "sft": "SFT (GRPO's start)",
    "trained": "trained (shipped adapter)",
    "trained+bm25": "trained ⊕ BM25 (RRF)",
}
LOCOMO_METRICS = ("ndcg@1", "ndcg@5", "ndcg@10", "recall@1", "recall@5", "mrr")
LOCOMO_PAIRS = ("trained-start", "trained-bm25", "sft-untrained", "sft-bm25", "trained+bm25-bm25")


def proxy_locomo_test(data: dict[str, Any]) -> str:
    head = "| ranker | NDCG@1 | NDCG@5 | NDCG@10 | Recall@1 | Recall@5 | MRR | parse rate |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name, label in LOCOMO_ROWS.items():
        row = data["rankers"][name]
        cells = [label, *(_fmt(row[m]) for m in LOCOMO_METRICS), _fmt(row["parse_rate"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def proxy_locomo_pairs(data: dict[str, Any], pairs: Iterable[str] = LOCOMO_PAIRS) -> str:
    from memsifter.evaluation.proxy_eval import resampled_units

    lines = [
        "| pair (NDCG@1) | mean difference | 95% CI | resampled units |",
        "|---|---|---|---|",
    ]
    for pair in pairs:
        mean = data["paired_mean_diff"][pair]["ndcg@1"]
        lo, hi = data["paired_ci95"][pair]["ndcg@1"]
        units = data.get("paired_units", {}).get(pair)
        unit_text = "–" if units is None else resampled_units(units, data["n_scored"])
        lines.append(f"| {pair} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {unit_text} |")
    return "\n".join(lines) + "\n"


# The head with no position to copy (candidates by date, BM25 as a prior on each score):
# eval/results/proxy_locomo_residual/proxy_locomo_residual.json.
RESIDUAL_ROWS = {
    "bm25": "BM25 order",
    "start": "start (instruct model, fused)",
    "cold": "cold start (listwise SFT on gold)",
    "grpo": "PL-GRPO + KL, averaged",
}
RESIDUAL_PAIRS = ("cold-bm25", "grpo-bm25", "start-bm25", "cold-start", "grpo-cold")


def proxy_locomo_residual(data: dict[str, Any], rows: dict[str, str] = RESIDUAL_ROWS) -> str:
    lines = [
        "| ranker | shown order | NDCG@1 | NDCG@5 | MRR | top-1 agreement | constant label |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in rows.items():
        row = data["rankers"][name]
        inv = row.get("invariance") or {}
        cells = [
            label,
            row.get("order", "–"),
            *(_fmt(row[m]) for m in ("ndcg@1", "ndcg@5", "mrr")),
            _fmt(inv.get("top1_agreement")),
            _fmt(inv.get("constant_share")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def proxy_locomo_residual_pairs(data: dict[str, Any]) -> str:
    return proxy_locomo_pairs(data, RESIDUAL_PAIRS)


# The same recipe started from a head warmed on the reading gym in LoCoMo's format (issue 40,
# item 4): eval/results/proxy_locomo_residual_gym_warm/proxy_locomo_residual_gym_warm.json.
WARM_ROWS = {
    **{k: v for k, v in RESIDUAL_ROWS.items() if k in ("bm25", "start")},
    "warm": "gym-warmed (listwise SFT on the gym, no LoCoMo step)",
    "cold": "cold start on LoCoMo, from the warmed head",
    "grpo": "PL-GRPO + KL, averaged",
}
WARM_PAIRS = ("warm-bm25", "warm-start", "cold-bm25", "grpo-bm25", "cold-start", "cold-warm")


def proxy_locomo_gym_warm(data: dict[str, Any]) -> str:
    return proxy_locomo_residual(data, WARM_ROWS)


def proxy_locomo_gym_warm_pairs(data: dict[str, Any]) -> str:
    return proxy_locomo_pairs(data, WARM_PAIRS)


def head_latency(data: dict[str, Any]) -> str:
    """The README's curl with the head and the LoCoMo prompts, per ``proxy.dtype``:
    eval/results/bench_head_latency/bench_head_latency.json."""
    lines = [
        "| proxy.dtype | curl p50 s | forward pass share | 1K-token LoCoMo prompt p50 s | "
        "same top-1 as float32 | Kendall tau with float32 |",
        "|---|---|---|---|---|---|",
    ]
    heads = data["prompts"]["first_token"]
    for dtype, curl in data["curl"].items():
        head = heads[dtype]
        agree = head.get("agreement_with_float32")
        share = data.get("profile", {}).get(dtype, {}).get("phases", {}).get("forward pass")
        cells = [
            dtype,
            _fmt(curl["repeat_median_s"]),
            "–" if share is None else f"{100 * share['share']:.0f}%",
            _fmt(head["p50_s"]),
            "(reference)" if agree is None else _fmt(agree["top1"]),
            "(reference)" if agree is None else _fmt(agree["kendall_tau_mean"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Table:
    source: str  # the committed JSON, relative to the repository root
    render: Callable[[dict[str, Any]], str]


LOCOMO_TEST_JSON = "eval/results/proxy_locomo_test/proxy_locomo_test.json"
RESIDUAL_JSON = "eval/results/proxy_locomo_residual/proxy_locomo_residual.json"
WARM_JSON = "eval/results/proxy_locomo_residual_gym_warm/proxy_locomo_residual_gym_warm.json"
TABLES: dict[str, Table] = {
    "proxy_locomo_test": Table(LOCOMO_TEST_JSON, proxy_locomo_test),
    "proxy_locomo_pairs": Table(LOCOMO_TEST_JSON, proxy_locomo_pairs),
    "proxy_locomo_residual": Table(RESIDUAL_JSON, proxy_locomo_residual),
    "proxy_locomo_residual_pairs": Table(RESIDUAL_JSON, proxy_locomo_residual_pairs),
    "proxy_locomo_gym_warm": Table(WARM_JSON, proxy_locomo_gym_warm),
    "proxy_locomo_gym_warm_pairs": Table(WARM_JSON, proxy_locomo_gym_warm_pairs),
    "head_latency": Table("eval/results/bench_head_latency/bench_head_latency.json", head_latency),
}


def _docs(root: Path) -> Iterable[Path]:
    for pattern in DOC_GLOBS:
        yield from sorted(root.glob(pattern))


def render_file(text: str, root: Path, file: str = "") -> str:
    """``text`` with every marked table rendered afresh from its JSON."""

    def table(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in TABLES:
            raise DataError(f"unknown table {name!r}; known: {', '.join(TABLES)}", file=file)
        spec = TABLES[name]
        path = root / spec.source
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"table {name!r}: cannot read {spec.source}: {e}", file=file) from e
        return f"<!-- table: {name} -->\n{spec.render(data)}<!-- /table: {name} -->\n"

    return MARKER.sub(table, text)


def _stale(root: Path) -> Iterable[tuple[Path, str, str]]:
    """Every doc whose marked tables render differently: its path, text and fresh text."""
    for path in _docs(root):
        text = path.read_text(encoding="utf-8")
        fresh = render_file(text, root, str(path))
        if fresh != text:
            yield path, text, fresh


def drift(root: Path) -> list[str]:
    """``file: table`` for every marked table that differs from what its JSON renders."""
    out = []
    for path, text, fresh in _stale(root):
        old = {m["name"]: m["body"] for m in MARKER.finditer(text)}
        new = {m["name"]: m["body"] for m in MARKER.finditer(fresh)}
        out += [f"{path.relative_to(root)}: {n}" for n in old if old[n] != new.get(n)]
    return out


def write(root: Path) -> list[str]:
    """Rewrite every marked table; the files changed."""
    changed = []
    for path, _, fresh in list(_stale(root)):
        path.write_text(fresh, encoding="utf-8")
        changed.append(str(path.relative_to(root)))
    return changed


def main(argv: list[str]) -> int:
    root = Path.cwd()
    if argv == ["--check"]:
        stale = drift(root)
        for line in stale:
            print(f"stale table: {line} (run python -m memsifter.evaluation.doc_tables)")
        return 1 if stale else 0
    if argv:
        print("usage: python -m memsifter.evaluation.doc_tables [--check]", file=sys.stderr)
        return 2
    for path in write(root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


__all__ = ["TABLES", "Table", "drift", "render_file", "write"]
