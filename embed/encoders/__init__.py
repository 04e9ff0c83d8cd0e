"""Encoders: feature vectors -> performance embeddings, versioned and registered by name.

    encoder = create("static").fit(features)             # FeatureSet: static (+ profiled) rows
    vectors = encoder.encode(features)                    # float32, one row per subgraph
    encoder.version                                       # a content hash of the fitted state
    load(encoder.save(path))                              # the same encoder, from an .npz file (no pickle)
"""

from pathlib import Path

from embed.encoders.encoder import Encoder, EncoderError, FeatureSet, TransferPairs
from embed.registry import Registry

__all__ = ["Encoder", "EncoderError", "FeatureSet", "TransferPairs", "create", "encoders", "load"]

encoders: Registry[type[Encoder]] = Registry("encoder")
encoders.register_lazy("static", "embed.encoders.static:StaticEncoder")
encoders.register_lazy("static+profiled", "embed.encoders.static_profiled:StaticProfiledEncoder")
encoders.register_lazy("learned", "embed.encoders.learned:LearnedEncoder")


def create(name: str, **options: object) -> Encoder:
    """An unfitted encoder of the registered class ``name``."""
    return encoders.get(name)(**options)


def load(path: Path) -> Encoder:
    """An encoder saved with ``Encoder.save``; the class is looked up by the name stored in the file."""
    name, state = Encoder.read(path)
    return encoders.get(name).from_state(state)
