"""Packed prefixes of users' BM25 indexes: a user's pages (pks and BM25 lengths, chronological)
or a term's postings (page pks ascending, counts) as of one version, two arrays in one row.

Opening a user of a million pages read a million rows (half a second on SQLite on 2 cores),
and a query's common term half a million more; a pack is one row. A reader takes the pack and
the rows written since (``postings.IndexRepository``), and writes a new pack when those rows
outgrow ``due``: the rows a replica reads stay a bounded share of the history, and packing
costs an ingest a few hundred bytes, amortized.

Why a pack at version ``p`` plus the rows since is the index now: pages are only added or
removed; a page's length changes only when ``reindex_user`` rewrites the postings, which
deletes the packs (``clear``); every write that removes pages sets ``users.pages_removed`` to
its version. So while ``pages_removed <= p`` (``usable``), the user's pages are the pack's and
those with ``added_version > p``, and a term's postings are the pack's and those of the pages
added since, which the reader finds by pk: above the last pk packed. It checks that every page
added since has a pk above every pk packed (``first_new_pk``), so that holds on any
database, not only where keys grow. A pack is also tied to its user's incarnation (``epoch``,
and foreign keys that delete it with the user or the term) and, for pages, to the analyzer
that counted the lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session

from memsifter.serving.store.engine import upsert_insert
from memsifter.serving.store.records import IndexState
from memsifter.serving.store.schema import IndexTermRow, PagePackRow, PageRow, PostingPackRow

PACK_MIN = 4096  # rows: fewer are read as rows, in milliseconds
# Pks are packed as the first and the steps between neighbours, counts as they are, each in
# the narrowest little-endian integer type that holds them (named in the blob's first bytes):
# a user's pages and a term's postings are close in pk, so a million pages pack into ~3 MB,
# not 12, and a cold open reads a quarter of the bytes.
_STEPS = tuple(np.dtype(c) for c in ("<i1", "<i2", "<i4", "<i8"))
_COUNTS = tuple(np.dtype(c) for c in ("<u1", "<u2", "<u4", "<u8"))
_CODE = 3  # bytes of the dtype's name ("<i2")

PAGE_PACK = select(
    PagePackRow.version,
    PagePackRow.epoch,
    PagePackRow.analyzer,
    PagePackRow.pks,
    PagePackRow.lengths,
).where(PagePackRow.tenant_id == bindparam("tenant"), PagePackRow.user_id == bindparam("user"))
POSTING_PACK = select(PostingPackRow.version, PostingPackRow.pks, PostingPackRow.tfs).where(
    PostingPackRow.term_pk == bindparam("term")
)
# The smallest pk of the pages added after a version: above every pk a pack of that version
# holds, or the pack cannot say which postings are new by pk.
FIRST_NEW_PK = select(func.min(PageRow.pk)).where(
    PageRow.tenant_id == bindparam("tenant"),
    PageRow.user_id == bindparam("user"),
    PageRow.added_version > bindparam("since"),
)


def due(unpacked: int, packed: int) -> bool:
    """Whether a read that found ``packed`` rows in a pack and ``unpacked`` rows outside it
    should write a new pack: past ``PACK_MIN`` rows, once the rows since outgrow 1/32 of it."""
    return unpacked >= max(PACK_MIN, packed // 32)


def usable(version: int, current: int, removed: int | None) -> bool:
    """Whether a pack of ``version`` still holds a prefix of the user's index at version
    ``current``, given ``users.pages_removed`` (the module doc)."""
    return version <= current and (removed is None or removed <= version)


def first_new_pk(conn: Any, who: Mapping[str, str], since: int) -> int | None:
    """The least pk of the pages added after version ``since`` (None: none were): a pack of
    that version tells the postings since by pk only if every pk it holds is below it."""
    first = conn.execute(FIRST_NEW_PK, {**who, "since": since}).scalar()
    return None if first is None else int(first)


def count_type(counts: Any) -> np.dtype:
    """The narrowest unsigned type that holds non-negative whole ``counts``."""
    return _narrowest(np.asarray(counts, dtype=np.int64), _COUNTS)


def _narrowest(values: np.ndarray, kinds: tuple[np.dtype, ...]) -> np.dtype:
    if not len(values):
        return kinds[0]
    lo, hi = int(values.min()), int(values.max())
    return next(k for k in kinds if np.iinfo(k).min <= lo and hi <= np.iinfo(k).max)


def encode_ids(ids: np.ndarray) -> bytes:
    """``ids`` (int64) as the first and the steps between neighbours; b"" for none."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return b""
    steps = np.diff(ids)
    kind = _narrowest(steps, _STEPS)
    return kind.str.encode() + ids[:1].astype("<i8").tobytes() + steps.astype(kind).tobytes()


def decode_ids(blob: bytes, extra: int = 0) -> np.ndarray:
    """``encode_ids``'s ids, with room for ``extra`` more after them."""
    if not blob:
        return np.empty(extra, dtype=np.int64)
    steps = np.frombuffer(blob, dtype=np.dtype(blob[:_CODE].decode()), offset=_CODE + 8)
    first = int(np.frombuffer(blob, dtype="<i8", count=1, offset=_CODE)[0])
    ids = np.empty(len(steps) + 1 + extra, dtype=np.int64)
    ids[0] = first
    held = ids[1 : len(steps) + 1]
    np.cumsum(steps, dtype=np.int64, out=held)
    held += first
    return ids


def encode_counts(counts: np.ndarray) -> bytes:
    """Non-negative integer ``counts`` (BM25 lengths, tf) as they are."""
    values = np.asarray(counts).astype(np.int64)
    kind = _narrowest(values, _COUNTS)
    return kind.str.encode() + values.astype(kind).tobytes()


def decode_counts(blob: bytes, more: np.ndarray | None = None) -> np.ndarray:
    """``encode_counts``'s counts followed by ``more``, in the narrowest unsigned type that
    holds both (what a pack stored, for a tail that fits it): a million page lengths or a
    common term's tfs take a byte each, and BM25 reads them the same."""
    stored = np.frombuffer(blob, dtype=np.dtype(blob[:_CODE].decode()), offset=_CODE)
    if more is None or not len(more):
        return stored.copy()  # writable, and not a view of the row's bytes
    kind = np.result_type(stored.dtype, count_type(more))
    counts = np.empty(len(stored) + len(more), dtype=kind)
    counts[: len(stored)] = stored
    counts[len(stored) :] = more
    return counts


def unpack_pages(row: Any, pks: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A page pack's (pks, BM25 lengths) followed by ``pks`` and ``lengths`` (the pages
    added since), as ``index_state`` returns them."""
    ids = decode_ids(row.pks, len(pks))
    ids[len(ids) - len(pks) :] = pks
    return ids, decode_counts(row.lengths, lengths)


def unpack_postings(row: Any) -> tuple[np.ndarray, np.ndarray]:
    """A posting pack's (page pks ascending, tf) as ``read_terms`` returns them."""
    return decode_ids(row.pks), decode_counts(row.tfs)


def _upsert(s: Session, model: Any, keys: list[str], rows: list[dict[str, Any]]) -> None:
    """Insert ``rows``, or replace a row of an older version with the same ``keys``: of two
    replicas packing at once, the newer pack stays."""
    stmt = upsert_insert(s.get_bind().dialect.name, model)
    table = model.__table__
    stmt = stmt.on_conflict_do_update(
        index_elements=keys,
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys},
        where=table.c.version < stmt.excluded.version,
    )
    s.execute(stmt, rows)


def write_pages(s: Session, tenant: str, user: str, state: IndexState) -> None:
    """Pack ``state`` (every page of the user, read in one transaction)."""
    row = {
        "tenant_id": tenant,
        "user_id": user,
        "version": state.version,
        "epoch": state.epoch,
        "analyzer": state.analyzer,
        "pks": encode_ids(state.pks),
        "lengths": encode_counts(state.lengths),
    }
    _upsert(s, PagePackRow, ["tenant_id", "user_id"], [row])


def write_postings(
    s: Session, version: int, postings: Mapping[int, tuple[np.ndarray, np.ndarray]]
) -> None:
    """Pack terms' postings (term pk -> page pks, tf), each read whole at ``version``."""
    rows = []
    for term_pk, (pks, tfs) in postings.items():
        order = np.argsort(pks, kind="stable")
        rows.append(
            {
                "term_pk": term_pk,
                "version": version,
                "pks": encode_ids(pks[order]),
                "tfs": encode_counts(tfs[order]),
            }
        )
    if rows:
        _upsert(s, PostingPackRow, ["term_pk"], rows)


def clear(s: Session, tenant: str, user: str) -> None:
    """Delete the user's packs (with their postings: the caller holds the user's row lock)."""
    terms = select(IndexTermRow.pk).where(
        IndexTermRow.tenant_id == tenant, IndexTermRow.user_id == user
    )
    s.execute(delete(PostingPackRow).where(PostingPackRow.term_pk.in_(terms)))
    s.execute(
        delete(PagePackRow).where(PagePackRow.tenant_id == tenant, PagePackRow.user_id == user)
    )
