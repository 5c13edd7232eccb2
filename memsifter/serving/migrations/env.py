"""Alembic environment: runs on the connection ``Store.migrate`` passes in, or on
``sqlalchemy.url`` when invoked as ``alembic -c ... upgrade head`` by hand."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from memsifter.serving.store.schema import Base

config = context.config


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things in place; batch mode copies the table.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
