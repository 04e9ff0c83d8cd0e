"""The argument list every generated kernel takes, in one fixed order.

Arguments are the program's buffers as pointers: the inputs and params in ``program.inputs`` order, then the
outputs in ``program.outputs`` order, then the temporaries in buffer order (scratch memory, in the compute
type). Argument ``k`` is named ``b<k>``. Constant buffers with more than one element are emitted into the
source as arrays ``c<k>`` instead of being passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from embed.ir import DType
from embed.loopnest import BufferKind, LoopProgram
from transforms.run import Buffer as Arg

_RUN_DTYPE = {DType.BOOL: "uint8"}


@dataclass(frozen=True)
class Signature:
    """Buffer name -> generated identifier, and the runner arguments in order."""

    names: dict[str, str]
    args: tuple[Arg, ...]
    consts: tuple[str, ...]  # const buffers emitted into the source, in names order

    def arg_of(self, buffer: str) -> str:
        return self.names[buffer]


def run_dtype(dtype: DType) -> str:
    return _RUN_DTYPE.get(dtype, dtype.value)


def signature(program: LoopProgram, compute: DType) -> Signature:
    """The arguments of ``program``'s kernel; temporaries are stored in ``compute`` (float32 or float64)."""
    bufs = program.buffers
    order = [n for n in program.inputs if bufs[n].kind in (BufferKind.INPUT, BufferKind.PARAM)]
    order += [n for n in program.outputs if n not in order]
    temps = [n for n, b in bufs.items() if b.kind == BufferKind.TEMP and n not in order]
    names: dict[str, str] = {}
    args: list[Arg] = []
    for k, name in enumerate([*order, *temps]):
        b = bufs[name]
        names[name] = f"b{k}"
        kind = "input" if k < len(order) and name not in program.outputs else "output"
        if b.kind == BufferKind.TEMP:
            kind, dtype = "scratch", compute.value
        else:
            dtype = run_dtype(b.dtype)
        args.append(Arg(f"b{k}", b.shape, dtype, kind))  # type: ignore[arg-type]
    consts = [n for n, b in bufs.items() if b.kind == BufferKind.CONST and n not in names]
    for k, name in enumerate(consts):
        names[name] = f"c{k}"
    return Signature(names, tuple(args), tuple(consts))
