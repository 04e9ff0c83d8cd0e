"""``conv(cudnn,benchmark|default)``, ``conv(torch)``: run a convolution (``transforms.convolution``) in a vendor
library through PyTorch, then its epilogue (bias, batch-norm, activation, residual) as one generated kernel
(``transforms.codegen.vendor``). ``cudnn`` (cuda) calls cuDNN itself, ``benchmark`` letting it time its algorithms
once per shape and keep the fastest, ``default`` taking its heuristic's choice (applied, never offered: PyTorch
keeps one cuDNN plan per shape and TF32 setting in a process, whichever mode made it first, so after a benchmark
search ``default`` runs the searched plan and measuring it times that plan again); ``torch`` (cpu: oneDNN; cuda:
what PyTorch's own dispatch picks, e.g. its depthwise kernel; applied on cuda, offered on cpu only) runs ``conv2d``.
They compute in float32 or float64, but ``conv(cudnn,benchmark,tf32)``, offered in place of
``conv(cudnn,benchmark)`` where eager PyTorch convolves in TF32 itself (``torch.backends.cudnn.allow_tf32``, on by
default), lets cuDNN round the operands to TF32 on the tensor cores as eager's own convolutions do; it is validated
at float16's tolerance (TF32 keeps float16's 10-bit mantissa) or at four times what the subgraph errs with the
convolution's operands rounded to TF32, whichever is more (``transforms.run.Problem.tolerances``,
``transforms.problem``). Each step is a whole recipe beside the generated direct convolution's space
(``transforms.space``): the library replaces the generated kernel and every knob of it."""

from embed.loopnest import LoopProgram
from transforms.convolution import match_convolution
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation

#: The steps each backend offers, in the order they are tried; on cuda cuDNN's benchmark search in the precision eager
#: convolves in (TF32 where ``torch.backends.cudnn.allow_tf32``, PyTorch's default), the other one not offered: over
#: 362 convolution subgraphs of the s15-s25 H200 rows the float32 search never beat eager by the 5% margin, and where
#: it was chosen the TF32 one ran within 1% of it (``bench/README.md``, twenty-fifth session), while a first search
#: JIT-compiles cuDNN's kernels (0.03-0.32 s a shape on a fresh machine). ``conv(torch)`` is not offered on cuda:
#: over 143 convolution subgraphs of the s20-s22 rows it never won (twenty-fourth session).
PATHS = {"cuda": (("cudnn", "benchmark"), ("cudnn", "benchmark", "tf32")), "cpu": (("torch",),)}
#: Every step that applies: those offered, and cuDNN's heuristic (module docstring), which plans and databases of
#: earlier versions hold.
KNOWN = (("cudnn", "benchmark"), ("torch",), ("cudnn", "benchmark", "tf32"), ("cudnn", "default"))
TF32 = "tf32"


def eager_convolves_in_tf32() -> bool:
    """Whether PyTorch, as this process has it set, lets cuDNN convolve float32 in TF32 (its default)."""
    import torch

    return bool(torch.backends.cudnn.allow_tf32)


class Conv(Transformation):
    name = "conv"

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        return []  # no dimension of the generated kernels' space: each step stands alone (vendor_ranked)

    def vendor_ranked(self, program: LoopProgram, backend: str) -> list[Step]:
        if backend not in PATHS or match_convolution(program) is None:
            return []
        tf32 = backend == "cuda" and eager_convolves_in_tf32()
        return [Step("conv", args) for args in PATHS[backend] if (TF32 in args) == tf32]

    def nearest(self, step: Step, program: LoopProgram, backend: str) -> Step | None:
        offered = self.vendor_ranked(program, backend)
        same = [s for s in offered if s.args[:1] == step.args[:1]]
        return step if step in offered else (same or offered or [None])[0]

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        if step.args not in KNOWN or step.kwargs:
            known = ", ".join(f"conv({','.join(args)})" for args in KNOWN)
            raise ScheduleError(f"step {step}: use one of {known}")
        if TF32 in step.args and not eager_convolves_in_tf32():
            raise ScheduleError(f"step {step}: PyTorch's cuDNN TF32 is off here (torch.backends.cudnn.allow_tf32)")
        return schedule.set(vendor=("conv", *(str(a) for a in step.args)))


STEP = Conv()
