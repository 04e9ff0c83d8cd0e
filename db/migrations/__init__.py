"""Alembic migrations of the tunebank schema (applied by ``db.migrate.upgrade``; no alembic.ini needed)."""
