"""Where a contraction's time goes on a CUDA GPU: each launch of a gemm recipe alone and all of them together,
validated, next to PyTorch's mm, addmm, addmm + gelu and gelu alone, for the matmul+bias+gelu cases of
``gpu_transforms.py``. Timed like every candidate (the worker's CUDA-graph replay over buffer copies past L2).

    python3 -m bench.gemm_probe --out DIR [--recipes "gemm(cublas);gemm(cublaslt,0)"] [--repeats 20]
        [--cases 8x512x1000:float32,256x1024x1024:float32] [--split-k]

``--split-k`` also runs each ``mma`` / ``simt`` recipe under every split-K its case allows.

Writes ``gemm_probe.md`` and ``gemm_probe.json`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_transforms import Case, matmul_bias_gelu
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.contraction import LT_ALGOS, SPLIT_K, match_contraction
from transforms.eager_cuda import graph_replay_seconds
from transforms.recipe import Recipe, Step, parse
from transforms.run import Launch, Problem, to_float
from transforms.transformation import apply_recipe
from transforms.tune import make_task
from transforms.worker import CudaBackend, check, host_arrays

CASES = [(2048, 1024, 1024, "float16"), (4096, 768, 3072, "float16"), (2048, 1000, 1000, "float16"),
         (4096, 768, 3072, "bfloat16")]
RECIPES = ["gemm(cublas)", *(f"gemm(cublaslt,{r})" for r in range(LT_ALGOS)), "gemm(mma,128,128,32,4,3,8)",
           "gemm(mma,128,256,64,8,3,8)"]


def timed(artifact: str, launches: list[Launch], inputs: dict[str, np.ndarray], repeats: int,
          reference: dict[str, np.ndarray] | None = None, tolerance: dict[str, float] | None = None) -> dict[str, Any]:
    """Median seconds of ``launches`` (and, given a reference, the max relative error of their outputs)."""
    backend = CudaBackend()
    try:
        arrays = host_arrays(launches, inputs)
        call, fetch = backend.bind(artifact, launches, arrays)
        call()
        out: dict[str, Any] = {}
        if reference is not None and tolerance is not None:
            outputs = fetch()
            for b in (b for launch in launches for b in launch.buffers if b.kind == "output"):
                output = backend.cupy.asnumpy(outputs[b.name])
                kind, error, text = check(to_float(output, b.dtype), reference[b.name], tolerance[b.name])
                out["error"], out["wrong"] = error, text if kind else ""
        out["s"] = float(np.median(backend.time(call, 2, repeats, 0.0)))
        return out
    except Exception as e:  # a rank the heuristic does not offer, a launch failure: a row, not the end
        return {"failed": f"{type(e).__name__}: {e}"[:200]}


def timed_with_parts(artifact: str, launches: list[Launch], problem: Problem, repeats: int) -> dict[str, Any]:
    """:func:`timed` against the problem's reference and, for several launches, each launch alone ("parts")."""
    inputs = dict(problem.inputs)
    row = timed(artifact, launches, inputs, repeats, dict(problem.reference), problem.tolerances(launches))
    if len(launches) > 1 and "failed" not in row:
        row["parts"] = [timed(artifact, [launch], inputs, repeats).get("s") for launch in launches]
    return row


def save(out: Path, stem: str, rows: list[dict[str, Any]], text: str) -> None:
    """Write ``rows`` to ``out/stem.json`` and the report ``text`` to ``out/stem.md``, and print the report."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{stem}.md").write_text(text)
    print(text)


def cells(row: dict[str, Any]) -> tuple[str, str]:
    """The markdown cells "parts (ms)" and "max rel err" of a timed row."""
    parts = ", ".join(f"{p * 1e3:.4f}" if p else "-" for p in row.get("parts", []))
    wrong = f" ({row['wrong'][:60]})" if row.get("wrong") else ""
    return parts, f"{row.get('error', 0):.2g}{wrong}"


def torch_rows(m: int, k: int, n: int, dtype: str, repeats: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((m, k)), "w": rng.standard_normal((k, n)) / k**0.5,
              "bias": rng.standard_normal(n), "y": rng.standard_normal((m, n))}
    dtypes = dict.fromkeys(inputs, getattr(torch, dtype))
    fns = {
        "torch mm": lambda t: t["x"] @ t["w"],
        "torch addmm": lambda t: torch.addmm(t["bias"], t["x"], t["w"]),
        "torch addmm+gelu": lambda t: F.gelu(torch.addmm(t["bias"], t["x"], t["w"])),
        "torch gelu [m,n]": lambda t: F.gelu(t["y"]),
    }
    return {name: graph_replay_seconds(fn, inputs, dtypes, repeats=repeats) for name, fn in fns.items()}


def with_splits(case: Case, recipes: list[str]) -> list[str]:
    """``recipes``, each generated-kernel one followed by itself under every split-K legal for ``case``."""
    program = make_task(case.graph).program
    contraction = match_contraction(program)
    assert contraction is not None
    out = []
    for text in recipes:
        out.append(text)
        config = apply_recipe(parse(text), program).gemm
        if config is not None and config.path in ("mma", "simt"):
            out += [str(Recipe((Step("gemm", replace(config, split=s).args),))) for s in SPLIT_K[1:]
                    if replace(config, split=s).legal(contraction)]
    return out


def probe(case: Case, recipes: list[str], repeats: int, cache: Path) -> list[dict[str, Any]]:
    task = make_task(case.graph)
    problem = task.problem
    kernels = {r: generate(apply_recipe(parse(r), task.program), "cuda") for r in recipes}
    built = dict(zip(recipes, build([Source(k.code, "cuda") for k in kernels.values()], cache_dir=cache), strict=True))
    rows = []
    for recipe, kernel in kernels.items():
        if not built[recipe].ok:
            rows.append({"recipe": recipe, "failed": built[recipe].error[:200]})
            continue
        rows.append({"recipe": recipe, **timed_with_parts(built[recipe].artifact, list(kernel.launches), problem,
                                                          repeats)})
    return rows


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| case | what | ms | parts (ms) | max rel err |", "|---|---|---|---|---|"]
    for r in results:
        for name, s in r["torch"].items():
            lines.append(f"| {r['case']} | {name} | {s * 1e3:.4f} | | |")
        for row in r["rows"]:
            if "failed" in row:
                lines.append(f"| {r['case']} | `{row['recipe']}` | failed: {row['failed'][:90]} | | |")
                continue
            parts, error = cells(row)
            lines.append(f"| {r['case']} | `{row['recipe']}` | {row['s'] * 1e3:.4f} | {parts} | {error} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipes", default=";".join(RECIPES), help="gemm steps separated by ';'")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cases", help="MxKxN:dtype,... (default: the matmul+bias+gelu cases of gpu_transforms)")
    parser.add_argument("--split-k", action="store_true", help="also each mma/simt recipe under every legal split-K")
    args = parser.parse_args()
    recipes = [r for r in args.recipes.split(";") if r]
    cases = CASES if not args.cases else [(*map(int, size.split("x")), dtype) for size, dtype in
                                          (c.split(":") for c in args.cases.split(","))]
    results = []
    cache = Path(tempfile.mkdtemp())
    for m, k, n, dtype in cases:
        case = matmul_bias_gelu(m, k, n, dtype)
        tried = with_splits(case, recipes) if args.split_k else recipes
        result = {"case": f"{m}x{k}x{n} {dtype}", "torch": torch_rows(m, k, n, dtype, args.repeats),
                  "rows": probe(case, tried, args.repeats, cache)}
        print(json.dumps(result), flush=True)
        results.append(result)
    save(args.out, "gemm_probe", results, markdown(results))


if __name__ == "__main__":
    main()
