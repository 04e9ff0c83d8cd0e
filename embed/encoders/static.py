"""``static``: standardized static features projected on their principal components (fitted, not trained)."""

from typing import Self

import numpy as np

from embed.encoders.encoder import Encoder, EncoderError, FeatureSet, TransferPairs, standardize


class StaticEncoder(Encoder):
    name = "static"

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self._state = None

    def inputs(self, features: FeatureSet) -> np.ndarray:
        """The matrix this encoder reads: the static features."""
        return features.static

    def fit(self, features: FeatureSet, pairs: TransferPairs | None = None) -> Self:
        x = self.inputs(features)
        if len(x) < 2:
            raise EncoderError(f"{self.name} needs at least 2 subgraphs to fit, got {len(x)}")
        mean, scale = standardize(x)
        _, singular, vt = np.linalg.svd((x - mean) / scale, full_matrices=False)
        keep = max(1, min(self.dim, int(np.sum(singular > 1e-9 * singular[0]))))
        components = vt[:keep]
        signs = np.sign(components[np.arange(keep), np.argmax(np.abs(components), axis=1)])
        self._state = {"mean": mean, "scale": scale, "components": components * signs[:, None]}
        return self

    def encode(self, features: FeatureSet) -> np.ndarray:
        s = self.state()
        x = self.inputs(features)
        if x.shape[1] != s["mean"].shape[0]:
            raise EncoderError(f"{self.name} was fitted on {s['mean'].shape[0]} features, got {x.shape[1]}")
        return (((x - s["mean"]) / s["scale"]) @ s["components"].T).astype(np.float32)

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Self:
        encoder = cls(dim=int(state["components"].shape[0]))
        encoder._state = dict(state)
        return encoder
