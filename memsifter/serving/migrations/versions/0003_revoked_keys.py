"""Revoked API keys, by hash: start-up re-adds missing bootstrap keys, and a key an admin
revoked must stay revoked across restarts (the ``api_keys`` row alone cannot tell "never added"
from "revoked", since revoking deletes it).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revoked_keys",
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key_hash", name="pk_revoked_keys"),
    )


def downgrade() -> None:
    op.drop_table("revoked_keys")
