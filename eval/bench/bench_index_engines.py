"""Which engine should hold a recall-service user's coarse index? One user's sessions (the
recall benchmarks' generator, ``eval.common.make_session``), indexed by each candidate, then opened
by a fresh process that answers questions and takes new sessions:

* ``rebuild``: today's ``IncrementalBM25``, rebuilt from the rows on first use (the cost a
  restarted replica pays now);
* ``postings``: the same BM25 formula over postings rows in SQLite (term, page, tf; page
  lengths and the user's totals beside them), read per query term at query time: nothing to
  load, the exact ranking;
* ``fts5``: SQLite FTS5's own ``bm25()`` (k1 1.2, its own IDF) over the analyzer's terms;
* ``tantivy``: a tantivy index on disk (Lucene's BM25 with k1 1.2, lossy length norms) over
  the analyzer's terms, opened by memory-mapping.

Per engine and history size: build seconds, disk, the fresh process's open + first query
(the OS cache as the build left it), warm p50/p95 over the questions, RSS after them, one
ingest (a session added and committed) p50, and the top-10 agreement with today's ranking.

    python -m eval.bench.bench_index_engines --sessions 1000 --sessions 10000 --sessions 100000
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from eval.common import (
    REPO,
    RESULTS,
    command_line,
    git_head,
    machine,
    machine_line,
    make_question,
    make_session,
    session_date,
    summarize,
)

ENGINES = ("rebuild", "postings", "postings_pg", "fts5", "tantivy")
K1, B = 1.5, 0.75  # the service's BM25 (memsifter.coarse.bm25)
TOP = 10
INGESTS = 50


def session_text(s: dict[str, Any]) -> str:
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in s["turns"])


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [session_text(make_session(rng, f"s{i}", session_date(i))) for i in range(n)]


def analyzer() -> Any:
    from memsifter.text import get_analyzer

    return get_analyzer("english")


def doc_terms(text: str) -> tuple[Counter[str], float]:
    """A session's term counts and its BM25 length (an empty one counts 1, as in bm25s)."""
    counts = Counter(analyzer()(text))
    return counts, float(max(sum(counts.values()), 1))


# ---------------------------------------------------------------------------------- engines


class Rebuild:
    """Today: the rows are the only copy; a replica rebuilds the index from them."""

    def build(self, texts: list[str], where: Path) -> None:
        db = sqlite3.connect(where / "rows.db")
        db.execute("CREATE TABLE pages (pk INTEGER PRIMARY KEY, text TEXT)")
        db.executemany("INSERT INTO pages VALUES (?, ?)", enumerate(texts))
        db.commit()
        db.close()

    def open(self, where: Path) -> None:
        from memsifter.coarse import IncrementalBM25

        self.db = sqlite3.connect(where / "rows.db")
        self.bm25 = IncrementalBM25(K1, B)
        pks = []
        for pk, text in self.db.execute("SELECT pk, text FROM pages"):
            self.bm25.add(str(pk), text)
            pks.append(pk)
        self.ids = np.array(pks)  # slot order: nothing was removed

    def query(self, question: str) -> list[int]:
        scores = self.bm25.slot_scores(question)
        return top_ids(scores, self.ids)

    def add(self, pk: int, text: str) -> None:
        self.db.execute("INSERT INTO pages VALUES (?, ?)", (pk, text))
        self.db.commit()
        self.bm25.add(str(pk), text)
        self.ids = np.append(self.ids, pk)


def top_ids(scores: np.ndarray, ids: np.ndarray) -> list[int]:
    k = min(TOP, len(scores))
    part = np.argpartition(-scores, k - 1)[:k]
    # ties by id, as a stable sort over pages in order would break them
    best = sorted(part.tolist(), key=lambda i: (-scores[i], ids[i]))
    return [int(ids[i]) for i in best if scores[i] > 0]


class Postings:
    """BM25 from postings rows, the formula of ``IncrementalBM25`` evaluated per query."""

    def build(self, texts: list[str], where: Path) -> None:
        db = sqlite3.connect(where / "postings.db")
        db.executescript(
            "CREATE TABLE pages (pk INTEGER PRIMARY KEY, length REAL);"
            "CREATE TABLE postings (term TEXT, pk INTEGER, tf INTEGER, PRIMARY KEY (term, pk))"
            " WITHOUT ROWID;"
            "CREATE TABLE totals (n INTEGER, length REAL);"
            "INSERT INTO totals VALUES (0, 0);"
        )
        for pk, text in enumerate(texts):
            self._insert(db, pk, text)
        db.commit()
        db.close()

    def _insert(self, db: sqlite3.Connection, pk: int, text: str) -> None:
        counts, length = doc_terms(text)
        db.execute("INSERT INTO pages VALUES (?, ?)", (pk, length))
        db.executemany(
            "INSERT INTO postings VALUES (?, ?, ?)", ((t, pk, c) for t, c in counts.items())
        )
        db.execute("UPDATE totals SET n = n + 1, length = length + ?", (length,))

    def open(self, where: Path) -> None:
        self.db = sqlite3.connect(where / "postings.db")

    def query(self, question: str) -> list[int]:
        n, total = self.sql("SELECT n, length FROM totals", ())[0]
        avgdl = total / n
        pks_all, parts = [], []
        for term, times in Counter(analyzer()(question)).items():
            rows = self.sql(
                "SELECT p.pk, p.tf, g.length FROM postings p JOIN pages g ON g.pk = p.pk"
                " WHERE p.term = ?",
                (term,),
            )
            if not rows:
                continue
            a = np.array(rows, dtype=np.float64)
            df = len(a)
            idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
            tf, dl = a[:, 1], a[:, 2]
            pks_all.append(a[:, 0].astype(np.int64))
            parts.append(times * idf * tf / (tf + K1 * (1 - B + B * dl / avgdl)))
        if not parts:
            return []
        pks = np.concatenate(pks_all)
        uniq, inv = np.unique(pks, return_inverse=True)
        scores = np.zeros(len(uniq))
        np.add.at(scores, inv, np.concatenate(parts))
        return top_ids(scores, uniq)

    def sql(self, text: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self.db.execute(text, args).fetchall()

    def add(self, pk: int, text: str) -> None:
        self._insert(self.db, pk, text)
        self.db.commit()


class PostingsPG(Postings):
    """``postings`` on PostgreSQL: the same tables and query, in a throwaway schema."""

    dsn = os.environ.get("MEMSIFTER_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")

    def _connect(self, where: Path) -> Any:
        import psycopg

        db = psycopg.connect(self.dsn)
        db.execute(f"SET search_path TO {self._schema(where)}")
        return db

    @staticmethod
    def _schema(where: Path) -> str:
        return "bench_" + "".join(c if c.isalnum() else "_" for c in where.name)

    def build(self, texts: list[str], where: Path) -> None:
        import psycopg

        schema = self._schema(where)
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.execute(f"CREATE SCHEMA {schema}")
        db = self._connect(where)
        db.execute(
            "CREATE TABLE pages (pk BIGINT PRIMARY KEY, length DOUBLE PRECISION);"
            "CREATE TABLE postings (term TEXT, pk BIGINT, tf INTEGER, PRIMARY KEY (term, pk));"
            "CREATE TABLE totals (n BIGINT, length DOUBLE PRECISION);"
        )
        total = 0.0
        with db.cursor() as cur:
            with cur.copy("COPY pages (pk, length) FROM STDIN") as pages:
                with_post = []
                for pk, text in enumerate(texts):
                    counts, length = doc_terms(text)
                    total += length
                    pages.write_row((pk, length))
                    with_post.append((pk, counts))
            with cur.copy("COPY postings (term, pk, tf) FROM STDIN") as post:
                for pk, counts in with_post:
                    for t, c in counts.items():
                        post.write_row((t, pk, c))
            cur.execute("INSERT INTO totals VALUES (%s, %s)", (len(texts), total))
        db.commit()
        db.execute("ANALYZE")
        db.commit()
        db.close()

    def _insert(self, db: Any, pk: int, text: str) -> None:
        counts, length = doc_terms(text)
        with db.cursor() as cur:
            cur.execute("INSERT INTO pages VALUES (%s, %s)", (pk, length))
            cur.executemany(
                "INSERT INTO postings VALUES (%s, %s, %s)", [(t, pk, c) for t, c in counts.items()]
            )
            cur.execute("UPDATE totals SET n = n + 1, length = length + %s", (length,))

    def open(self, where: Path) -> None:
        self.db = self._connect(where)

    def sql(self, text: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self.db.execute(text.replace("?", "%s"), args).fetchall()

    def disk_mb(self, where: Path) -> float:
        db = self._connect(where)
        size = db.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (self._schema(where),),
        ).fetchone()[0]
        db.close()
        return float(size) / 1e6

    def drop(self, where: Path) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {self._schema(where)} CASCADE")


class FTS5:
    def build(self, texts: list[str], where: Path) -> None:
        db = sqlite3.connect(where / "fts.db")
        db.execute("CREATE VIRTUAL TABLE pages USING fts5(terms, tokenize='ascii')")
        db.executemany(
            "INSERT INTO pages (rowid, terms) VALUES (?, ?)",
            ((pk, " ".join(analyzer()(t))) for pk, t in enumerate(texts)),
        )
        db.commit()
        db.close()

    def open(self, where: Path) -> None:
        self.db = sqlite3.connect(where / "fts.db")

    def query(self, question: str) -> list[int]:
        terms = dict.fromkeys(analyzer()(question))
        if not terms:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = self.db.execute(
            "SELECT rowid FROM pages WHERE pages MATCH ? ORDER BY bm25(pages), rowid LIMIT ?",
            (match, TOP),
        ).fetchall()
        return [r[0] for r in rows]

    def add(self, pk: int, text: str) -> None:
        self.db.execute(
            "INSERT INTO pages (rowid, terms) VALUES (?, ?)", (pk, " ".join(analyzer()(text)))
        )
        self.db.commit()


class Tantivy:
    def _schema(self) -> Any:
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_integer_field("pk", stored=True, indexed=True, fast=True)
        sb.add_text_field("terms", tokenizer_name="whitespace", index_option="freq")
        return sb.build()

    def build(self, texts: list[str], where: Path) -> None:
        import tantivy

        (where / "tantivy").mkdir()
        index = tantivy.Index(self._schema(), path=str(where / "tantivy"))
        writer = index.writer(heap_size=64_000_000, num_threads=1)
        for pk, text in enumerate(texts):
            writer.add_document(tantivy.Document(pk=pk, terms=" ".join(analyzer()(text))))
        writer.commit()
        writer.wait_merging_threads()

    def open(self, where: Path) -> None:
        import tantivy

        self.index = tantivy.Index.open(str(where / "tantivy"))
        self.writer: Any = None

    def query(self, question: str) -> list[int]:
        import tantivy

        terms = dict.fromkeys(analyzer()(question))
        if not terms:
            return []
        schema = self.index.schema
        q = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "terms", t)) for t in terms]
        )
        searcher = self.index.searcher()
        hits = searcher.search(q, TOP).hits
        return [searcher.doc(addr)["pk"][0] for _, addr in hits]

    def add(self, pk: int, text: str) -> None:
        import tantivy

        if self.writer is None:
            self.writer = self.index.writer(heap_size=15_000_000, num_threads=1)
        self.writer.add_document(tantivy.Document(pk=pk, terms=" ".join(analyzer()(text))))
        self.writer.commit()
        self.index.reload()


MAKE = {
    "rebuild": Rebuild,
    "postings": Postings,
    "postings_pg": PostingsPG,
    "fts5": FTS5,
    "tantivy": Tantivy,
}


# ---------------------------------------------------------------------------------- measuring


def open_child(engine: str, where: Path, n: int, questions: list[str]) -> dict[str, Any]:
    """A fresh process: open, first query, the rest warm, then ingests."""
    e = MAKE[engine]()
    analyzer()("warm the stemmer")  # the process's start, not the index's load
    t0 = time.perf_counter()
    e.open(where)
    opened = time.perf_counter() - t0
    first = [e.query(questions[0])]
    cold = time.perf_counter() - t0
    warm = []
    for q in questions[1:]:
        t = time.perf_counter()
        first.append(e.query(q))
        warm.append((time.perf_counter() - t) * 1000)
    rss = peak_rss_mb()
    rng = random.Random(1)
    ingest = []
    for i in range(INGESTS):
        text = session_text(make_session(rng, f"new{i}", session_date(n + i)))
        t = time.perf_counter()
        e.add(n + i, text)
        ingest.append((time.perf_counter() - t) * 1000)
    return {
        "open_s": opened,
        "cold_first_query_s": cold,
        "warm": summarize(warm),
        "rss_mb": rss,
        "ingest": summarize(ingest),
        "tops": first,
    }


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``): ``ru_maxrss`` survives ``exec`` on Linux, so a child
    started by a parent that held the corpus would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def agreement(tops: list[list[int]], ref: list[list[int]]) -> dict[str, float]:
    same = np.mean([a == b for a, b in zip(tops, ref, strict=True)])
    overlap = np.mean(
        [len(set(a) & set(b)) / max(len(b), 1) for a, b in zip(tops, ref, strict=True)]
    )
    return {"top10_identical": float(same), "top10_overlap": float(overlap)}


def run_size(n: int, engines: list[str], questions: list[str], work: Path) -> list[dict[str, Any]]:
    texts = corpus(n)
    rows, ref = [], None
    for engine in engines:
        where = work / f"{engine}-{n}"
        where.mkdir()
        t = time.perf_counter()
        MAKE[engine]().build(texts, where)
        build_s = time.perf_counter() - t
        qfile = work / "questions.json"
        qfile.write_text(json.dumps(questions))
        out = subprocess.run(
            [sys.executable, "-m", "eval.bench.bench_index_engines", "--child", engine]
            + [str(where), str(n), str(qfile)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        tops = res.pop("tops")
        if engine == "rebuild":
            ref = tops
        made = MAKE[engine]()
        size = made.disk_mb(where) if hasattr(made, "disk_mb") else disk_mb(where)
        row = {"sessions": n, "engine": engine, "build_s": build_s, "disk_mb": size}
        row |= res
        if ref is not None:
            row |= agreement(tops, ref)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if hasattr(made, "drop"):
            made.drop(where)
        shutil.rmtree(where)
    return rows


def render(result: dict[str, Any]) -> str:
    head = (
        "| sessions | engine | build s | disk MB | open + first query s | warm p50 / p95 ms "
        "| RSS MB | ingest p50 / p95 ms | top-10 identical | top-10 overlap |"
    )
    lines = [
        "# Engines for a user's coarse index",
        "",
        f"Generated from `bench_index_engines.json` by `eval/bench/bench_index_engines.py`. "
        f"`{result['command']}` at code version `{result['code_version']}`; {result['machine']}.",
        "",
        "One user's sessions from the recall benchmarks' generator; each engine builds its "
        "index, then a fresh process opens it and answers the questions (the first one timed "
        "with the open; the OS cache as the build left it), then adds and commits "
        f"{INGESTS} sessions one at a time. Agreement: the top 10 against today's BM25 "
        "(`rebuild`, `IncrementalBM25`: k1 1.5, b 0.75, Lucene IDF), on the same questions.",
        "",
        head,
        "|---" * (head.count("|") - 1) + "|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['sessions']:,} | {r['engine']} | {r['build_s']:.1f} | {r['disk_mb']:.1f} "
            f"| {r['cold_first_query_s']:.3f} | {r['warm']['p50_ms']} / {r['warm']['p95_ms']} "
            f"| {r['rss_mb']:.0f} | {r['ingest']['p50_ms']} / {r['ingest']['p95_ms']} "
            f"| {r.get('top10_identical', 1.0):.3f} | {r.get('top10_overlap', 1.0):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(
    sessions: Annotated[
        list[int] | None, typer.Option(help="history sizes (repeatable; default 1000, 10000)")
    ] = None,
    engine: Annotated[
        list[str] | None, typer.Option(help=f"index engines (repeatable; default all): {ENGINES}")
    ] = None,
    questions: Annotated[int, typer.Option(help="timed questions a size")] = 200,
    out: Annotated[str, typer.Option(help="the .json; the .md goes beside it")] = str(
        RESULTS / "bench_index_engines" / "bench_index_engines.json"
    ),
    child: Annotated[
        tuple[str, str, int, str] | None,
        typer.Option(help="internal: ENGINE DIR N QUESTIONS, one engine opened in a fresh process"),
    ] = None,
) -> None:
    """Users' BM25 indexes by engine: build, open, query and disk at each history size."""
    bad = sorted(set(engine or ()) - set(ENGINES))
    if bad:
        raise typer.BadParameter(f"{bad}: choose from {list(ENGINES)}", param_hint="--engine")
    if child:
        engine_name, where, n, qfile = child
        res = open_child(engine_name, Path(where), int(n), json.loads(Path(qfile).read_text()))
        print(json.dumps(res))
        return
    facts = machine()
    rng = random.Random(7)
    questions = [make_question(rng) for _ in range(questions)]
    engines = engine or list(ENGINES)
    if engines[0] != "rebuild":
        engines = ["rebuild", *[e for e in engines if e != "rebuild"]]  # the reference first
    rows = []
    with tempfile.TemporaryDirectory(prefix="memsifter-index-") as tmp:
        for n in sessions or [1000, 10000]:
            rows += run_size(n, engines, questions, Path(tmp))
    result = {
        "machine": machine_line(facts, run=True),
        "machine_facts": facts,
        "command": command_line(),
        "code_version": git_head(),
        "rows": rows,
    }
    out = Path(out)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    typer.run(main)
