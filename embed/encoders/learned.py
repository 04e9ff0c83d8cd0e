"""``learned``: the ``static`` embedding (frozen principal components) joined with learned components trained so
that embedding distance ranks transfer partners.

Input: standardized static features (joined with the profiled vector when the training set has one). Output:
``e(x) = [x C, x W + tanh(x W1 + b1) W2]``: ``C`` are the principal components (the ``static`` embedding),
scaled so that the mean distance of the training pairs equals their mean transfer loss and never trained, so
the learned part refines the static neighbourhoods instead of replacing them; ``W`` starts small and random
(zero is a stationary point of the distance) and ``W2`` at zero. Trained on measured cross-applications
(``TransferPairs``) with two terms:

* ranking: for two pairs with the same anchor ``a``, the recipe that transfers better (lower loss) must come
  from the nearer subgraph, by a margin (hinge, weighted by how much better it transfers);
* regression: the distance ``|e(a) - e(b)|`` approximates the loss ``log2(t(a with b's best) / t(a best))``.

Trained with PyTorch (imported only by ``fit``); encoding is NumPy, so a fitted encoder runs anywhere.
"""

from typing import Self

import numpy as np

from embed.encoders.encoder import Encoder, EncoderError, FeatureSet, TransferPairs, standardize
from embed.encoders.static import StaticEncoder

MARGIN = 0.1  # loss difference (log2) below which two transfers count as equally good


class LearnedEncoder(Encoder):
    name = "learned"
    uses_profile = True  # trained on static + profiled rows when the training set has them
    learns = True

    def __init__(self, dim: int = 16, learned_dim: int = 8, hidden: int = 32, steps: int = 300, lr: float = 1e-2,
                 weight_decay: float = 1e-3, regression: float = 0.1, seed: int = 0) -> None:
        self.dim, self.learned_dim, self.hidden, self.steps, self.lr = dim, learned_dim, hidden, steps, lr
        self.weight_decay, self.regression, self.seed = weight_decay, regression, seed
        self._state = None

    @staticmethod
    def _inputs(features: FeatureSet, profiled: bool) -> np.ndarray:
        if not profiled:
            return features.static
        if features.profiled is None:
            raise EncoderError("this learned encoder was trained with profiled features; pass them")
        return np.hstack([features.static, features.profiled])

    def fit(self, features: FeatureSet, pairs: TransferPairs | None = None) -> Self:
        if pairs is None or len(pairs) == 0:
            raise EncoderError("the learned encoder needs measured transfer pairs (run the crawler's cross table)")
        profiled = features.profiled is not None
        x = self._inputs(features, profiled)
        mean, scale = standardize(x)
        components = StaticEncoder(self.dim).fit(FeatureSet(x)).state()["components"].T
        weights = _train((x - mean) / scale, components, pairs, self)
        self._state = {"mean": mean, "scale": scale, "profiled": np.array([int(profiled)]), **weights}
        return self

    def encode(self, features: FeatureSet) -> np.ndarray:
        s = self.state()
        x = self._inputs(features, bool(s["profiled"][0]))
        if x.shape[1] != s["mean"].shape[0]:
            raise EncoderError(f"{self.name} was fitted on {s['mean'].shape[0]} features, got {x.shape[1]}")
        z = (x - s["mean"]) / s["scale"]
        learned = z @ s["W"] + np.tanh(z @ s["W1"] + s["b1"]) @ s["W2"]
        return np.hstack([z @ s["C"], learned]).astype(np.float32)

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Self:
        encoder = cls(dim=int(state["C"].shape[1]), learned_dim=int(state["W"].shape[1]),
                      hidden=int(state["W1"].shape[1]))
        encoder._state = dict(state)
        return encoder


def _triplets(pairs: TransferPairs) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) of pairs with the same anchor where pair i transfers clearly better than pair j."""
    same = pairs.a[:, None] == pairs.a[None, :]
    better = pairs.loss[:, None] + MARGIN < pairs.loss[None, :]
    i, j = np.nonzero(same & better)
    return i, j


def _train(z: np.ndarray, components: np.ndarray, pairs: TransferPairs,
           options: LearnedEncoder) -> dict[str, np.ndarray]:
    import torch

    generator = torch.Generator().manual_seed(options.seed)
    x = torch.as_tensor(z, dtype=torch.float64)
    spread = np.linalg.norm(z[pairs.a] @ components - z[pairs.b] @ components, axis=1).mean()
    components = components * (pairs.loss.mean() / max(spread, 1e-12))
    fixed = x @ torch.as_tensor(components, dtype=torch.float64)  # the static part: not trained
    n_in, dim = z.shape[1], options.learned_dim
    w = torch.nn.Parameter(0.01 * torch.randn(n_in, dim, generator=generator, dtype=torch.float64))
    w1 = torch.nn.Parameter(torch.randn(n_in, options.hidden, generator=generator, dtype=torch.float64) / n_in**0.5)
    b1 = torch.nn.Parameter(torch.zeros(options.hidden, dtype=torch.float64))
    w2 = torch.nn.Parameter(torch.zeros(options.hidden, dim, dtype=torch.float64))
    a, b = torch.as_tensor(pairs.a), torch.as_tensor(pairs.b)
    loss = torch.as_tensor(pairs.loss, dtype=torch.float64)
    better, worse = (torch.as_tensor(t) for t in _triplets(pairs))
    gap = loss[worse] - loss[better]
    optimizer = torch.optim.Adam([w, w1, b1, w2], lr=options.lr, weight_decay=options.weight_decay)
    for _ in range(options.steps):
        optimizer.zero_grad()
        e = torch.cat([fixed, x @ w + torch.tanh(x @ w1 + b1) @ w2], dim=1)
        distance = torch.sqrt(((e[a] - e[b]) ** 2).sum(dim=1) + 1e-9)
        objective = options.regression * ((distance - loss) ** 2).mean()
        if len(better):
            objective = objective + (gap * torch.relu(distance[better] - distance[worse] + MARGIN)).mean()
        objective.backward()
        optimizer.step()
    weights = {k: v.detach().numpy().copy() for k, v in {"W": w, "W1": w1, "b1": b1, "W2": w2}.items()}
    return {"C": components, **weights}
