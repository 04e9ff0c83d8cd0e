"""The shape shared by the one-argument cuda steps of row kernels (``row_mode``, ``persist``, ``cache_hint``):
offered where some group of the fully fused program has row shape (``cuda_rows.has_row_groups``)."""

from typing import ClassVar

from embed.loopnest import LoopProgram
from transforms.codegen.cuda_rows import has_row_groups
from transforms.recipe import Param, Step
from transforms.transformation import Transformation


class RowKernelStep(Transformation):
    """Offers ``name(v)`` for each of ``values`` on cuda programs with row groups; subclasses ``apply`` it."""

    values: ClassVar[tuple[Param, ...]]

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        if backend != "cuda" or not has_row_groups(program):
            return []
        return [[Step(self.name, (v,)) for v in self.values]]
