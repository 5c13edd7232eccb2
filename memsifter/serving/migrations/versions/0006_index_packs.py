"""Packed prefixes of users' BM25 indexes: ``index_page_packs`` (a user's pages' pks and BM25
lengths in chronological order, as of a version) and ``index_posting_packs`` (a term's postings,
as of a version), each two arrays in one row (``memsifter.serving.store.packs``). A replica
opening a user of a million pages reads one row and the pages added since instead of a million
rows. Existing users have no packs: the first replica to open one writes them.

On PostgreSQL the arrays are stored uncompressed (``STORAGE EXTERNAL``): integers that pglz
squeezes little, read whole on every open.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "index_page_packs",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.String(32), nullable=True),
        sa.Column("analyzer", sa.String(64), nullable=True),
        sa.Column("pks", sa.LargeBinary(), nullable=False),
        sa.Column("lengths", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "user_id"],
            ["users.tenant_id", "users.user_id"],
            name="fk_index_page_packs_tenant_id_users",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name="pk_index_page_packs"),
    )
    op.create_table(
        "index_posting_packs",
        sa.Column("term_pk", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("pks", sa.LargeBinary(), nullable=False),
        sa.Column("tfs", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["term_pk"],
            ["index_terms.pk"],
            name="fk_index_posting_packs_term_pk_index_terms",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("term_pk", name="pk_index_posting_packs"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for table, columns in (
            ("index_page_packs", ("pks", "lengths")),
            ("index_posting_packs", ("pks", "tfs")),
        ):
            for column in columns:
                op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("index_posting_packs")
    op.drop_table("index_page_packs")
