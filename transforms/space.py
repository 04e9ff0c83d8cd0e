"""The search space of a loop program: every registered transformation's choices, as a product.

    space = RecipeSpace(program, backend="cpu")
    space.size(); space.sample(random.Random(0)); default_recipe(program, "cpu")

Each transformation contributes one dimension per group of alternatives it offers for the program
(``Transformation.choices``); transformations that do not apply contribute none. Recipes from outside the
space (a neighbour's) are first made legal with ``transforms.adapt``, then mutated or recombined.

Beside that product stand the *vendor alternatives*: the vendor-ranked steps that are in no dimension
(``conv(torch)``, ``conv(cudnn,benchmark)``, cpu ``gemm(blas)``), each a whole recipe of one step, since the library
call replaces the generated kernel and every knob of it. They count in ``size`` and come last in ``enumerate``, and
``vendor_ranked`` offers them (transfer fills with them, ``tune`` measures them after the default); ``sample``,
``mutate`` and ``crossover`` stay in the product, whose knobs they explore (a vendor recipe mutates into the
default's neighbourhood).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Collection, Iterator

from embed.loopnest import LoopProgram
from transforms.adapt import adapt
from transforms.recipe import Recipe, Step
from transforms.search.space import ProductSpace
from transforms.transformation import lookup, transformations

#: Steps every default recipe starts from, when legal: fuse what can be fused, simple parallel loops, a block
#: per row (cuda threads per block: the first choice of ``transforms.steps.threads``, which follows the rows).
DEFAULTS = {
    "cpu": (Step("fuse", ("all",)), Step("parallel", (1,))),
    "cuda": (Step("fuse", ("all",)), Step("reduce", ("block",))),
}


class RecipeSpace:
    """A :class:`~transforms.search.space.SearchSpace` over the recipes legal for ``program`` on ``backend``."""

    def __init__(self, program: LoopProgram, backend: str = "cpu") -> None:
        self.program = program
        self.backend = backend
        self._applicable = _applicable(program, backend)
        dims = [g for choices in self._applicable.values() for g in choices]
        self._product = ProductSpace(dims or [[Step("fuse", ("none",))]])
        in_product = {s for options in self._product.dims for s in options}
        self.alternatives = tuple(Recipe((step,)) for name in transformations.names()
                                  for step in lookup(name).vendor_ranked(program, backend) if step not in in_product)

    @property
    def dims(self) -> tuple[tuple[Step, ...], ...]:
        return self._product.dims

    @functools.cached_property
    def default(self) -> Recipe:
        """:func:`default_recipe` of the program (computed once: ``legal`` needs it on every mutation)."""
        return _default(self.program, self.backend, self._applicable)

    def size(self) -> int:
        return self._product.size() + len(self.alternatives)

    def enumerate(self) -> Iterator[Recipe]:
        return itertools.chain(self._product.enumerate(), self.alternatives)

    def sample(self, rng: random.Random) -> Recipe:
        return self._product.sample(rng)

    def legal(self, recipe: Recipe) -> Recipe:
        """``recipe`` adapted to this program, with every dimension's step (defaults where it had none); a recipe
        holding a vendor alternative's step is that alternative."""
        adapted, _ = adapt(recipe, self.program, self.backend)
        alternative = next((a for a in self.alternatives for s in adapted if a.steps == (s,)), None)
        if alternative is not None:
            return alternative
        point = [next((s for s in adapted if s in options), next(s for s in self.default if s in options))
                 for options in self.dims]
        return Recipe(tuple(point))

    def unset_knobs(self, recipe: Recipe) -> set[str]:
        """Names of this space's knobs that ``recipe`` gives no value (a recipe stored before they existed); none
        for a vendor alternative, which has no knobs of the product."""
        if recipe in self.alternatives:
            return set()
        return {step.name for options in self.dims for step in options} - {step.name for step in recipe.steps}

    def variants(self, recipe: Recipe, knobs: Collection[str]) -> list[Recipe]:
        """``legal(recipe)`` with each other value of each knob named in ``knobs``, one knob changed at a time:
        every knob's first other value, then every knob's second, and so on."""
        base = self.legal(recipe).steps
        others = [(n, k, choice) for k, options in enumerate(self.dims) if options[0].name in knobs
                  for n, choice in enumerate(c for c in options if c != base[k])]
        return [Recipe((*base[:k], choice, *base[k + 1:])) for _, k, choice in sorted(others, key=lambda o: o[:2])]

    def vendor_ranked(self) -> list[Recipe]:
        """The recipes that hand the program to a vendor library, in its heuristic's order
        (``Transformation.vendor_ranked``; every other dimension as in the default)."""
        ranked = [self.legal(Recipe((step,))) for name in self._applicable
                  for step in lookup(name).vendor_ranked(self.program, self.backend)]
        return [*ranked, *self.alternatives]

    def mutate(self, recipe: Recipe, rng: random.Random) -> Recipe:
        return self._product.mutate(self.legal(recipe), rng)

    def crossover(self, a: Recipe, b: Recipe, rng: random.Random) -> Recipe:
        return self._product.crossover(self.legal(a), self.legal(b), rng)


def _applicable(program: LoopProgram, backend: str) -> dict[str, list[list[Step]]]:
    """Transformation name -> its choice groups, for those that apply; only the exclusive ones if any applies."""
    groups = {name: lookup(name).offered(program, backend) for name in transformations.names()}
    groups = {name: choices for name, choices in groups.items() if choices}
    exclusive = {name: choices for name, choices in groups.items() if lookup(name).exclusive}
    return exclusive or groups


def default_recipe(program: LoopProgram, backend: str = "cpu") -> Recipe:
    """The recipe tuning starts from: :data:`DEFAULTS` adapted (each step, or what its transformation prefers for
    these shapes: ``Transformation.preferred``), then the first choice of every other dimension.

    Where an exclusive transformation applies (see ``Transformation.exclusive``), only its first choices."""
    return _default(program, backend, _applicable(program, backend))


def _default(program: LoopProgram, backend: str, applicable: dict[str, list[list[Step]]]) -> Recipe:
    """:func:`default_recipe` from the choice groups ``_applicable`` gave (a space has them already)."""
    exclusive = any(lookup(name).exclusive for name in applicable)
    chosen = [] if exclusive else [lookup(s.name).preferred(program, backend) or s
                                   for s in adapt(Recipe(DEFAULTS[backend]), program, backend)[0]]
    names = {s.name for s in chosen}
    for name, groups in applicable.items():
        for options in groups:
            if not any(s in options for s in chosen) and name not in names:
                chosen.append(options[0])
    return Recipe(tuple(chosen))
