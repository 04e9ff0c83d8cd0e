"""Vector index over the embeddings table (FAISS), one per (device class, encoder, encoder version)."""

from db.index.factory import Metric, parse_metric
from db.index.vector_index import IndexConfig, OpenOutcome, SearchResult, VectorIndex
from db.repositories.embeddings import IndexKey

__all__ = ["IndexConfig", "IndexKey", "Metric", "OpenOutcome", "SearchResult", "VectorIndex", "parse_metric"]
