"""Exhaustive search: every recipe of the space in enumeration order (up to the budget)."""

from transforms.recipe import Recipe
from transforms.search.space import SearchSpace
from transforms.search.strategy import Strategy


class Exhaustive(Strategy):
    def __init__(self, space: SearchSpace, *, budget: int | None = None, seed: int = 0) -> None:
        super().__init__(space, budget=budget, seed=seed)
        self._order = space.enumerate()

    def _propose(self, n: int) -> list[Recipe]:
        out: list[Recipe] = []
        for recipe in self._order:
            if recipe not in self.asked:
                out.append(recipe)
                if len(out) == n:
                    break
        return out
