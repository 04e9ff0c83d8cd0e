"""Experiment: do NVRTC compiles of candidate kernels overlap when ``transforms.build.build`` runs them on threads?

For each fp16/bf16 matmul+bias+gelu case of the GPU table, generates the sources of 2 x ``--kernels`` random
``gemm(mma, ...)`` recipes and compiles half of them with one thread and the other half with one thread per kernel
(the order alternates between cases), each into an empty cache. Every source is compiled once: a second compile of
the same source in the same process took ~20 ms instead of ~700 ms on an H200 machine (NVRTC 13.0), so repeats
would not measure compiling.

    python3 -m bench.compile_probe --out DIR [--kernels 8]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.gpu_transforms import matmul_bias_gelu
from transforms.build import Source, build
from transforms.compilers import cuda
from transforms.search.random_search import RandomSearch
from transforms.space import RecipeSpace
from transforms.tune import kernels, make_task

CASES = [(2048, 1024, 1024, "float16"), (4096, 768, 3072, "float16"), (2048, 1000, 1000, "float16"),
         (4096, 768, 3072, "bfloat16")]


def mma_sources(case: tuple[int, int, int, str], n: int) -> list[str]:
    task = make_task(matmul_bias_gelu(*case).graph)
    space = RecipeSpace(task.program, "cuda")
    picks = [r for r in RandomSearch(space, budget=4 * n, seed=1).ask(4 * n) if "gemm(mma" in str(r)][:n]
    return [k.code for k in kernels(task.program, picks, "cuda") if not isinstance(k, str)]


def timed_build(codes: list[str], jobs: int) -> float:
    arch = cuda.device_arch()
    with tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        results = build([Source(c, "cuda", arch=arch) for c in codes], cache_dir=Path(cache), jobs=jobs)
        elapsed = time.perf_counter() - started
    assert all(r.ok for r in results), [r.error[:200] for r in results if not r.ok]
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--kernels", type=int, default=8)
    args = p.parse_args()
    rows = []
    for i, case in enumerate(CASES):
        codes = mma_sources(case, 2 * args.kernels)
        n = len(codes) // 2
        order = [1, n] if i % 2 == 0 else [n, 1]
        row = {"case": "x".join(map(str, case[:3])) + " " + case[3], "kernels": n}
        for half, jobs in enumerate(order):
            row[f"jobs{jobs}_s"] = timed_build(codes[half * n:(half + 1) * n], jobs)
        rows.append(row)
        print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "arch": cuda.device_arch(), "toolchain": cuda.toolchain_id("nvrtc"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (args.out / "compile_probe.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
