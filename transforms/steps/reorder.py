"""``reorder(p2,p0,p1)``: the order (outer -> inner) of a group's row loops, for groups whose row roles are
exactly those listed (loop interchange: e.g. a transpose walked along its input)."""

import itertools

from embed.loopnest import LoopProgram
from transforms.recipe import Role, Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation

MAX_PERMUTED = 3  # innermost roles permuted; outer ones keep their place


class Reorder(Transformation):
    name = "reorder"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cpu":
            return []
        n = max(len(nest.parallel) for nest in program.nests)
        if n < 2:
            return []
        outer = [Role("p", k) for k in range(n - 1, MAX_PERMUTED - 1, -1)]
        inner = [Role("p", k) for k in range(min(n, MAX_PERMUTED) - 1, -1, -1)]
        return [[Step("reorder", (*outer, *perm)) for perm in itertools.permutations(inner)]]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        roles = step.args
        if not roles or not all(isinstance(r, Role) and r.kind == "p" for r in roles) or len(set(roles)) != len(roles):
            raise ScheduleError(f"step {step}: list distinct parallel roles, outer to inner")
        return schedule.set(order=tuple(roles))  # type: ignore[arg-type]


STEP = Reorder()
