"""Each user's BM25 index in the database, written with the pages: ``index_terms`` (a user's
analysed terms), ``index_postings`` (a term's count in a page), ``pages.n_terms`` (a page's BM25
length), ``pages.undated`` and ``pages.date`` (its session's, so that a user's pages are read in
chronological order from one index), ``users.index_analyzer`` (the analyzer that wrote the
postings), ``users.pages_removed`` (the version of the last write that removed pages) and an
index on ``pages.added_version``, by which replicas catch up. Rows from before this revision
have no postings (``index_analyzer`` NULL): a replica indexes such a user when it first serves
them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("index_analyzer", sa.String(64), nullable=True))
    op.add_column("users", sa.Column("pages_removed", sa.Integer(), nullable=True))
    op.add_column("pages", sa.Column("n_terms", sa.Integer(), nullable=True))
    op.add_column("pages", sa.Column("undated", sa.Boolean(), nullable=True))
    op.add_column("pages", sa.Column("date", sa.DateTime(), nullable=True))
    # Existing pages take their session's date; new ones are written with it.
    op.execute(
        "UPDATE pages SET date = (SELECT sessions.date FROM sessions"
        " WHERE sessions.pk = pages.session_pk)"
    )
    op.execute("UPDATE pages SET undated = (date IS NULL)")
    op.create_index("ix_pages_user_added", "pages", ["tenant_id", "user_id", "added_version"])
    op.create_index(
        "ix_pages_user_chronological",
        "pages",
        ["tenant_id", "user_id", "undated", "date", "session_pk", "turn_start", "n_terms"],
    )
    op.create_table(
        "index_terms",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("term", sa.String(100), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.user_id"],
            name="fk_index_terms_tenant_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pk", name="pk_index_terms"),
        sa.UniqueConstraint("tenant_id", "user_id", "term", name="uq_index_terms_user_term"),
    )
    op.create_table(
        "index_postings",
        sa.Column("term_pk", sa.Integer(), nullable=False),
        sa.Column("page_pk", sa.Integer(), nullable=False),
        sa.Column("tf", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["term_pk"],
            ["index_terms.pk"],
            name="fk_index_postings_term_pk_index_terms",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["page_pk"],
            ["pages.pk"],
            name="fk_index_postings_page_pk_pages",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("term_pk", "page_pk", name="pk_index_postings"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_index_postings_page_pk", "index_postings", ["page_pk"])


def downgrade() -> None:
    op.drop_index("ix_index_postings_page_pk", table_name="index_postings")
    op.drop_table("index_postings")
    op.drop_table("index_terms")
    op.drop_index("ix_pages_user_chronological", table_name="pages")
    op.drop_index("ix_pages_user_added", table_name="pages")
    with op.batch_alter_table("pages") as batch:
        batch.drop_column("date")
        batch.drop_column("undated")
        batch.drop_column("n_terms")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("pages_removed")
        batch.drop_column("index_analyzer")
