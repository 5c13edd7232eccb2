"""The coarse filter's variants for a long-lived process, and the hooks they are built on.

* ``HaystackCache``: the BM25 filter's cache of built indexes, bounded in entries and, as the
  ``ByteBoundedBM25`` the service uses for request-borne haystacks, in estimated bytes.
* ``LockedCoarse``: any filter shared between threads.
* Encapsulation: the variants use only public hooks; no code in the package reaches into the
  private members of ``BM25Filter`` and its helpers. The checker is tested on snippets too, so it
  is known to fail when it should.
"""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from memsifter.coarse import (
    BM25Filter,
    ByteBoundedBM25,
    HaystackCache,
    IncrementalBM25,
    LockedCoarse,
    haystack_bytes,
)
from memsifter.coarse.base import CoarseFilter
from memsifter.data.types import Ranking, Session, Turn

PACKAGE = Path(__file__).resolve().parents[2] / "memsifter"


def _haystack(n: int, size: int) -> list[Session]:
    return [
        Session(id=f"h{n}-{i}", turns=(Turn("u", f"haystack {n} page {i} " + "word " * size),))
        for i in range(20)
    ]


def _key(sessions: Sequence[Session]) -> tuple[str, ...]:
    return tuple(s.fingerprint for s in sessions)


# ------------------------------------------------------------------------------------------
# the cache and its bounds


def test_the_rank_cache_is_bounded_in_bytes() -> None:
    plain = BM25Filter()
    bounded = ByteBoundedBM25(BM25Filter(), max_bytes=200_000)
    sizes = []
    for n in range(12):
        sessions = _haystack(n, 400)  # ~40 KB of text and index each
        got = bounded.score("haystack page word", sessions)
        assert got == plain.score("haystack page word", sessions)  # the same ranking, scores
        sizes.append(bounded.cache.sizes[_key(sessions)])
        assert bounded.held_bytes <= max(200_000, sizes[-1])
        assert bounded.held_bytes == sum(bounded.cache.sizes.values())
    assert 10_000 < sizes[0] < 200_000  # the estimate is in the right range
    assert len(bounded.cache) < 12 and bounded.cache.memo_count <= len(bounded.cache)


def test_a_resent_haystack_keeps_one_copy() -> None:
    bounded = ByteBoundedBM25(BM25Filter(), max_bytes=10_000_000)
    for _ in range(20):  # each request parses its body into new Session objects
        bounded.score("word", _haystack(0, 50))
    assert len(bounded.cache) == 1 and bounded.cache.memo_count == 1


def test_the_index_in_use_stays_even_over_the_bound() -> None:
    bounded = ByteBoundedBM25(BM25Filter(), max_bytes=1)
    for n in range(3):
        sessions = _haystack(n, 10)
        bounded.index(sessions)
        assert bounded.cache.keys() == (_key(sessions),)
        assert bounded.held_bytes == bounded.cache.sizes[_key(sessions)] > 1


def test_an_unbounded_cache_memoises_each_object_set_and_sizes_nothing() -> None:
    # Without a byte bound, memos are their own LRU: two object sets of one content each keep
    # theirs (no re-hashing when a caller alternates), and no index is sized. With one, the
    # haystack keeps one memo.
    # (Back to back, equal content already hits the last memo: Session equality is by value.)
    first, other, second = _haystack(0, 5), _haystack(1, 5), _haystack(0, 5)
    for cache in (BM25Filter().cache, ByteBoundedBM25(BM25Filter(), 10**9).cache):
        bm25 = BM25Filter(cache=cache)
        for sessions in (first, other, second):
            bm25.score("word", sessions)
        assert len(cache) == 2
        if cache.max_bytes is None:
            assert cache.memo_count == 3 and cache.held_bytes == 0 and not cache.sizes
        else:
            assert cache.memo_count == 2 and cache.held_bytes == sum(cache.sizes.values()) > 0


def test_entry_bound_evicts_least_recently_used() -> None:
    bm25 = BM25Filter(cache_size=2)
    hays = [_haystack(n, 5) for n in range(3)]
    bm25.index(hays[0])
    bm25.index(hays[1])
    bm25.score("word", hays[0])  # a hit: hays[0] is now the most recently used
    bm25.index(hays[2])
    assert bm25.cache.keys() == (_key(hays[0]), _key(hays[2]))
    assert _key(hays[1]) not in bm25.cache


def test_cache_size_is_the_caches_bound() -> None:
    bm25 = BM25Filter(cache_size=3)
    assert bm25.cache.max_entries == bm25.cache_size == 3
    bm25.cache_size = 300  # what the service does to outlive its per-user LRU
    assert bm25.cache.max_entries == 300
    bounded = ByteBoundedBM25(bm25, max_bytes=1000)
    assert bounded.cache_size == 300 and bounded.max_bytes == 1000
    assert (bounded.k1, bounded.b, bounded.method) == (bm25.k1, bm25.b, bm25.method)
    with pytest.raises(ValueError, match="not both"):
        BM25Filter(cache_size=3, cache=HaystackCache())


def test_a_cache_passed_in_is_the_one_used() -> None:
    sized: list[int] = []

    def sizeof(sessions: Sequence[Session], index: object) -> int:
        sized.append(len(sessions))
        return haystack_bytes(sessions, index)

    cache: HaystackCache = HaystackCache(4, max_bytes=10**9, sizeof=sizeof)
    bm25 = BM25Filter(cache=cache)
    sessions = _haystack(0, 5)
    assert bm25.score("page", sessions) == BM25Filter().score("page", sessions)
    assert bm25.cache is cache and sized == [20] and cache.held_bytes > 0


def test_evict_and_clear() -> None:
    bm25 = ByteBoundedBM25(BM25Filter(), max_bytes=10**9)
    a, b = _haystack(0, 5), _haystack(1, 5)
    bm25.index(a)
    bm25.index(b)
    assert bm25.cache.evict(_key(a)) and not bm25.cache.evict(_key(a))
    assert bm25.cache.keys() == (_key(b),) and bm25.cache.memo_count == 1
    assert bm25.held_bytes == bm25.cache.sizes[_key(b)]
    assert bm25.score("page", a) == BM25Filter().score("page", a)  # rebuilt on demand
    bm25.cache.clear()
    assert len(bm25.cache) == 0 and bm25.cache.memo_count == 0 and bm25.held_bytes == 0


def test_incremental_bm25_keeps_its_old_import_path() -> None:
    from memsifter.coarse import bm25, incremental

    assert bm25.IncrementalBM25 is incremental.IncrementalBM25 is IncrementalBM25


# ------------------------------------------------------------------------------------------
# LockedCoarse


class OneAtATime(CoarseFilter):
    """Fails if two calls overlap: what an unsynchronised cache would suffer."""

    name = "one-at-a-time"

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.calls = 0

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        self.inside += 1
        self.overlaps += self.inside > 1
        time.sleep(0.001)  # widen the window a race would need
        self.calls += 1
        self.inside -= 1
        return Ranking(ids=tuple(s.id for s in sessions), source=self.name)


def test_locked_coarse_serialises_and_delegates() -> None:
    inner = OneAtATime()
    locked = LockedCoarse(inner)
    sessions = _haystack(0, 1)

    def worker() -> None:
        for _ in range(10):
            locked.score("q", sessions)
            locked.select("q", sessions, budget_tokens=1)  # select calls inner.score

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inner.calls == 80 and inner.overlaps == 0
    assert locked.name == inner.name and locked.inner is inner


def test_locked_bm25_ranks_as_the_filter_does() -> None:
    sessions = _haystack(0, 5)
    locked = LockedCoarse(ByteBoundedBM25(BM25Filter(), max_bytes=10**6))
    locked.index(sessions)
    assert locked.score("page 3", sessions) == BM25Filter().score("page 3", sessions)


# ------------------------------------------------------------------------------------------
# encapsulation: the variants use public hooks only

# Classes whose private members nothing outside their own body may touch, and their modules.
OWNERS: dict[str, str] = {
    "BM25Filter": "memsifter.coarse.bm25",
    "HaystackCache": "memsifter.coarse.cache",
    "IncrementalBM25": "memsifter.coarse.incremental",
    "LockedCoarse": "memsifter.coarse.locked",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _base_names(cls: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in cls.bases}


def private_members(source: str, owner: str) -> frozenset[str]:
    """The ``_name``s (dunders aside) class ``owner`` defines in ``source``: methods, class
    attributes and ``self._name`` assignments."""
    names: set[str] = set()
    for cls in ast.walk(ast.parse(source)):
        if not (isinstance(cls, ast.ClassDef) and cls.name == owner):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(n for n in names if _is_private(n))


def _receiver(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        return "super()"
    return ""


class _PrivateUses(ast.NodeVisitor):
    def __init__(
        self,
        privates: Mapping[str, frozenset[str]],
        modules: Mapping[str, str],
        descendants: Mapping[str, frozenset[str]],
    ) -> None:
        self.privates, self.modules, self.descendants = privates, modules, descendants
        self.all_private = frozenset().union(*privates.values())
        self.classes: list[str] = []
        self.found: list[tuple[int, str]] = []

    def _allowed(self, name: str, receiver: str) -> bool:
        owners = [o for o, names in self.privates.items() if name in names]
        inside = self.classes[-1] if self.classes else None
        if inside in owners:
            return True  # a class may use its own private members, on any instance
        if receiver in ("self", "cls"):
            # Its own attribute of the same name, unless the class inherits it from an owner.
            return not any(inside in self.descendants.get(o, ()) for o in owners)
        return False  # super()._x, or another object's private member

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # Overriding a private method is relying on when the owner calls it: a hook in disguise.
        inside = self.classes[-1] if self.classes else None
        for owner, names in self.privates.items():
            if node.name in names and inside in self.descendants.get(owner, ()):
                self.found.append((node.lineno, f"def {node.name} (overrides {owner}.{node.name})"))
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if name in self.all_private and not self._allowed(name, _receiver(node.value)):
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(f, "_indexes") and friends are the same reach-in, spelled as a string.
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                name = node.args[1].value
                receiver = _receiver(node.args[0])
                if name in self.all_private and not self._allowed(name, receiver):
                    self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in self.modules.values():
            for alias in node.names:
                if _is_private(alias.name):
                    self.found.append((node.lineno, f"from {node.module} import {alias.name}"))


def _descendants(classes: Mapping[str, set[str]], owners: Sequence[str]) -> dict[str, frozenset]:
    """Owner -> every class (by name) that inherits from it, directly or not."""
    out: dict[str, frozenset] = {}
    for owner in owners:
        found: set[str] = set()
        frontier = {owner}
        while frontier:
            frontier = {c for c, bases in classes.items() if bases & frontier} - found
            found |= frontier
        out[owner] = frozenset(found)
    return out


def private_uses(
    sources: Mapping[str, str], privates: Mapping[str, frozenset[str]], modules: Mapping[str, str]
) -> list[str]:
    """``file:line: code`` for every reach into an owner's private members in ``sources``
    (file name -> source): an attribute or ``getattr`` name outside the owner's own body (a
    subclass's ``self._x`` and ``super()._x`` included), or a private name imported from an
    owner's module."""
    trees = {name: ast.parse(src, name) for name, src in sources.items()}
    classes: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(_base_names(node))
    descendants = _descendants(classes, list(privates))
    found = []
    for name, tree in trees.items():
        visitor = _PrivateUses(privates, modules, descendants)
        visitor.visit(tree)
        found += [f"{name}:{line}: {code}" for line, code in visitor.found]
    return found


def _module_path(module: str) -> Path:
    return PACKAGE.parent / (module.replace(".", "/") + ".py")


def _package_sources() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE.parent)), path.read_text(encoding="utf-8")


def test_no_code_reaches_into_the_coarse_filters_private_members() -> None:
    privates = {
        owner: private_members(_module_path(module).read_text(encoding="utf-8"), owner)
        for owner, module in OWNERS.items()
    }
    # Not vacuous: each owner has private state the rule protects.
    assert {"_cached_index"} <= privates["BM25Filter"]
    assert {"_indexes", "_memos", "_last", "_sizes"} <= privates["HaystackCache"]
    assert {"_postings", "_slot"} <= privates["IncrementalBM25"]
    assert {"_lock"} <= privates["LockedCoarse"]
    found = private_uses(dict(_package_sources()), privates, OWNERS)
    assert not found, "use a public hook instead:\n" + "\n".join(found)


# The shape of the old serving/ranking.py, which subclassed BM25Filter through its privates.
OLD_STYLE = """
from memsifter.coarse.bm25 import BM25Filter, _Seen

class ByteBounded(BM25Filter):
    def _resolve(self, sessions) -> _Seen:
        seen = super()._resolve(sessions)
        for ident, other in list(self._seen.items()):
            pass
        return seen

class Deeper(ByteBounded):
    def size(self) -> int:
        return len(self._indexes)

def peek(f) -> object:
    return f._last, getattr(f, "_seen"), f.public
"""

CLEAN = """
from memsifter.coarse.bm25 import BM25Filter

class BM25Filter:  # the owner itself: its own privates on any instance
    def _resolve(self, other) -> None:
        self._seen = other._seen

class ServiceRanker:  # an unrelated class with a private of the same name
    def __init__(self) -> None:
        self._indexes = {}
        setattr(self, "_last", None)

def use(f: BM25Filter) -> object:
    return f.cache, f.score
"""

TOY = {"BM25Filter": frozenset({"_resolve", "_seen", "_indexes", "_last"})}
TOY_MODULES = {"BM25Filter": "memsifter.coarse.bm25"}


def test_the_private_use_check_catches_reach_ins() -> None:
    found = private_uses({"old.py": OLD_STYLE}, TOY, TOY_MODULES)
    assert sorted(found) == sorted(
        [
            "old.py:2: from memsifter.coarse.bm25 import _Seen",
            "old.py:5: def _resolve (overrides BM25Filter._resolve)",
            "old.py:6: super()._resolve",
            "old.py:7: self._seen",
            "old.py:13: self._indexes",
            "old.py:16: f._last",
            "old.py:16: getattr(f, '_seen')",
        ]
    )


def test_the_private_use_check_passes_clean_code() -> None:
    assert private_members(CLEAN, "BM25Filter") == {"_resolve", "_seen"}
    assert private_uses({"clean.py": CLEAN}, TOY, TOY_MODULES) == []
