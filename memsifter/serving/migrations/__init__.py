"""Alembic migrations of the recall service's schema (``Store.migrate`` applies them)."""
