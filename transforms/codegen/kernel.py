"""What a code generator returns: source text for a backend and the launches that run it, in order."""

from __future__ import annotations

from dataclasses import dataclass, replace

from embed.ir import DType
from embed.loopnest import Buffer, BufferKind, LoopProgram
from transforms.codegen.signature import Signature, signature
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


@dataclass(frozen=True)
class CodegenContext:
    """What every generator starts from: the C type of arithmetic, the argument signature, and the buffers with
    temporaries retyped to the compute type."""

    ctype: str
    sig: Signature
    buffers: dict[str, Buffer]


def codegen_context(program: LoopProgram) -> CodegenContext:
    compute = compute_dtype(program)
    buffers = {n: replace(b, dtype=compute) if b.kind == BufferKind.TEMP else b for n, b in program.buffers.items()}
    return CodegenContext("double" if compute == DType.FLOAT64 else "float", signature(program, compute), buffers)
