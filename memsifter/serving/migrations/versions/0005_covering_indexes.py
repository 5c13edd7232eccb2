"""PostgreSQL reads a user's index from indexes alone: the postings' primary key carries ``tf``
(``INCLUDE``) and the chronological pages index carries ``pk``, so opening a user and reading a
term's postings are index-only scans instead of one heap page per row. SQLite needs neither:
``index_postings`` is clustered on its key (``WITHOUT ROWID``) and every SQLite index holds the
rowid, ``pages.pk``.

On PostgreSQL the upgrade rebuilds both indexes, and holds their tables locked while it does
(time that grows with the postings held), so a large database wants a quiet window.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_CHRONOLOGICAL = ["tenant_id", "user_id", "undated", "date", "session_pk", "turn_start", "n_terms"]


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _postgresql():
        return
    op.execute(
        "ALTER TABLE index_postings DROP CONSTRAINT pk_index_postings, "
        "ADD CONSTRAINT pk_index_postings PRIMARY KEY (term_pk, page_pk) INCLUDE (tf)"
    )
    op.drop_index("ix_pages_user_chronological", table_name="pages")
    op.create_index(
        "ix_pages_user_chronological", "pages", _CHRONOLOGICAL, postgresql_include=["pk"]
    )


def downgrade() -> None:
    if not _postgresql():
        return
    op.drop_index("ix_pages_user_chronological", table_name="pages")
    op.create_index("ix_pages_user_chronological", "pages", _CHRONOLOGICAL)
    op.execute(
        "ALTER TABLE index_postings DROP CONSTRAINT pk_index_postings, "
        "ADD CONSTRAINT pk_index_postings PRIMARY KEY (term_pk, page_pk)"
    )
