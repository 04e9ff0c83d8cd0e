"""Markdown of ``bench.gpu_table`` results: a dense table, a sparse table and their geomeans."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SPMM_LIBRARIES = ("torch.sparse", "cupyx csr@dense", "cusparse spmm (col-major B)")
WRONG = 1e-3  # a library result further than this from the float64 reference (max abs error / max |ref|)


def seconds(row: Mapping[str, Any] | None) -> float:
    """The time of a measured row; NaN for a failed one or one whose result was wrong."""
    row = row or {}
    value = row.get("s")
    if not isinstance(value, float) or not math.isfinite(value) or row.get("rel_err", 0.0) > WRONG:
        return math.nan
    return value


def _ms(s: float) -> str:
    return f"{s * 1e3:.4f}" if math.isfinite(s) else "-"


def _cell(row: Mapping[str, Any] | None, bound: float) -> str:
    """``ms (x bound)``; a dagger where plain calls were timed (no CUDA graph); the error's start on failure."""
    if row and "error" in row:
        return f"failed: {str(row['error'])[:60]}"
    if row and row.get("rel_err", 0.0) > WRONG:
        return f"wrong result (rel err {row['rel_err']:.2g}; {_ms(row['s'])})"
    s = seconds(row)
    if not math.isfinite(s):
        return "-"
    dagger = "" if (row or {}).get("captured", True) else " †"
    return f"{_ms(s)} ({s / bound:.2f}){dagger}"


def _tuned(row: Mapping[str, Any]) -> float:
    best = row["tunebank"]["best_s"]
    return best if isinstance(best, float) and math.isfinite(best) else math.nan


def _best_library(row: Mapping[str, Any]) -> float:
    times = [s for s in (seconds(row.get(k)) for k in SPMM_LIBRARIES) if math.isfinite(s)]
    return min(times, default=math.nan)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if math.isfinite(a) and math.isfinite(b) and b > 0 else "-"


def geomean(values: Sequence[float]) -> float:
    ok = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in ok) / len(ok)) if ok else math.nan


def _over(rows: Sequence[Mapping[str, Any]], baseline: Callable[[Mapping[str, Any]], float]) -> str:
    """Geomean of baseline time / tunebank time over the rows where both are valid, and over how many."""
    ratios = [r for r in (baseline(row) / _tuned(row) for row in rows) if math.isfinite(r)]
    return f"{geomean(ratios):.2f}x ({len(ratios)} of {len(rows)})" if ratios else f"- (0 of {len(rows)})"


def _search(t: Mapping[str, Any]) -> str:
    how = f"seeded {t['seeds']}+local" if t["strategy"] == "seeded" else t["strategy"]
    return f"{how}, {t['evaluated']} cands, {t['failed']} failed, {t['search_s']:.1f} s"


def _transfer(row: Mapping[str, Any], bound: float, tuned: float) -> str:
    t = row.get("transfer") or {}
    if "error" in t:
        return str(t["error"])[:60]
    s = seconds(t)
    both = row.get("head_to_head") or {}
    side = (f"; side by side {_ratio(both['tuned_s'], both['transfer_s'])}{', same recipe' * both['same_recipe']}"
            if "tuned_s" in both else "")
    return f"{_ms(s)} ({s / bound:.2f}); {t['wall_s']:.1f} s; {_ratio(tuned, s)} of tuned{side}"


def dense_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| family | size | bound | eager | compile default | compile max-autotune | tunebank tuned | "
        "max-autotune / tunebank | compile s (default, max-autotune) | tunebank search | transfer from db "
        "(ms (x bound); wall; tuned/transfer, and timed side by side) | tunebank best recipe |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['size']} | failed: {str(r['error'])[:100]} |||||||||")
            continue
        bound, tuned = r["bound_s"], _tuned(r)
        default, autotune = r.get("compile default"), r.get("compile max-autotune")
        compile_s = ", ".join(f"{c['compile_s']:.1f}" if c and "compile_s" in c else "-" for c in (default, autotune))
        t = r["tunebank"]
        lines.append(
            f"| {r['family']} | {r['size']} | {_ms(bound)} | {_cell(r['eager'], bound)} | {_cell(default, bound)} | "
            f"{_cell(autotune, bound)} | {_ms(tuned)} ({tuned / bound:.2f}) | {_ratio(seconds(autotune), tuned)} | "
            f"{compile_s} | {_search(t)} | {_transfer(r, bound, tuned)} | `{t['best_recipe']}` |"
        )
    return lines


def spmm_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| graph | n | nnz | degree mean / max / cv | bound | eager | " + " | ".join(SPMM_LIBRARIES)
        + " | tunebank default | tunebank tuned | cupyx / tunebank | best library / tunebank | tunebank search | "
        "tunebank best recipe |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['size']} | failed: {str(r['error'])[:100]} ||||||||||||||")
            continue
        bound, tuned, t = r["bound_s"], _tuned(r), r["tunebank"]
        best_library = _best_library(r)
        libraries = " | ".join(_cell(r.get(k), bound) for k in SPMM_LIBRARIES)
        lines.append(
            f"| {r['size']} | {r['n']} | {r['nnz']} | {r['deg_mean']:.1f} / {r['deg_max']} / {r['deg_cv']:.2f} | "
            f"{_ms(bound)} | {_cell(r['eager'], bound)} | {libraries} | {_ms(t['default_s'])} | "
            f"{_ms(tuned)} ({tuned / bound:.2f}) | {_ratio(seconds(r.get('cupyx csr@dense')), tuned)} | "
            f"{_ratio(best_library, tuned)} | {_search(t)} | `{t['best_recipe']}` |"
        )
    return lines


def targets(dense: Sequence[Mapping[str, Any]], l2_bytes: float) -> list[str]:
    """Issue #6's dense criteria: memory-bound cases moving more than L2 (geomean over the bound, slowest against
    max-autotune); transfer within 5% of tuned (timed side by side) and under 1 s."""
    big = [r for r in dense if not r.get("flops") and r["bytes"] > l2_bytes]
    vs_autotune = [(seconds(r.get("compile max-autotune")) / _tuned(r), f"{r['family']} {r['size']}") for r in big]
    worst = min((v for v in vs_autotune if math.isfinite(v[0])), default=(math.nan, "-"))
    sides = [r["head_to_head"] for r in dense if "tuned_s" in (r.get("head_to_head") or {})]
    close = sum(s["tuned_s"] / s["transfer_s"] >= 0.95 for s in sides)
    walls = [r["transfer"]["wall_s"] for r in dense if "wall_s" in (r.get("transfer") or {})]
    return [f"Memory-bound cases moving more than L2 ({len(big)}): tuned / bound geomean "
            f"{geomean([_tuned(r) / r['bound_s'] for r in big]):.3f}; slowest against max-autotune {worst[0]:.2f} "
            f"({worst[1]}). Transfer: within 5% of tuned (side by side) in {close} of {len(sides)} cases; wall time "
            f"under 1 s in {sum(w < 1 for w in walls)} of {len(walls)}."]


def summary(dense: Sequence[Mapping[str, Any]], sparse: Sequence[Mapping[str, Any]], l2_bytes: float) -> list[str]:
    lines = []
    if dense:
        over_autotune = geomean([seconds(r.get("compile max-autotune")) / _tuned(r) for r in dense])
        over_eager = geomean([seconds(r["eager"]) / _tuned(r) for r in dense])
        totals = {m: sum((r.get(f"compile {m}") or {}).get("compile_s", 0.0) for r in dense)
                  for m in ("default", "max-autotune")}
        lines += [f"Dense, {len(dense)} cases: tunebank tuned is {over_eager:.2f}x eager and {over_autotune:.2f}x "
                  f"torch.compile max-autotune (geomean of time ratios; >1: tunebank faster). Cold compile time in "
                  f"total: default {totals['default']:.1f} s, max-autotune {totals['max-autotune']:.1f} s.",
                  "", *targets(dense, l2_bytes)]
    if sparse:
        def library(name: str) -> Callable[[Mapping[str, Any]], float]:
            return lambda row: seconds(row.get(name))

        lines += ["", f"SpMM: tunebank tuned over torch.sparse (cuSPARSE SpMM on row-major B) "
                  f"{_over(sparse, library('torch.sparse'))}, over cupyx csr@dense "
                  f"{_over(sparse, library('cupyx csr@dense'))}, over the cuSPARSE SpMM call alone (column-major B) "
                  f"{_over(sparse, library('cusparse spmm (col-major B)'))}, over the fastest correct library per "
                  f"graph {_over(sparse, _best_library)} (geomeans over the graphs where both results were correct; "
                  ">1: tunebank faster)."]
    return lines


def markdown(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    dense = [r for r in rows if r["family"] != "gcn-spmm"]
    sparse = [r for r in rows if r["family"] == "gcn-spmm"]
    ok = [r for r in dense if "error" not in r], [r for r in sparse if "error" not in r]
    lines = [
        "# tunebank against eager, torch.compile and cuSPARSE",
        "",
        f"Device: {meta['device']} (L2 {meta['l2_mb']:.0f} MB), {meta['date']}; torch {meta['torch']}, triton "
        f"{meta['triton']}, cupy {meta['cupy']}. Copy bandwidth {meta['copy_tbps']:.2f} TB/s (read + write), cuBLAS "
        f"fp16 matmul {meta['matmul_tflops']:.0f} TFLOP/s; bound = minimum bytes / copy bandwidth, or FLOPs / matmul "
        "rate. Times in ms (in brackets: over the bound), medians of CUDA-graph replays over input copies that "
        "together exceed 2x L2; † = not capturable, plain calls timed. torch.compile: cold caches, no CUDA graphs "
        f"of its own; Inductor's process start-up ({meta['inductor_startup_s']:.1f} s) is not in the compile times. "
        f"Arguments: `{' '.join(f'{k}={v}' for k, v in meta['args'].items())}`.",
        "",
        *summary(*ok, meta["l2_mb"] * 1e6),
    ]
    if dense:
        lines += ["", "## Dense families", "", *dense_table(dense)]
    if sparse:
        lines += ["", "## SpMM (CSR x dense fp32, int32 indices; same CSR and features for every method)", "",
                  *spmm_table(sparse)]
    return "\n".join(lines) + "\n"
