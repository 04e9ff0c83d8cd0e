"""Random search: uniform samples without replacement, reproducible from the seed."""

from transforms.recipe import Recipe
from transforms.search.strategy import Strategy


class RandomSearch(Strategy):
    def _propose(self, n: int) -> list[Recipe]:
        return self._random(n)
