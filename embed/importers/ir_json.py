"""IR JSON importer: a graph document, or the document ``tunebank inspect --json`` writes (its ``graph``)."""

from os import PathLike
from pathlib import Path

import pydantic_core

from embed.errors import InvalidGraphError
from embed.importers.files import read_limited
from embed.ir import Graph, validated


def import_json(path: str | PathLike[str], *, max_bytes: int) -> Graph:
    data = read_limited(path, max_bytes)
    try:
        document = pydantic_core.from_json(data)
    except ValueError as exc:  # bad JSON, nesting past the parser's limit
        raise InvalidGraphError(f"{Path(path).name} is not JSON: {str(exc).splitlines()[0][:200]}") from None
    if isinstance(document, dict) and "subgraphs" in document and "graph" in document:
        document = document["graph"]  # an inspect --json document: the whole model's graph
    return validated(Graph, document, "graph document")
