"""Code generation from a ``Schedule``: ``generate(schedule, backend)`` -> :class:`Kernel` (source + launches).

``c`` writes C with OpenMP for the cpu backend, ``cuda`` writes CUDA C++; both print expressions with
``expr`` and take their arguments in the order fixed by ``signature``.
"""

from transforms.codegen.kernel import Kernel
from transforms.schedule import Schedule

BACKENDS = ("cpu", "cuda")
#: The generation of tunebank's kernels, part of the toolchain every measurement is keyed by
#: (``service.devices.toolchain``). Bump it when a recipe generates a different kernel than it did: a measurement of
#: the old kernel then stops being a hit (it is measured again), while neighbours' recipes still transfer.
#: 2: a row reduction's views are folded into its store (``transforms.views.kernel_program``).
#: 3: a row kernel's lane owns at most one 16-byte word per chunk (``transforms.codegen.cuda_rows``).
#: 4: a reduction over two inner dims is one over their product where that makes it rows (``kernel_program``).
CODEGEN_VERSION = 4


def generate(schedule: Schedule, backend: str = "cpu") -> Kernel:
    """The kernel source and launches of ``schedule`` for ``backend``."""
    if schedule.vendor:  # a vendor library call, then the generated epilogue: transforms.codegen.vendor
        from transforms.codegen.vendor import generate_vendor

        return generate_vendor(schedule, backend)
    if backend == "cpu":
        from transforms.codegen.c import generate_c

        return generate_c(schedule)
    if backend == "cuda":
        from transforms.codegen.cuda import generate_cuda

        return generate_cuda(schedule)
    raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "CODEGEN_VERSION", "Kernel", "generate"]
