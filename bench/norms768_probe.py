"""Experiment: the 768-wide norms (issue #6) under ``persist(B)``, launch shapes and source rewrites (cache hints,
launch bounds), against Inductor max-autotune.

    python bench/norms768_probe.py --out DIR            # time recipes and torch.compile; ~1-2 min
    ncu ... python bench/norms768_probe.py --ncu        # launch each kernel once inside the NVTX range "profile"

Times are medians of CUDA-graph replays over inputs rotated past L2 (the tuner's evaluator, 20 repeats); ratio =
time / (minimum bytes / 4.22 TB/s, the H200 copy bandwidth measured by gpu_transforms.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import transforms.tune
from bench.gpu_transforms import Case, add_layernorm, layernorm, rmsnorm, softmax
from transforms.codegen.kernel import Kernel
from transforms.problem import quantized_inputs
from transforms.recipe import parse
from transforms.run import Worker
from transforms.space import default_recipe
from transforms.tune import evaluator, make_task

COPY_BYTES_PER_S = 4.22e12
original_kernels = transforms.tune.kernels
NARROW = [layernorm(8192, 768), rmsnorm(8192, 768), add_layernorm(8192, 768)]
WIDE = [softmax(65536, 128), softmax(8192, 4096), layernorm(8192, 4096)]
SHAPES = [(256, 0, 1), (256, 2, 1), (256, 4, 1), (128, 8, 1), (128, 0, 2), (128, 2, 2), (128, 4, 2),
          (256, 0, 4), (256, 2, 4)]  # (threads, persist, rows_per_block); (128, 0, 2): Inductor's layout for 768
WIDE_SHAPES = [(256, 0, 1), (256, 2, 1), (256, 4, 1), (256, 8, 1)]


STORE = re.compile(r"\*\(uint4\*\)(\(\(char\*\).*?\+ \d+\)) = (make_uint4\(.*\));")
LOAD = re.compile(r"\*\(const uint4\*\)(\(\(const char\*\)\(b0 .*?\) \+ \d+\));")
REWRITES: dict[str, Callable[[str], str]] = {  # variants of the generated source (experiment only)
    "bounds5": lambda code: code.replace("__launch_bounds__(256)", "__launch_bounds__(256, 5)"),
    "bounds6": lambda code: code.replace("__launch_bounds__(256)", "__launch_bounds__(256, 6)"),
    "stcs": lambda code: STORE.sub(r"__stcs((uint4*)\1, \2);", code),
    "stcs+ldcs": lambda code: LOAD.sub(r"__ldcs((const uint4*)\1);", STORE.sub(r"__stcs((uint4*)\1, \2);", code)),
}
rewrite: list[str] = []


def rewritten(program, recipes_, backend):  # noqa: ANN001, ANN201
    """``transforms.tune.kernels`` with the source rewrites named in ``rewrite`` applied."""
    out = original_kernels(program, recipes_, backend)
    for name in rewrite:
        out = [dataclasses.replace(k, code=REWRITES[name](k.code)) if isinstance(k, Kernel) else k for k in out]
    return out


def recipes(case: Case, shapes: list[tuple[int, int, int]]) -> list[tuple[str, str]]:
    """(label, recipe) of the default recipe with each (threads, persist, rows_per_block) in place of its own."""
    base = default_recipe(make_task(case.graph).program, "cuda")
    out = []
    for threads, persist, rows in shapes:
        steps = [s for s in str(base).split(";") if not s.startswith(("threads(", "persist(", "rows_per_block("))]
        out.append((f"threads={threads} persist={persist} rows_per_block={rows}",
                    ";".join([*steps, f"threads({threads})", f"persist({persist})", f"rows_per_block({rows})"])))
    return out


def inductor(case: Case) -> str:
    from bench.torch_baselines import compiled

    task = make_task(case.graph)
    result = compiled(case.graph, quantized_inputs(task.graph, task.program), "max-autotune", 20)
    return f"{result['s'] * 1e3:.4f}" if "s" in result else result.get("error", "?")


def timing(out: Path) -> None:
    lines = ["| case | variant | ms | ratio | ok |", "|---|---|---|---|---|"]
    with Worker() as worker:
        for cases, shapes in ((NARROW, SHAPES), (WIDE, WIDE_SHAPES)):
            for case in cases:
                task = make_task(case.graph)
                evaluate = evaluator(task, backend="cuda", cache_dir=Path(tempfile.mkdtemp()), worker=worker,
                                     repeats=20)
                bound = case.bytes / COPY_BYTES_PER_S
                labelled = recipes(case, shapes)
                for (label, _), result in zip(labelled, evaluate([parse(t) for _, t in labelled]), strict=True):
                    ms = f"{result.median_s * 1e3:.4f}" if result.ok else "-"
                    ratio = f"{result.median_s / bound:.2f}" if result.ok else "-"
                    lines.append(f"| {case.family} {case.size} | {label} | {ms} | {ratio} | "
                                 f"{'yes' if result.ok else result.error[:80]} |")
                    print(lines[-1], flush=True)
                if cases is NARROW:
                    base = parse(labelled[0][1])
                    for name in REWRITES:
                        rewrite[:] = [name]
                        (result,) = evaluate([base])
                        rewrite.clear()
                        ms = f"{result.median_s * 1e3:.4f}" if result.ok else "-"
                        ratio = f"{result.median_s / bound:.2f}" if result.ok else "-"
                        lines.append(f"| {case.family} {case.size} | default {name} | {ms} | {ratio} | "
                                     f"{'yes' if result.ok else result.error[:80]} |")
                        print(lines[-1], flush=True)
                lines.append(f"| {case.family} {case.size} | inductor max-autotune | {inductor(case)} | | |")
                print(lines[-1], flush=True)
    (out / "norms768_probe.md").write_text("\n".join(lines) + "\n")


def ncu_targets(labels: list[str]) -> None:
    """Launch each labelled kernel (``case@threads,persist,rows_per_block`` or ``case@inductor``) once, inside
    the NVTX range "profile"."""
    import torch

    from bench.torch_baselines import COMPILE_MODES, dtypes_of
    from embed.eager import run_eager
    from transforms.build import Source, build
    from transforms.tune import kernels
    from transforms.worker import CudaBackend, host_arrays

    backend = CudaBackend()
    by_name = {f"{c.family}:{c.size}": c for c in NARROW + WIDE}
    for label in labels:
        name, variant = label.split("@")
        case = by_name[name]
        task = make_task(case.graph)
        if variant == "inductor":
            fn = torch.compile(lambda t, g=case.graph: run_eager(g, t), mode=COMPILE_MODES["max-autotune"],
                               dynamic=False)
            inputs = quantized_inputs(task.graph, task.program)
            dtypes = dtypes_of(case.graph, inputs)
            tensors = {n: torch.as_tensor(v).to("cuda", dtypes[n]) for n, v in inputs.items()}
            fn(tensors)
            torch.cuda.synchronize()
            call = functools.partial(fn, tensors)
        else:
            threads, persist, rows = (int(x) for x in variant.split(","))
            (text,) = [t for _, t in recipes(case, [(threads, persist, rows)])]
            (kernel,) = kernels(task.program, [parse(text)], "cuda")
            (built,) = build([Source(kernel.code, "cuda")], cache_dir=Path(tempfile.mkdtemp()))
            call, _ = backend.bind(built.artifact, kernel.launches, host_arrays(kernel.launches, task.problem.inputs))
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print(f"NCU {label}", flush=True)
        torch.cuda.nvtx.range_push("profile")
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--ncu", nargs="*", help="FAMILY:SIZE@THREADS,PERSIST,ROWS_PER_BLOCK or FAMILY:SIZE@inductor")
    args = p.parse_args()
    transforms.tune.kernels = rewritten
    if args.ncu:
        ncu_targets(args.ncu)
    else:
        timing(args.out)


if __name__ == "__main__":
    main()
