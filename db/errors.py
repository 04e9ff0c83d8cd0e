"""Errors raised by the db layer. Each message says what was wrong and how to fix it."""


class DbError(Exception):
    """Base class of every error the db layer raises."""


class SchemaOutOfDateError(DbError):
    """The database schema is behind (or ahead of) the code's migrations."""


class InvalidRecordError(DbError, ValueError):
    """A record given to a repository is malformed or names something that does not exist."""


class NotFoundError(DbError, LookupError):
    """A row looked up by id or key does not exist."""


class IndexConfigError(DbError, ValueError):
    """A vector index factory string, metric or search parameter string is not valid."""
