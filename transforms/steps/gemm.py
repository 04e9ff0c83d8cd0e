"""``gemm(mma|simt,tile_m,tile_n,tile_k,warps,stages,swizzle[,split])``, ``gemm(cublaslt,algo[,batched])``,
``gemm(cublas[,batched])`` (cuda), ``gemm(blas)`` (cpu): run a contraction (a matmul with a pointwise epilogue,
``transforms.contraction``) as one GEMM kernel with the epilogue fused: ``mma`` (tensor cores, fp16/bf16) or ``simt``
(CUDA cores, fp32/fp64), or under split-K (``split`` > 1) as that kernel over parts of k, then one that adds the parts
and applies the epilogue; or as a vendor GEMM then an epilogue kernel: ``cublaslt`` (the cuBLASLt heuristic's
algorithm of rank ``algo``, taking the bias and relu or tanh-gelu itself) or ``cublas`` (cuBLAS's default), stacked
batches as one product of all their rows unless ``batched`` (``transforms.contraction.Contraction.stacked_rows``).
On cpu, ``gemm(blas)`` runs the product with PyTorch's BLAS (MKL / OpenBLAS), then the epilogue as one generated kernel
(``transforms.codegen.vendor``): a whole recipe beside the generated loops' space (``transforms.space``), float32 /
float64 only. See :class:`~transforms.contraction.GemmConfig` for the parameters."""

from embed.loopnest import LoopProgram
from transforms.contraction import (
    BATCHED,
    LT_ALGOS,
    PATHS,
    SPLIT_K,
    VENDOR_PATHS,
    GemmConfig,
    blas_contraction,
    gemm_configs,
    match_contraction,
)
from transforms.recipe import Step
from transforms.schedule import Schedule, ScheduleError
from transforms.transformation import Transformation, expect_ident, expect_int


class Gemm(Transformation):
    name = "gemm"
    exclusive = True

    def choices(self, program: LoopProgram, backend: str) -> list[list[Step]]:
        contraction = match_contraction(program) if backend == "cuda" else None
        if contraction is None:
            return []
        return [[Step("gemm", config.args) for config in gemm_configs(contraction)]]

    def vendor_ranked(self, program: LoopProgram, backend: str) -> list[Step]:
        """cuBLASLt's algorithms in its heuristic's order, then cuBLAS. Not yet the cpu ``gemm(blas)``: offered, it
        would be a fill candidate of every cpu contraction, which the recorded cpu transfer replay
        (tests/service/data/transfer_cpu_replay.json) has no measurement of; it joins when that recording is re-made."""
        if backend == "cpu":
            return []
        return [s for g in self.offered(program, backend) for s in g if s.args[0] in VENDOR_PATHS]

    def nearest(self, step: Step, program: LoopProgram, backend: str) -> Step | None:
        if backend == "cpu":
            return BLAS if step == BLAS and blas_contraction(program) else None
        return super().nearest(step, program, backend)

    def apply(self, schedule: Schedule, step: Step) -> Schedule:
        if step == BLAS:
            if blas_contraction(schedule.program) is None:
                raise ScheduleError(f"step {step}: the program is not a float32 / float64 contraction")
            return schedule.set(vendor=("gemm", "blas"))
        path = expect_ident(step, 0, PATHS)
        if path in VENDOR_PATHS:
            known = 1 if path == "cublas" else 2  # cublaslt: the algorithm's heuristic rank
            batched = len(step.args) == known + 1 and expect_ident(step, known, (BATCHED,)) == BATCHED
            if len(step.args) != known + batched:
                raise ScheduleError(f"step {step}: gemm({path}) takes "
                                    f"{'the heuristic rank, then ' if known == 2 else ''}an optional {BATCHED}")
            algo = expect_int(step, 1, range(LT_ALGOS)) if known == 2 else 0
            config = GemmConfig(path, algo=algo, batched=batched)
        else:
            if len(step.args) not in (7, 8):
                raise ScheduleError(f"step {step}: gemm({path}) takes tile_m, tile_n, tile_k, warps, stages, swizzle"
                                    " and optionally split")
            tm, tn, tk, warps, stages, swizzle = (expect_int(step, i) for i in range(1, 7))
            split = expect_int(step, 7, SPLIT_K[1:]) if len(step.args) == 8 else 1
            config = GemmConfig(path, tm, tn, tk, warps, stages, swizzle, split=split)
        contraction = match_contraction(schedule.program)
        if contraction is None or not config.legal(contraction):
            raise ScheduleError(f"step {step}: not a legal gemm configuration for this program")
        return schedule.set(gemm=config)


BLAS = Step("gemm", ("blas",))
STEP = Gemm()
