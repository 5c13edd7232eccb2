"""What a replica's in-memory index needs to catch up without diffing whole histories:
``users.epoch`` (new for every creation of a user, so a user deleted and created again is never
mistaken for the old one) and ``pages.added_version`` (the user's version that added the page).
Both are nullable: rows from before this revision are loaded by a full load, as before.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: SQLite does it in place, so no table is copied (and no foreign-key
    # cascade can fire on a copy's DROP).
    op.add_column("users", sa.Column("epoch", sa.String(32), nullable=True))
    op.add_column("pages", sa.Column("added_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pages") as batch:
        batch.drop_column("added_version")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("epoch")
