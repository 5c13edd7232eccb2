"""Tenants and their API keys: bootstrap, create, list, revoke, and authenticate a request.

Keys are stored by hash only (``hash_key``). **Revoked keys** are remembered
(``revoked_keys``, by hash), so re-adding a configured bootstrap key at start-up never brings
back a key an admin revoked.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

from sqlalchemy import bindparam, select

from memsifter.serving.errors import ConflictError, ServeError
from memsifter.serving.store.engine import Database, retried_write
from memsifter.serving.store.records import ApiKeyInfo, Principal, utcnow
from memsifter.serving.store.schema import ApiKeyRow, RevokedKeyRow, TenantRow


def hash_key(key: str) -> str:
    """API keys are random and long, so an unsalted sha256 cannot be brute-forced; it lets a
    request's key be looked up by an index instead of checked against every stored hash."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


# Every request's key lookup, built once: building a select costs more than running it.
_KEY_LOOKUP = select(ApiKeyRow.tenant_id, ApiKeyRow.agent, ApiKeyRow.fact_types).where(
    ApiKeyRow.key_hash == bindparam("key_hash")
)


class PrincipalCache:
    """Keys that authenticated in the last ``ttl_s`` seconds, by hash, so that a request whose
    key was just checked skips the database lookup, and with it the thread hop to reach the
    database, which on 2 cores cost more than a recall's ranking.

    Only successes are kept: an unknown key always reaches the database, so a flood of random
    keys cannot fill the cache or be answered from it. A revocation in this process clears it
    (``clear``); other workers and replicas stop accepting a revoked key within ``ttl_s``.
    ``ttl_s = 0`` turns the cache off. Bounded: the least recently used keys go first."""

    def __init__(self, ttl_s: float, max_keys: int = 10_000) -> None:
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> Principal | None:
        if self.ttl_s == 0:
            return None
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if time.monotonic() - entry[0] > self.ttl_s:
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return entry[1]

    def put(self, digest: str, who: Principal) -> None:
        if self.ttl_s == 0:
            return
        with self._lock:
            self._entries[digest] = (time.monotonic(), who)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class KeyRepository(Database):
    """Tenants and API keys."""

    @retried_write
    def ensure_tenant(self, tenant: str) -> None:
        with self._write() as s:
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())

    @retried_write
    def add_api_key(
        self,
        tenant: str,
        *,
        key: str | None = None,
        key_sha256: str | None = None,
        agent: str | None = None,
        fact_types: Sequence[str] | None = None,
    ) -> bool:
        """Store a key (by hash) for ``tenant``, creating the tenant; False if it existed or
        was revoked (a revoked key is never added again; see ``key_revoked``)."""
        digest = key_sha256.lower() if key_sha256 else hash_key(key or "")
        if not key and not key_sha256:
            raise ServeError("an API key needs key or key_sha256", field="key")
        with self._write() as s:
            if s.get(RevokedKeyRow, digest) is not None:
                return False
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())
            # Replicas starting together bootstrap the same keys: insert-or-nothing, then look.
            inserted = self._insert_ignore(
                s,
                ApiKeyRow,
                tenant_id=tenant,
                key_hash=digest,
                agent=agent,
                fact_types=list(fact_types) if fact_types is not None else None,
                created_at=utcnow(),
            )
            if inserted:
                return True
            owner = s.scalar(select(ApiKeyRow.tenant_id).where(ApiKeyRow.key_hash == digest))
            if owner != tenant:
                raise ConflictError("this key already belongs to another tenant", field="key")
            return False

    def key_revoked(self, key_sha256: str) -> bool:
        with self._read() as s:
            return s.get(RevokedKeyRow, key_sha256.lower()) is not None

    @retried_write
    def create_api_key(
        self, tenant: str, *, agent: str | None = None, fact_types: Sequence[str] | None = None
    ) -> tuple[ApiKeyInfo, str]:
        """A new random key for ``tenant`` (created if new): its record and the plaintext,
        which is not stored and cannot be shown again."""
        key = "msk-" + secrets.token_urlsafe(24)
        with self._write() as s:
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())
            row = ApiKeyRow(
                tenant_id=tenant,
                key_hash=hash_key(key),
                agent=agent,
                fact_types=list(fact_types) if fact_types is not None else None,
                created_at=utcnow(),
            )
            s.add(row)
            s.flush()
            return _key_info(row), key

    def list_api_keys(self, tenant: str) -> list[ApiKeyInfo] | None:
        """The tenant's keys, oldest first; None for an unknown tenant."""
        with self._read() as s:
            if s.get(TenantRow, tenant) is None:
                return None
            rows = s.scalars(
                select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant).order_by(ApiKeyRow.id)
            ).all()
            return [_key_info(r) for r in rows]

    @retried_write
    def revoke_api_key(self, key_id: int) -> ApiKeyInfo | None:
        """Delete a key and record its hash as revoked, so that no restart adds it back;
        requests with it fail from the next one on. None if there is none."""
        with self._write() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            info = _key_info(row)
            self._insert_ignore(
                s,
                RevokedKeyRow,
                key_hash=row.key_hash,
                tenant_id=row.tenant_id,
                revoked_at=utcnow(),
            )
            s.delete(row)
            return info

    def authenticate(self, key: str) -> Principal | None:
        with self._read_row() as conn:  # every request: no ORM session, a prebuilt statement
            row = conn.execute(_KEY_LOOKUP, {"key_hash": hash_key(key)}).first()
        if row is None:
            return None
        types = tuple(row.fact_types) if row.fact_types is not None else None
        return Principal(tenant_id=row.tenant_id, agent=row.agent, fact_types=types)


def _key_info(row: ApiKeyRow) -> ApiKeyInfo:
    return ApiKeyInfo(
        key_id=row.id,
        tenant_id=row.tenant_id,
        key_sha256_prefix=row.key_hash[:8],
        agent=row.agent,
        fact_types=tuple(row.fact_types) if row.fact_types is not None else None,
        created_at=row.created_at,
    )
