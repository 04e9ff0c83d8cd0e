"""Experiment: where a memory-bound kernel's time goes. Each variant is a recipe (with steps added) whose generated
source is optionally rewritten (GELU made the identity, later kernels' loops fully unrolled), validated against the
reference and timed whole and launch by launch like every candidate (the worker's CUDA-graph replay over buffer
copies past L2). The committed results of earlier versions name their commits.

    python3 -m bench.kernel_probe --out DIR [--repeats 20]

A rewrite that changes the result (``gelu=identity``) is a floor, not a candidate: its row shows the error.
Writes ``kernel_probe.md`` and ``kernel_probe.json`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gemm_probe import cells, save, timed_with_parts
from bench.gpu_transforms import Case, bias_gelu, cross_entropy, layernorm, softmax
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.recipe import parse
from transforms.transformation import apply_recipe
from transforms.tune import make_task

COPY_BYTES_PER_S = 4.22e12  # H200 read + write copy bandwidth measured by gpu_transforms.py

def _in_kernels(code: str, old: str, new: str) -> str:
    at = code.index('extern "C"')
    return code[:at] + code[at:].replace(old, new)


def _full_unroll_after_first_kernel(code: str) -> str:
    at = code.index("tb_kernel1") if "tb_kernel1" in code else len(code)
    return code[:at] + re.sub(r"#pragma unroll \d+", "#pragma unroll", code[at:])


REWRITES: dict[str, Callable[[str], str]] = {
    "gelu=identity": lambda code: _in_kernels(_in_kernels(code, "k_fgelu(", "("), "k_gelu(", "("),
    "unroll=full-after-first": _full_unroll_after_first_kernel,
}

BIAS_GELU = "fuse(all);persist(0);row_depth(0);row_mode(registers);threads(128);unroll(4);vectorize(8)"
CE = ("fuse(all);reduce(block);inline(gather);persist(0);row_depth(0);row_mode(registers);rows_per_block(1);"
      "threads(256);unroll(4);vectorize(8)")
CE_WIDE = ("fuse(all);inline(gather);persist(0);reduce(block);row_depth(0);row_mode(registers);rows_per_block(1);"
           "threads(128);unroll(2);vectorize(8)")
LN = ("fuse(all);reduce(block);persist(0);row_depth(0);row_mode(registers);rows_per_block(1);threads(256);unroll(4);"
      "vectorize(8)")
SOFTMAX = ("fuse(all);reduce(block);persist(0);row_depth(0);row_mode(registers);rows_per_block(1);threads(512);"
           "unroll(4);vectorize(8)")
GELU_VARIANTS = [(), ("gelu=identity",), ("cache_hint(stream)",)]
PLAN: list[tuple[Case, str, list[tuple[str, ...]]]] = [
    (bias_gelu(8192, 3072), BIAS_GELU, GELU_VARIANTS),
    (bias_gelu(16384, 4096), BIAS_GELU, GELU_VARIANTS),
    (cross_entropy(8192, 4096), CE,
     [(), ("unroll=full-after-first",), ("cache_hint(stream)", "unroll=full-after-first")]),
    (cross_entropy(4096, 32000), CE_WIDE, [(), ("unroll=full-after-first",)]),
    (layernorm(8192, 4096), LN, [(), ("cache_hint(stream)",)]),
    (layernorm(8192, 768), LN, [(), ("cache_hint(stream)",)]),
    (softmax(2048, 32000), SOFTMAX, [(), ("cache_hint(stream)",)]),
]


def probe(case: Case, recipe: str, variants: list[tuple[str, ...]], repeats: int, cache: Path) -> list[dict[str, Any]]:
    """One row per variant (names of :data:`REWRITES` and recipe steps added to ``recipe``): median seconds whole
    and per launch, x bound, max relative error."""
    task = make_task(case.graph)
    bound = case.bytes / COPY_BYTES_PER_S
    rows = []
    for names in variants:
        steps = [n for n in names if n not in REWRITES]
        kernel = generate(apply_recipe(parse(";".join([recipe, *steps])), task.program), "cuda")
        code = kernel.code
        for name in names:
            code = REWRITES[name](code) if name in REWRITES else code
        rewritten = any(n in REWRITES for n in names)
        row: dict[str, Any] = {"case": f"{case.family} {case.size}", "recipe": recipe, "variant": "+".join(names)
                               or "generated", "changed": code != kernel.code or not rewritten}
        (built,) = build([Source(code, "cuda")], cache_dir=cache)
        if not built.ok:
            rows.append(row | {"failed": built.error[:300]})
            continue
        row |= timed_with_parts(built.artifact, list(kernel.launches), task.problem, repeats)
        if "s" in row:
            row["x_bound"] = row["s"] / bound
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | variant | ms | x bound | parts (ms) | max rel err |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['case']} | {r['variant']} | failed: {r['failed'][:100]} | | | |")
            continue
        parts, error = cells(r)
        unchanged = "" if r["changed"] else " (rewrite matched nothing)"
        lines.append(f"| {r['case']} | {r['variant']}{unchanged} | {r['s'] * 1e3:.4f} | {r['x_bound']:.2f} | "
                     f"{parts} | {error} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated family names (default: every case)")
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp())
    families = set(filter(None, args.only.split(",")))
    rows = [row for case, recipe, variants in PLAN if not families or case.family in families
            for row in probe(case, recipe, variants, args.repeats, cache)]
    save(args.out, "kernel_probe", rows, markdown(rows))


if __name__ == "__main__":
    main()
