"""A throwaway database on a PostgreSQL server, so a test module or a benchmark run neither sees
nor clobbers anyone else's tables."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit


def scratch_postgres(dsn: str, prefix: str = "memsifter_test") -> tuple[str, Callable[[], None]]:
    """A new, empty database on ``dsn``'s server (``postgresql+psycopg://user@host:port/db``;
    the user may create databases): its SQLAlchemy URL and a function that drops it."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(dsn)
    admin = urlunsplit(parts._replace(scheme="postgresql"))  # psycopg's own form
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(parts._replace(path=f"/{name}")), drop
