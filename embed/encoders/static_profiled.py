"""``static+profiled``: the static encoder over static features joined with the profiled vector (baseline
times against the device's peaks, counters, device features)."""

import numpy as np

from embed.encoders.encoder import EncoderError, FeatureSet
from embed.encoders.static import StaticEncoder


class StaticProfiledEncoder(StaticEncoder):
    name = "static+profiled"
    uses_profile = True

    def inputs(self, features: FeatureSet) -> np.ndarray:
        if features.profiled is None:
            raise EncoderError(f"{self.name} needs profiled features (one baseline run per subgraph)")
        return np.hstack([features.static, features.profiled])
