"""What we KEEP: SQLAlchemy models, sessions, migrations, vector index."""
