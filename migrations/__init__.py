"""Alembic environment: the only way the registry schema changes."""
