"""Given candidates (the transfer tuner's hook): measure a given list in order, then optionally hill-climb
from the best one with up to ``local_budget`` mutations."""

from collections.abc import Sequence

from transforms.recipe import Recipe, parse
from transforms.search.space import SearchSpace
from transforms.search.strategy import Strategy


class GivenCandidates(Strategy):
    def __init__(
        self,
        space: SearchSpace,
        candidates: Sequence[Recipe | str],
        *,
        local_budget: int = 0,
        seed: int = 0,
    ) -> None:
        unique = list(dict.fromkeys(parse(c) if isinstance(c, str) else c for c in candidates))
        super().__init__(space, budget=len(unique) + local_budget, seed=seed)
        self._queue = unique

    def _propose(self, n: int) -> list[Recipe]:
        if self._queue:
            out, self._queue = self._queue[:n], self._queue[n:]
            return out
        if self.best is None:
            return []
        best = self.best[0]
        return self._fresh(lambda: self.space.mutate(best, self.rng), n)
