"""``fuse(none|outer|all)``: run consecutive nests inside shared row loops (see ``transforms.schedule``).

Only modes that group the program differently are offered; ``all`` is preferred to ``outer`` when both
give the same groups, and a foreign mode adapts to the offered mode that groups like it."""

from embed.loopnest import LoopProgram
from transforms.recipe import Step
from transforms.schedule import FUSE_MODES, Schedule, plan_groups
from transforms.transformation import Transformation, expect_ident


def _grouping(program: LoopProgram, mode: str) -> tuple[tuple[tuple[int, ...], int], ...]:
    return tuple((g.nests, g.depth) for g in plan_groups(program, mode))


class Fuse(Transformation):
    name = "fuse"

    def _offered(self, program: LoopProgram) -> dict[tuple[tuple[tuple[int, ...], int], ...], str]:
        seen: dict[tuple[tuple[tuple[int, ...], int], ...], str] = {}
        for mode in reversed(FUSE_MODES):
            seen.setdefault(_grouping(program, mode), mode)
        return seen

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        offered = self._offered(program)
        modes = sorted(offered.values(), key=FUSE_MODES.index)
        return [[Step("fuse", (m,)) for m in modes]] if len(modes) > 1 else []

    def nearest(self, step: Step, program: LoopProgram, backend: str) -> Step | None:
        offered = self._offered(program)
        if len(offered) < 2:
            return None
        mode = step.args[0] if step.args and step.args[0] in FUSE_MODES else "all"
        return Step("fuse", (offered[_grouping(program, str(mode))],))

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        return schedule.set(fuse=expect_ident(step, 0, FUSE_MODES))


STEP = Fuse()
