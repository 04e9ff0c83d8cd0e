"""``tile(p<k>,T)``: strip-mine row dim ``p<k>`` by ``T``. Reduction nests whose parallel dims are all row
dims keep one accumulator per tile point (register blocking: rows per step, matmul micro-tiles); on cuda
each thread computes the ``T`` points."""

from embed.loopnest import LoopProgram
from transforms.recipe import Role, Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_int

SIZES = (1, 2, 4, 8, 16, 32, 64)
ROLES = 2  # p0 and p1
MAX_TILE = 4096


class Tile(Transformation):
    name = "tile"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        groups = []
        for k in range(ROLES):
            extent = max((d.extent for n in program.nests for d in n.parallel if d.name == f"p{k}"), default=0)
            sizes = [t for t in SIZES if t == 1 or t <= extent] if backend == "cpu" else []
            if len(sizes) > 1:
                groups.append([Step("tile", (Role("p", k), t)) for t in sizes])
        return groups

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        role = step.args[0] if step.args else None
        if not isinstance(role, Role) or role.kind != "p":
            raise ScheduleError(f"step {step}: argument 1 must be a parallel role (p0, p1, ...)")
        size = expect_int(step, 1)
        if not 1 <= size <= MAX_TILE:
            raise ScheduleError(f"step {step}: tile size must be in [1, {MAX_TILE}]")
        tiles = tuple((r, t) for r, t in schedule.tiles if r != role) + ((role, size),)
        return schedule.set(tiles=tuple(sorted(tiles)))


STEP = Tile()
