"""The ask/tell interface every search strategy implements, and a loop that drives one.

    strategy = strategies.get("random")(space, budget=64, seed=0)
    best = search(strategy, evaluate, batch=8)    # evaluate: list[Recipe] -> list[RunResult]

A failed measurement (``RunResult.ok`` False) is told like any other and scores infinity.
"""

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.search.space import SearchSpace

Measured = tuple[Recipe, RunResult]
Evaluate = Callable[[list[Recipe]], list[RunResult]]


class Strategy(ABC):
    """Proposes recipes (``ask``), learns their results (``tell``), tracks the ``best`` ok result.

    ``ask`` never returns a recipe it returned before, and at most ``budget`` recipes in total.
    ``done`` turns true when the budget is spent or nothing is left to propose.
    """

    def __init__(self, space: SearchSpace, *, budget: int | None = None, seed: int = 0) -> None:
        self.space = space
        self.budget = budget
        self.rng = random.Random(seed)
        self.asked: set[Recipe] = set()
        self.history: list[Measured] = []
        self.told: set[Recipe] = set()
        self.best: Measured | None = None
        self._exhausted = False

    @property
    def done(self) -> bool:
        return self._exhausted or (self.budget is not None and len(self.asked) >= self.budget)

    def ask(self, n: int) -> list[Recipe]:
        """Up to ``n`` new recipes to measure; [] once done."""
        if self.budget is not None:
            n = min(n, self.budget - len(self.asked))
        if n <= 0 or self.done:
            return []
        recipes = self._propose(n)
        if not recipes and self.asked <= self.told:
            self._exhausted = True  # nothing new, and no pending result could change that
        self.asked.update(recipes)
        return recipes

    def tell(self, results: Sequence[Measured]) -> None:
        """Record measured results (in any order, failures included; also of recipes never asked, e.g. a
        starting point)."""
        for recipe, result in results:
            self.history.append((recipe, result))
            self.told.add(recipe)
            if result.ok and (self.best is None or result.score < self.best[1].score):
                self.best = (recipe, result)

    @abstractmethod
    def _propose(self, n: int) -> list[Recipe]:
        """Up to ``n`` distinct recipes not in ``self.asked``."""

    def _fresh(self, draw: Callable[[], Recipe], n: int, taken: set[Recipe] | None = None) -> list[Recipe]:
        """Up to ``n`` distinct unasked recipes from ``draw()``, giving up after 64 + n repeats."""
        taken = set() if taken is None else taken
        out: list[Recipe] = []
        misses = 0
        while len(out) < n and misses < 64 + n:
            recipe = draw()
            if recipe in self.asked or recipe in taken:
                misses += 1
            else:
                out.append(recipe)
                taken.add(recipe)
        return out

    def _random(self, n: int, taken: set[Recipe] | None = None) -> list[Recipe]:
        """Up to ``n`` distinct unasked recipes sampled uniformly; exact even when few are left."""
        taken = set() if taken is None else taken
        out = self._fresh(lambda: self.space.sample(self.rng), n, taken)
        if len(out) < n:
            rest = [r for r in self.space.enumerate() if r not in self.asked and r not in taken]
            out += self.rng.sample(rest, min(n - len(out), len(rest)))
        return out


def search(strategy: Strategy, evaluate: Evaluate, *, batch: int = 8) -> Measured | None:
    """Ask, evaluate, tell until the strategy is done; return its best ok result (None if none was ok)."""
    while not strategy.done:
        recipes = strategy.ask(batch)
        if recipes:
            strategy.tell(list(zip(recipes, evaluate(recipes), strict=True)))
    return strategy.best
