"""What a code generator returns: source text for a backend and the launches that run it, in order."""

from __future__ import annotations

from dataclasses import dataclass, replace

from embed.ir import DType
from embed.loopnest import Buffer, BufferKind, LoopProgram
from transforms.codegen.expr import STORAGE_C, literal
from transforms.codegen.signature import Signature, signature
from transforms.run import Launch


@dataclass(frozen=True)
class Kernel:
    """Generated source for ``backend`` ("cpu" | "cuda"); ``launches`` run one after another on the same buffers."""

    backend: str
    code: str
    launches: tuple[Launch, ...]


def compute_dtype(program: LoopProgram) -> DType:
    """The arithmetic type of generated code: float64 when any buffer is float64 or an output is a 32- or 64-bit
    integer (float32 holds integers exactly only up to 2**24; float64 up to 2**53), else float32."""
    wide = any(b.dtype == DType.FLOAT64 or (b.kind == BufferKind.OUTPUT and b.dtype in (DType.INT64, DType.INT32))
               for b in program.buffers.values())
    return DType.FLOAT64 if wide else DType.FLOAT32


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


def cuda_params(sig: Signature, buffers: dict[str, Buffer], ctype: str) -> str:
    """The kernel parameter list: one restrict pointer per argument, const for inputs, scratch in ``ctype``."""
    params = []
    for arg in sig.args:
        name = next(n for n, a in sig.names.items() if a == arg.name)
        storage = ctype if arg.kind == "scratch" else STORAGE_C[buffers[name].dtype]
        params.append(f"{'const ' if arg.kind == 'input' else ''}{storage}* __restrict__ {arg.name}")
    return ", ".join(params)


def cuda_consts(sig: Signature, buffers: dict[str, Buffer], ctype: str) -> list[str]:
    """Declarations of the program's constant buffers as ``__device__`` arrays of generated literals."""
    out = []
    for name in sig.consts:
        b = buffers[name]
        values = ", ".join(literal(v, ctype) for v in b.value or ())
        out.append(f"__device__ const {ctype} {sig.names[name]}[{b.numel}] = {{{values}}};")
    return out
