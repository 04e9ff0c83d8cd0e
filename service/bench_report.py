"""Figures of a transfer benchmark run (``service.bench_transfer``): the method table, JSON and markdown reports.

Every figure is over the held-out subgraphs: the fraction of the optimum a method reaches (optimum time over the
method's time; geomean), its evaluations, the share of the recipe space they are, and its speedups over eager
PyTorch and the default recipe.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from service.bench_transfer import BenchConfig, HeldOut
from service.measure import Measurer


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return float(np.exp(np.mean(np.log(finite)))) if finite else math.nan


@dataclass(frozen=True)
class Row:
    """One method: geomean fraction of the optimum reached, evaluations (mean), share of the space evaluated
    (mean), geomean speedups over eager and over the default recipe."""

    method: str
    encoder: str
    k: int | None
    fraction_of_optimum: float
    evaluations: float
    space_fraction: float
    speedup_vs_eager: float
    speedup_vs_default: float


def _row(method: str, encoder: str, k: int | None, outcomes: Sequence[HeldOut], times: Sequence[float],
         evaluations: Sequence[float]) -> Row:
    return Row(
        method, encoder, k,
        geomean([o.optimum_s / t for o, t in zip(outcomes, times, strict=True)]),
        float(np.mean(evaluations)),
        float(np.mean([e / o.space_size for o, e in zip(outcomes, evaluations, strict=True)])),
        geomean([o.eager_s / t for o, t in zip(outcomes, times, strict=True)]),
        geomean([o.default_s / t for o, t in zip(outcomes, times, strict=True)]),
    )


def table(outcomes: Sequence[HeldOut], config: BenchConfig) -> list[Row]:
    rows = [
        _row("eager", "-", None, outcomes, [o.eager_s for o in outcomes], [0] * len(outcomes)),
        _row("default recipe", "-", None, outcomes, [o.default_s for o in outcomes], [1] * len(outcomes)),
        _row(f"{config.strategy} search", "-", config.budget, outcomes, [o.search_s for o in outcomes],
             [o.searched for o in outcomes]),
    ]
    for k in config.random_k:
        rows.append(_row("random", "-", k, outcomes, [o.random[k] for o in outcomes], [k + 1] * len(outcomes)))
    for name in config.encoders:
        for k in config.ks:
            rows.append(_row("transfer", name, k, outcomes, [o.transfer[name][k]["s"] for o in outcomes],
                             [o.transfer[name][k]["evaluations"] for o in outcomes]))
    return rows


def _clean(value: Any) -> Any:
    """``value`` with non-finite floats as None and mapping keys as strings (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def report_json(outcomes: Sequence[HeldOut], config: BenchConfig, measurer: Measurer,
                runs: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The whole run: config, device, ``runs`` (the calls that measured it), table, outcomes, measurements."""
    return _clean({
        "config": asdict(config),
        "device": asdict(measurer.table.device),
        "toolchain": measurer.table.toolchain,
        "kernels_run": measurer.evaluations,
        "runs": list(runs),
        "table": [asdict(r) for r in table(outcomes, config)],
        "held_out": [asdict(o) for o in outcomes],
        "measurements": measurer.table.to_json(),
    })


def _shown_k(ks: Sequence[int]) -> int:
    return 5 if 5 in ks else max(ks)


def _by_kind(outcomes: Sequence[HeldOut], config: BenchConfig) -> list[str]:
    k, rk = _shown_k(config.ks), _shown_k(config.random_k)
    lines = [f"Per kind (fraction of optimum, geomean; transfer k = {k}, random k = {rk}; evaluations of the first "
             "encoder, mean):", "",
             "| kind | subgraphs | space (median) | search covered whole space | default | random | search | "
             + " | ".join(config.encoders) + " | evaluations |",
             "|---|---|---|---|---|---|---|" + "---|" * len(config.encoders) + "---|"]
    for kind in sorted({o.kind for o in outcomes}):
        group = [o for o in outcomes if o.kind == kind]

        def fraction(times: Sequence[float], group: list[HeldOut] = group) -> str:
            return f"{geomean([o.optimum_s / t for o, t in zip(group, times, strict=True)]):.3f}"

        cells = [fraction([o.transfer[e][k]["s"] for o in group]) for e in config.encoders]
        evaluations = np.mean([o.transfer[config.encoders[0]][k]["evaluations"] for o in group])
        lines.append(f"| {kind} | {len(group)} | {np.median([o.space_size for o in group]):.0f} | "
                     f"{sum(o.searched >= o.space_size for o in group)} | {fraction([o.default_s for o in group])} | "
                     f"{fraction([o.random[rk] for o in group])} | {fraction([o.search_s for o in group])} | "
                     + " | ".join(cells) + f" | {evaluations:.1f} |")
    return lines


def report_markdown(outcomes: Sequence[HeldOut], config: BenchConfig, measurer: Measurer,
                    runs: Sequence[Mapping[str, Any]] = ()) -> str:
    device = measurer.table.device
    exact = sum(o.exact_match for o in outcomes)
    whole = sum(o.searched >= o.space_size for o in outcomes)
    lines = [
        "# Transfer tuning, leave-one-model-out",
        "",
        f"Device: {device.name} ({device.device_class}; {device.bandwidth_gbps:.1f} GB/s, "
        f"{device.peak_gflops:.0f} GFLOP/s measured). Backend {config.backend}; "
        f"toolchain `{measurer.table.toolchain.splitlines()[0]}`.",
        f"Models ({len(config.models)}): {', '.join(config.models)}.",
        f"Held-out subgraphs: {len(outcomes)} (over {len({o.model for o in outcomes})} folds; {exact} also occur in "
        "another model and are excluded from their own neighbours).",
        f"Optimum: fastest time measured on the subgraph by anything in the run, including a {config.strategy} "
        f"search of {config.budget} recipes (+ default), which covered the whole space of {whole} of the "
        f"{len(outcomes)}; {measurer.table.size} kernels measured ({measurer.evaluations} by this process). "
        f"Recipes per neighbour: {config.per_neighbour}"
        f"{'; variants, vendor-ranked and random recipes fill the places neighbours leave' if config.fill else ''}. "
        f"Local search after transfer: {config.local_budget} recipes.",
    ]
    if runs:
        lines.append("Measured in: " + "; ".join(
            f"({n}) {r['date']}, {r['kernels']} kernels, `{r['command']}`" for n, r in enumerate(runs, 1)) + ".")
    lines += [
        "",
        "| method | encoder | k | fraction of optimum (geomean) | evaluations (mean) | share of space | "
        "x eager (geomean) | x default (geomean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table(outcomes, config):
        lines.append(
            f"| {r.method} | {r.encoder} | {'-' if r.k is None else r.k} | {r.fraction_of_optimum:.3f} | "
            f"{r.evaluations:.1f} | {r.space_fraction:.2e} | {r.speedup_vs_eager:.2f} | {r.speedup_vs_default:.2f} |"
        )
    lines += ["", *_by_kind(outcomes, config)]
    k, rk = _shown_k(config.ks), _shown_k(config.random_k)
    lines += ["", f"Per held-out subgraph (transfer k = {k}, random k = {rk}; fraction of optimum):", "",
              "| model | subgraph | kind | space | optimum us | default | random | "
              + " | ".join(config.encoders) + " |",
              "|---|---|---|---|---|---|---|" + "---|" * len(config.encoders)]
    for o in outcomes:
        cells = [f"{o.optimum_s / o.default_s:.2f}", f"{o.optimum_s / o.random[rk]:.2f}",
                 *(f"{o.optimum_s / o.transfer[e][k]['s']:.2f}" for e in config.encoders)]
        lines.append(f"| {o.model} | {o.name[:50]} | {o.kind} | {o.space_size} | {o.optimum_s * 1e6:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
