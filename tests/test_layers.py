"""The package's layers are a contract: a module imports only from its own unit or from floors
below it, and units that share a floor do not import each other (``qa`` never imports ``ranker``).

Read from the source with ``ast``, so every import counts: top-level, inside a function, and under
``TYPE_CHECKING``. Floors, top first; a unit is a subpackage or a top-level module of
``memsifter``. A new unit must be placed here before it can be imported by anything.
"""

from __future__ import annotations

import ast
from collections.abc import Container
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "memsifter"

FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(units)
    for units in (
        # test doubles and oracles: may use any floor, and no module of the library imports them
        {"testing"},
        {"cli"},
        {"config_cli"},  # the command line built from config dataclasses: only the CLI uses it
        {"integrations"},  # LangChain / LlamaIndex adapters over the service's client
        {"serving", "evaluation"},  # the service and the benchmarks
        {"training"},
        {"rewards"},
        {"qa", "ranker"},  # the answerer and judge never depend on the proxy's prompt or parser
        {"coarse", "llm"},  # lexical/dense filters; LLM backends
        {"data"},
        # the basics every floor may use
        {"config", "ir_metrics", "machine", "models", "progress", "provenance", "text", "_compat"},
        # the error base; the files shipped as package data; the cache scope every cache reads
        {"errors", "resources", "scopes"},
    )
)
FLOOR = {unit: i for i, units in enumerate(FLOORS) for unit in units}

# Known upward imports, each with its reason. Keep this list short; an entry is a debt.
IGNORED: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every ``memsifter.*`` module ``path`` imports, with its line."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("memsifter")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "memsifter":  # ``from memsifter import llm``: each name is a module
                out += [(f"memsifter.{a.name}", node.lineno) for a in node.names]
            elif base.startswith("memsifter."):
                out.append((base, node.lineno))
    return out


def _module_imports(path: Path, modules: Container[str]) -> set[str]:
    """The library modules ``path`` imports: ``from a.b import c`` is ``a.b.c`` when that is
    a module, else ``a.b`` (the package's ``__init__``)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            }
    return {m for m in out if m in modules and m != module}


def _circles() -> list[list[str]]:
    """Groups of library modules that import each other, directly or round a loop (Tarjan's
    strongly connected components over every import, those inside functions included)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: sorted(_module_imports(p, paths)) for m, p in paths.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(graph[root]))]
        order[root] = low[root] = len(order)
        stack.append(root)
        while work:
            node, rest = work[-1]
            child = next(rest, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        circles.append(sorted(group))
            elif child not in order:
                order[child] = low[child] = len(order)
                stack.append(child)
                work.append((child, iter(graph[child])))
            elif child in stack:
                low[node] = min(low[node], order[child])
    return circles


def _edges() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, where) for every import between two units."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _unit(_module_name(path))
        for target, line in _imports(path):
            dst = _unit(target)
            if dst != src:
                edges.append((src, dst, f"{path.relative_to(PACKAGE.parent)}:{line} -> {target}"))
    return edges


def test_every_unit_has_a_floor() -> None:
    units = {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    missing = sorted(units - set(FLOOR))
    assert not missing, f"place these in FLOORS (tests/test_layers.py): {missing}"


def test_no_upward_or_sideways_imports() -> None:
    bad = []
    for src, dst, where in _edges():
        if src == "__init__" or (src, dst) in IGNORED:
            continue  # the package root re-exports the data types
        if FLOOR[dst] <= FLOOR[src]:
            kind = "sideways" if FLOOR[dst] == FLOOR[src] else "upward"
            bad.append(f"{kind}: {where}")
    assert not bad, "layer contract broken:\n" + "\n".join(bad)


@pytest.mark.parametrize("low", ["data", "coarse", "ranker", "llm"])
def test_lower_floors_import_nothing_above(low: str) -> None:
    above = {u for u, f in FLOOR.items() if f <= FLOOR[low] and u != low}
    bad = [where for src, dst, where in _edges() if src == low and dst in above]
    assert not bad, f"{low}/ imports from a higher or sibling floor:\n" + "\n".join(bad)


def test_qa_does_not_import_ranker() -> None:
    bad = [where for src, dst, where in _edges() if src == "qa" and dst == "ranker"]
    assert not bad, "\n".join(bad)


def test_ignored_imports_still_exist() -> None:
    """An ignore entry whose import is gone is removed, so the list only shrinks."""
    present = {(src, dst) for src, dst, _ in _edges()}
    stale = sorted(set(IGNORED) - present)
    assert not stale, f"remove from IGNORED: {stale}"


def test_no_import_circles() -> None:
    """No module imports itself round a loop, not even from inside a function (how
    ``serving.app`` and ``serving.mcp`` once hid theirs): what both sides of a loop need lives
    in a module below them."""
    assert not _circles(), "import circles:\n" + "\n".join(" -> ".join(c) for c in _circles())
