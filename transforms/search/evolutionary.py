"""Steady-state evolutionary search: tournament selection among the best results so far, crossover, mutation.

Until ``population`` results are in (or fewer than two are ok) it samples at random.
"""

from transforms.recipe import Recipe
from transforms.search.space import SearchSpace
from transforms.search.strategy import Strategy


class Evolutionary(Strategy):
    def __init__(
        self,
        space: SearchSpace,
        *,
        budget: int | None = None,
        seed: int = 0,
        population: int = 16,
        tournament: int = 3,
        crossover_rate: float = 0.5,
    ) -> None:
        super().__init__(space, budget=budget, seed=seed)
        self.population = population
        self.tournament = tournament
        self.crossover_rate = crossover_rate

    def _propose(self, n: int) -> list[Recipe]:
        ok = sorted((m for m in self.history if m[1].ok), key=lambda m: m[1].score)[: self.population]
        if len(self.history) < self.population or len(ok) < 2:
            return self._random(n)
        parents = [recipe for recipe, _ in ok]  # best first: a lower index wins a tournament

        def select() -> Recipe:
            return parents[min(self.rng.randrange(len(parents)) for _ in range(self.tournament))]

        def child() -> Recipe:
            first = select()
            if self.rng.random() < self.crossover_rate:
                first = self.space.crossover(first, select(), self.rng)
            return self.space.mutate(first, self.rng)

        taken: set[Recipe] = set()
        out = self._fresh(child, n, taken)
        return out + self._random(n - len(out), taken)
