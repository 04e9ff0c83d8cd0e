"""A vendor library call, then the generated epilogue: the kernel of a ``conv`` step or of ``gemm(blas)``.

The library launch (``Launch.library``, run by ``transforms.vendor_torch`` through PyTorch on the worker's own
buffers) writes the raw result of the program's first nest (the convolution's or the product's sum, before its
epilogue) into that nest's buffer: its output, or its temporary (scratch in the compute type, which the vendor
paths require the operands to have). Then one generated kernel (C with OpenMP on cpu, CUDA on cuda) takes each
element of that result, applies the first nest's epilogue (a conv bias) and every later nest (batch-norm,
activation, residual add, a GEMM's bias and views), all pointwise at the same element
(``transforms.convolution.pointwise_epilogue``), keeping intermediate values in registers, and stores the outputs.
No kernel runs when the raw result is the output already.

Launch arguments are the program's full signature (``transforms.codegen.signature``), for both launches, so that
plans and the worker bind them as they bind any kernel. Scalars describe the library call:

* ``torch_conv`` / ``cudnn_conv``: buffers x, w, out; scalars stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups
  and (cudnn) benchmark (1: cuDNN times its algorithms once per shape and keeps the fastest; 0: its heuristic) and
  tf32 (1: float32 operands rounded to TF32 on the tensor cores, as eager's own convolutions by default).
* ``torch_matmul``: buffers a, b, out; scalars m, n, k, a_outer, a_k, b_outer, b_k (element strides) and per batch
  dim i: batch<i>, a_batch<i>, b_batch<i> (extent and strides).
"""

from __future__ import annotations

import math

from embed.loopnest import BufferKind, LoopNest, LoopProgram
from transforms.codegen.cuda import CUDA_HEAD
from transforms.codegen.cuda_gemm import EpiloguePrinter
from transforms.codegen.expr import STORAGE_C, extents, literal, prelude
from transforms.codegen.kernel import Kernel, codegen_context, cuda_consts, cuda_params
from transforms.contraction import blas_contraction
from transforms.convolution import match_convolution
from transforms.run import Launch, Scalar
from transforms.schedule import Schedule, ScheduleError

ENTRY = "tb_epilogue"
THREADS = 256
#: The library routine of each vendor path, by (step, path) and backend.
LIBRARY = {(("conv", "torch"), "cpu"): "torch_conv", (("conv", "torch"), "cuda"): "torch_conv",
           (("conv", "cudnn"), "cuda"): "cudnn_conv", (("gemm", "blas"), "cpu"): "torch_matmul"}


def generate_vendor(schedule: Schedule, backend: str) -> Kernel:
    """The library launch and epilogue kernel of ``schedule.vendor`` (see the module docstring)."""
    kind, path, *knobs = schedule.vendor
    library = LIBRARY.get(((kind, path), backend))
    if library is None:
        raise ScheduleError(f"{kind}({path}) does not run on the {backend} backend")
    if kind == "conv":
        conv = match_convolution(schedule.program)
        if conv is None:
            raise ScheduleError("conv: not a convolution a library can take (see transforms.convolution)")
        program = conv.program
        operands = (conv.x, conv.w)
        (sh, sw), (ph, pw), (dh, dw) = conv.stride, conv.padding, conv.dilation
        scalars = {"stride_h": sh, "stride_w": sw, "pad_h": ph, "pad_w": pw, "dil_h": dh, "dil_w": dw,
                   "groups": conv.groups}
        if library == "cudnn_conv":
            scalars["benchmark"], scalars["tf32"] = int("benchmark" in knobs), int("tf32" in knobs)
    else:
        c = blas_contraction(schedule.program)
        if c is None:
            raise ScheduleError("gemm(blas): the program is not a float32 / float64 contraction")
        program = c.program
        operands = (c.a.buffer, c.b.buffer)
        scalars = {"m": c.m, "n": c.n, "k": c.k, "a_outer": c.a.outer, "a_k": c.a.k, "b_outer": c.b.outer,
                   "b_k": c.b.k}
        for i, extent in enumerate(c.batch):
            scalars |= {f"batch{i}": extent, f"a_batch{i}": c.a.batch[i], f"b_batch{i}": c.b.batch[i]}
    return _Epilogue(program, backend).kernel(library, operands, scalars)


class _Epilogue:
    def __init__(self, program: LoopProgram, backend: str) -> None:
        self.program, self.backend = program, backend
        context = codegen_context(program)
        self.ctype, self.sig, self.buffers = context.ctype, context.sig, context.buffers
        first = program.nests[0]
        self.raw = first.statement.write.tensor  # the library writes the first nest's sum here
        self.total = first.parallel_iterations
        self.width = first.parallel[-1].extent if first.parallel else 1  # elements of a row of the loop

    def kernel(self, library: str, operands: tuple[str, str], scalars: dict[str, int]) -> Kernel:
        args = {a.name: a for a in self.sig.args}
        buffers = [args[self.sig.names[b]] for b in (*operands, self.raw)]
        vendor = Launch(library, (*buffers, *(Scalar(k, v, "int64") for k, v in scalars.items())), library=library)
        nests = self.program.nests
        done = nests[0].statement.epilogue is None and len(nests) == 1
        if self.buffers[self.raw].kind not in (BufferKind.OUTPUT, BufferKind.TEMP):
            raise ScheduleError("vendor: the first nest writes neither an output nor a temporary")
        body = [] if done else self.body()
        if self.backend == "cpu":
            return self.c_kernel(vendor, body)
        return self.cuda_kernel(vendor, body)

    def body(self) -> list[str]:
        """Statements for element ``e`` (row ``row``, column ``col`` of rows of :attr:`width`): the raw value, the
        first nest's epilogue, every later nest; outputs stored, temporaries kept in locals."""
        p = EpiloguePrinter(self.buffers, self.sig.names, self.ctype, *self.halves())
        lines = [f"const {self.ctype} acc = {self.sig.names[self.raw]}[e];"]
        for k, nest in enumerate(self.program.nests):
            st = nest.statement
            env = self.coordinates(nest, k, lines)
            ext = extents(nest)
            if k == 0:
                value = "acc" if st.epilogue is None else p.expr(st.epilogue, env, ext, "acc")
            else:
                value = p.expr(st.body, env, ext)
            lines.append(f"const {self.ctype} v{k} = {value};")
            if self.buffers[st.write.tensor].kind == BufferKind.OUTPUT and not (k == 0 and st.epilogue is None):
                lines.append(p.store(st.write, env, ext, f"v{k}"))
            p.local[st.write.tensor] = f"v{k}"
        return lines

    def halves(self) -> tuple[str, str]:
        return ("(float)({0})", "(HALF)({0})") if self.backend == "cpu" else ("k_h2f({0})", "k_f2h((float)({0}))")

    def coordinates(self, nest: LoopNest, k: int, lines: list[str]) -> dict[str, str]:
        """Each parallel dim of ``nest`` at element ``e`` (row-major over the nest's own dims), as locals."""
        dims = list(nest.parallel)
        env: dict[str, str] = {}
        inner = 1
        for i, d in reversed(list(enumerate(dims))):
            if i == len(dims) - 1 and d.extent == self.width:
                env[d.name] = "col"
            elif inner % self.width == 0 and inner >= self.width:
                env[d.name] = f"k{k}_{i}"
                lines.append(f"const idx_t k{k}_{i} = row / {inner // self.width} % {d.extent};")
            else:
                env[d.name] = f"k{k}_{i}"
                lines.append(f"const idx_t k{k}_{i} = e / {inner} % {d.extent};")
            inner *= d.extent
        return env

    def params(self) -> list[str]:
        out = []
        for arg in self.sig.args:
            name = next(n for n, a in self.sig.names.items() if a == arg.name)
            ctype = self.ctype if arg.kind == "scratch" else STORAGE_C[self.buffers[name].dtype]
            out.append(f"{'const ' if arg.kind == 'input' else ''}{ctype}* restrict {arg.name}")
        return out

    def c_kernel(self, vendor: Launch, body: list[str]) -> Kernel:
        head = ["#include <math.h>", "#define HALF _Float16", prelude(self.ctype, "static inline")]
        for name in self.sig.consts:
            values = ", ".join(literal(v, self.ctype) for v in self.buffers[name].value or ())
            head.append(f"static const {self.ctype} {self.sig.names[name]}[{self.buffers[name].numel}] = {{{values}}};")
        if not body:
            return Kernel("cpu", "\n".join(head) + "\n", (vendor,))
        rows = self.total // self.width
        inner = "\n".join("      " + line for line in body)
        code = (f"void {ENTRY}({', '.join(self.params())}) {{\n"
                f"  #pragma omp parallel for schedule(static)\n"
                f"  for (idx_t row = 0; row < {rows}; row++) {{\n"
                f"    #pragma omp simd\n"
                f"    for (idx_t col = 0; col < {self.width}; col++) {{\n"
                f"      const idx_t e = row * {self.width} + col;\n{inner}\n    }}\n  }}\n}}\n")
        return Kernel("cpu", "\n".join(head) + "\n" + code, (vendor, Launch(ENTRY, self.sig.args)))

    def cuda_kernel(self, vendor: Launch, body: list[str]) -> Kernel:
        head = [CUDA_HEAD, prelude(self.ctype, "__device__ static inline"),
                *cuda_consts(self.sig, self.buffers, self.ctype)]
        if not body:
            return Kernel("cuda", "\n".join(head) + "\n", (vendor,))
        inner = "\n".join("  " + line for line in body)
        code = (f'extern "C" __global__ void __launch_bounds__({THREADS}) '
                f"{ENTRY}({cuda_params(self.sig, self.buffers, self.ctype)}) {{\n"
                f"  const idx_t e = (idx_t)blockIdx.x * {THREADS} + threadIdx.x;\n"
                f"  if (e >= {self.total}) return;\n"
                f"  const idx_t row = e / {self.width}, col = e % {self.width};\n{inner}\n}}\n")
        blocks = math.ceil(self.total / THREADS)
        return Kernel("cuda", "\n".join(head) + "\n" + code,
                      (vendor, Launch(ENTRY, self.sig.args, (blocks, 1, 1), (THREADS, 1, 1))))

