"""Experiment (not a recipe): the 768-wide norms with one row per block of L lanes, forced through a patched
``plan_rows``, against the default plan (a warp per row, 8 rows per 256-thread block, one wave of blocks).

    python bench/row_lanes_probe.py    # on the GPU machine, set up as in README.md; ~15 s

Question: does a multi-wave launch (8192 blocks, so loads and stores of different rows overlap) beat the
default's single wave? Output: ``results/row_lanes_probe_h200.txt``. Lane counts that are not a power-of-two
number of warps (96, 192, 384) are offered by no recipe; the block reduction gives wrong results for them, which
validation reports here.
"""

import dataclasses
import hashlib
import tempfile
from pathlib import Path

import transforms.codegen.cuda as cuda_gen
from bench.gpu_transforms import cases
from transforms.codegen import cuda_rows
from transforms.recipe import parse
from transforms.run import Worker
from transforms.tune import evaluator, kernels, make_task

RECIPE = parse("fuse(all);reduce(block);row_depth(0);row_mode(registers);rows_per_block(1);threads(256);unroll(4);"
               "vectorize(8)")
PLANS = [(0, 8), (96, 8), (128, 8), (192, 4), (256, 4), (64, 8), (384, 2)]  # (lanes, vector); 0: the default
COPY_BYTES_PER_S = 4.22e12  # H200 copy bandwidth measured by gpu_transforms.py
forced: dict[str, int] = {}


def forced_plan(schedule, group, default_threads):  # noqa: ANN001, ANN201
    plan = cuda_rows.plan_rows(schedule, group, default_threads)
    if plan is None or not forced:
        return plan
    lanes, v = forced["lanes"], forced["v"]
    chunks = -(-plan.n // (lanes * v))
    registers = chunks * v <= cuda_rows.MAX_REGISTER_ELEMS
    return dataclasses.replace(plan, lanes=lanes, per_block=1, vector=v, chunks=chunks, registers=registers,
                               pairs={}, kept=cuda_rows.kept_buffers(plan.group, registers))


def main() -> None:
    cuda_gen.plan_rows = forced_plan
    with Worker() as worker:
        for case in (c for c in cases(False) if c.size == "8192x768"):
            task = make_task(case.graph)
            evaluate = evaluator(task, backend="cuda", cache_dir=Path(tempfile.mkdtemp()), worker=worker, repeats=20)
            for lanes, v in PLANS:
                forced.clear()
                forced.update({"lanes": lanes, "v": v} if lanes else {})
                (kernel,) = kernels(task.program, [RECIPE], "cuda")
                (result,) = evaluate([RECIPE])
                launch = kernel.launches[0]
                ratio = result.median_s * COPY_BYTES_PER_S / case.bytes
                timing = (f"median_us={result.median_s * 1e6:.2f} ratio={ratio:.3f}" if result.ok
                          else f"failed: {result.error}")
                print(f"{case.family} {case.size} lanes={lanes or 'default'} v={v} block={launch.block} "
                      f"grid={launch.grid} {timing} src={hashlib.sha256(kernel.code.encode()).hexdigest()[:12]}",
                      flush=True)


if __name__ == "__main__":
    main()
