"""The transformation interface and its registry.

A transformation is a small object with a ``name`` (the recipe step name), the choices it offers for a
program (``choices``: groups of alternative steps, e.g. one group per role for ``tile``; none when it does
not apply), and ``apply`` (set the knobs of a ``Schedule``). ``nearest`` picks the legal step closest to
a foreign one; ``transforms.adapt`` uses it to move a recipe between programs.

    from transforms.transformation import apply_recipe
    schedule = apply_recipe(parse("fuse(all);parallel(1);tile(p1,4)"), program)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from embed.loopnest import LoopProgram
from embed.registry import Registry, UnknownNameError
from transforms.recipe import Param, Recipe, Role, Step
from transforms.schedule import Schedule, ScheduleError


class Transformation(ABC):
    """One family of recipe steps (see the module docstring)."""

    name: ClassVar[str]
    #: When True and the transformation applies, it alone decides the generated code: the search space is
    #: then its choices only (e.g. ``gemm``, whose kernel ignores every other knob).
    exclusive: ClassVar[bool] = False

    @abstractmethod
    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        """Groups of alternative steps legal for ``program`` on ``backend``; [] when it does not apply."""

    def offered(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        """``choices``, computed once per program and backend (callers must not change the lists)."""
        return program.memoized(("choices", self.name, backend), lambda: self.choices(program, backend))

    @abstractmethod
    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        """``schedule`` with this step's knobs set; ScheduleError for malformed parameters."""

    def preferred(self, program: LoopProgram, backend: str) -> Step | None:
        """The step a default recipe takes from this transformation in place of ``transforms.space.DEFAULTS``'
        (a default that depends on the shapes), or None to keep that."""
        return None

    def vendor_ranked(self, program: LoopProgram, backend: str) -> list[Step]:
        """Steps that hand the program to a vendor library, in the order of the library's own heuristic (its
        first choice first); [] when there are none. No kernel of ours is compiled for them."""
        return []

    def nearest(self, step: Step, program: LoopProgram, backend: str) -> Step | None:
        """The legal step closest to ``step`` (itself when legal), or None when nothing fits."""
        groups = self.offered(program, backend)
        if _has_role(step) and len(groups) > 1:  # tile(p1, ...): only the choices for the same role
            groups = [g for g in groups if g[0].args[:1] == step.args[:1]]
        pool = [s for g in groups for s in g]
        if not pool:
            return None
        return step if step in pool else min(pool, key=lambda s: _distance(step.args, s.args))


def _has_role(step: Step) -> bool:
    return bool(step.args) and isinstance(step.args[0], Role)


def _distance(a: Sequence[Param], b: Sequence[Param]) -> float:
    total = abs(len(a) - len(b)) * 100.0
    for x, y in zip(a, b, strict=False):
        if isinstance(x, int) and isinstance(y, int):
            total += abs(math.log2(max(x, 1)) - math.log2(max(y, 1)))
        elif x != y:
            total += 10.0
    return total


def expect_int(step: Step, position: int, allowed: Sequence[int] | None = None) -> int:
    """Positional int argument ``position`` of ``step``, optionally restricted to ``allowed``."""
    value = step.args[position] if len(step.args) > position else None
    if not isinstance(value, int) or (allowed is not None and value not in allowed):
        want = f"one of {list(allowed)}" if allowed is not None else "an integer"
        raise ScheduleError(f"step {step}: argument {position + 1} must be {want}")
    return value


def expect_ident(step: Step, position: int, allowed: Sequence[str]) -> str:
    value = step.args[position] if len(step.args) > position else None
    if not isinstance(value, str) or value not in allowed:
        raise ScheduleError(f"step {step}: argument {position + 1} must be one of {', '.join(allowed)}")
    return value


transformations: Registry[Transformation] = Registry("transformation")
for _name in ("fuse", "parallel", "tile", "reorder", "vectorize", "unroll", "reduce", "threads", "rows_per_block",
              "row_depth", "row_mode", "inline", "gemm", "sparse", "stage", "persist", "cache_hint", "conv"):
    transformations.register_lazy(_name, f"transforms.steps.{_name}:STEP")


def lookup(name: str) -> Transformation:
    try:
        return transformations.get(name)
    except UnknownNameError as e:
        raise ScheduleError(str(e)) from None


def apply_recipe(recipe: Recipe, program: LoopProgram) -> Schedule:
    """The schedule ``recipe`` makes of ``program``: its steps applied in order to the default knobs."""
    schedule = Schedule(program)
    for step in recipe:
        schedule = lookup(step.name).apply(schedule, step)
    return schedule
