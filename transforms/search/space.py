"""Search spaces: what a strategy may enumerate, sample, mutate and recombine."""

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from typing import Protocol

from transforms.recipe import Recipe, Step


class SearchSpace(Protocol):
    """A finite set of recipes. ``mutate`` and ``crossover`` must accept recipes from outside the space
    (e.g. a neighbour's adapted recipe) and return recipes inside it."""

    def size(self) -> int: ...

    def enumerate(self) -> Iterator[Recipe]: ...

    def sample(self, rng: random.Random) -> Recipe: ...

    def mutate(self, recipe: Recipe, rng: random.Random) -> Recipe: ...

    def crossover(self, a: Recipe, b: Recipe, rng: random.Random) -> Recipe: ...


class ProductSpace:
    """The product of choices: dimension i is a tuple of alternative steps; a recipe takes one step from
    each dimension, in dimension order.

        ProductSpace([[Step("tile", ("p0", t)) for t in (64, 128)], [Step("unroll", ("r0", u)) for u in (1, 4)]])
    """

    def __init__(self, dims: Sequence[Sequence[Step]]) -> None:
        self.dims = tuple(tuple(options) for options in dims)
        if not all(self.dims):
            raise ValueError("every dimension of a product space needs at least one option")

    def size(self) -> int:
        return math.prod(len(options) for options in self.dims)

    def enumerate(self) -> Iterator[Recipe]:
        return (Recipe(steps) for steps in itertools.product(*self.dims))

    def sample(self, rng: random.Random) -> Recipe:
        return Recipe(tuple(rng.choice(options) for options in self.dims))

    def point(self, recipe: Recipe, rng: random.Random) -> list[int]:
        """Option index per dimension: the recipe's step found among that dimension's options, else random."""
        point = []
        for options in self.dims:
            found = next((options.index(step) for step in recipe if step in options), None)
            point.append(rng.randrange(len(options)) if found is None else found)
        return point

    def recipe(self, point: Sequence[int]) -> Recipe:
        return Recipe(tuple(options[i] for options, i in zip(self.dims, point, strict=True)))

    def mutate(self, recipe: Recipe, rng: random.Random) -> Recipe:
        """Change the option of one dimension that has more than one."""
        point = self.point(recipe, rng)
        movable = [d for d, options in enumerate(self.dims) if len(options) > 1]
        if movable:
            d = rng.choice(movable)
            point[d] = rng.choice([i for i in range(len(self.dims[d])) if i != point[d]])
        return self.recipe(point)

    def crossover(self, a: Recipe, b: Recipe, rng: random.Random) -> Recipe:
        """Uniform crossover: each dimension from either parent."""
        pa, pb = self.point(a, rng), self.point(b, rng)
        return self.recipe([x if rng.random() < 0.5 else y for x, y in zip(pa, pb, strict=True)])
