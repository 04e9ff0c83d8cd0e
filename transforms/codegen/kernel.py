"""What a code generator returns: source text for a backend and the launches that run it, in order."""

from __future__ import annotations

from dataclasses import dataclass

from embed.ir import DType
from embed.loopnest import LoopProgram
from transforms.run import Launch


@dataclass(frozen=True)
class Kernel:
    """Generated source for ``backend`` ("cpu" | "cuda"); ``launches`` run one after another on the same buffers."""

    backend: str
    code: str
    launches: tuple[Launch, ...]


def compute_dtype(program: LoopProgram) -> DType:
    """The arithmetic type of generated code: float64 when any buffer is float64, else float32."""
    return DType.FLOAT64 if any(b.dtype == DType.FLOAT64 for b in program.buffers.values()) else DType.FLOAT32
