"""Errors raised by the embed layer. Each message says what was wrong and how to fix it."""


class EmbedError(ValueError):
    """Base class of every error the embed layer raises on bad input."""


class InvalidGraphError(EmbedError):
    """A graph document or IR object breaks the schema (bounds, references, op set)."""


class ModelImportError(EmbedError):
    """A model file or module could not be turned into a graph."""


class UnsupportedSubgraphError(EmbedError):
    """A subgraph cannot be lowered or evaluated (e.g. it holds an opaque node)."""
