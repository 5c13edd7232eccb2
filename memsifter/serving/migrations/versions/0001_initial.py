"""The recall service's first schema: tenants, API keys, users, sessions, pages, bookmarks,
facts, resident pages and the paging log.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _user_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant_id", "user_id"],
        ["users.tenant_id", "users.user_id"],
        name=f"fk_{table}_tenant_id_users",
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(128), nullable=True),
        sa.Column("fact_types", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_keys_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_table(
        "users",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name="pk_users"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_users_tenant_id_tenants", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "sessions",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("date", sa.DateTime(), nullable=True),
        sa.Column("date_text", sa.String(64), nullable=True),
        sa.Column("turns", sa.JSON(), nullable=False),
        sa.Column("n_turns", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_sessions"),
        _user_fk("sessions"),
        sa.UniqueConstraint("tenant_id", "user_id", "session_id", name="uq_sessions_user_session"),
    )
    op.create_table(
        "pages",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("page_id", sa.String(200), nullable=False),
        sa.Column("turn_start", sa.Integer(), nullable=False),
        sa.Column("turn_end", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_pages"),
        sa.ForeignKeyConstraint(
            ["session_pk"], ["sessions.pk"], name="fk_pages_session_pk_sessions", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("tenant_id", "user_id", "page_id", name="uq_pages_user_page"),
    )
    op.create_index("ix_pages_session_pk", "pages", ["session_pk"])
    op.create_table(
        "bookmarks",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("page_pk", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("keyword", sa.String(200), nullable=False),
        sa.Column("term", sa.String(100), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_bookmarks"),
        sa.ForeignKeyConstraint(
            ["page_pk"], ["pages.pk"], name="fk_bookmarks_page_pk_pages", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_bookmarks_page_pk", "bookmarks", ["page_pk"])
    op.create_index("ix_bookmarks_user_term", "bookmarks", ["tenant_id", "user_id", "term"])
    op.create_table(
        "facts",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fact_id", sa.String(36), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("importance", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_accessed_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("superseded_by", sa.String(36), nullable=True),
        sa.Column("superseded_at", sa.DateTime(), nullable=True),
        sa.Column("source", sa.String(128), nullable=True),
        sa.PrimaryKeyConstraint("pk", name="pk_facts"),
        _user_fk("facts"),
        sa.UniqueConstraint("fact_id", name="uq_facts_fact_id"),
    )
    op.create_index("ix_facts_expires_at", "facts", ["expires_at"])
    op.create_index("ix_facts_user_subject", "facts", ["tenant_id", "user_id", "subject"])
    op.create_table(
        "resident_pages",
        sa.Column("page_pk", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("paged_in_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("page_pk", name="pk_resident_pages"),
        sa.ForeignKeyConstraint(
            ["page_pk"], ["pages.pk"], name="fk_resident_pages_page_pk_pages", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_resident_user", "resident_pages", ["tenant_id", "user_id"])
    op.create_table(
        "paging_events",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("page_id", sa.String(200), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("relevance_rank", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_paging_events"),
        _user_fk("paging_events"),
    )
    op.create_index("ix_paging_events_user_at", "paging_events", ["tenant_id", "user_id", "at"])


def downgrade() -> None:
    for table in (
        "paging_events",
        "resident_pages",
        "facts",
        "bookmarks",
        "pages",
        "sessions",
        "users",
        "api_keys",
        "tenants",
    ):
        op.drop_table(table)
