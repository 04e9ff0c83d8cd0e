"""Figures of a transfer benchmark run (``service.bench_transfer``): the method table, JSON and markdown reports.

Every figure is over the held-out subgraphs: the fraction of the optimum a method reaches (optimum time over the
method's time; geomean), its evaluations, the share of the recipe space they are, and its speedups over eager
PyTorch and the default recipe.

Each fraction comes with a 95% bootstrap interval over the held-out subgraphs (percentile method, :data:`RESAMPLES`
resamples, seed :data:`SEED`), and the comparisons that claims rest on (learned - static, transfer - random at equal
evaluations, one fill against another) are paired: each resample takes the same subgraphs for both sides, so the
interval of the difference is narrower than two separate intervals suggest where both sides move together.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from service.bench_transfer import ORACLE, BenchConfig, HeldOut, transfer_key
from service.measure import Measurer

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return float(np.exp(np.mean(np.log(finite)))) if finite else math.nan


def _resampled_log_means(logs: np.ndarray, *, resamples: int, seed: int) -> np.ndarray:
    """Mean of each column of ``logs`` (rows: subgraphs) over ``resamples`` resamples of its rows."""
    index = np.random.default_rng(seed).integers(0, len(logs), size=(resamples, len(logs)))
    return logs[index].mean(axis=1)


def bootstrap_interval(values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                       level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of ``geomean(values)`` (resampling the values; the non-finite and
    non-positive ones left out as ``geomean`` leaves them out)."""
    finite = np.array([v for v in values if math.isfinite(v) and v > 0], dtype=float)
    if len(finite) == 0:
        return math.nan, math.nan
    means = _resampled_log_means(np.log(finite)[:, None], resamples=resamples, seed=seed)[:, 0]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(np.exp(low)), float(np.exp(high))


def paired_difference(a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                      level: float = LEVEL) -> tuple[float, float, float, int]:
    """``geomean(a) - geomean(b)`` over the pairs where both are finite and positive, with its percentile bootstrap
    interval (each resample takes the same pairs for both): (difference, low, high, pairs)."""
    pairs = np.array([(x, y) for x, y in zip(a, b, strict=True)
                      if math.isfinite(x) and x > 0 and math.isfinite(y) and y > 0], dtype=float).reshape(-1, 2)
    if len(pairs) == 0:
        return math.nan, math.nan, math.nan, 0
    means = np.exp(_resampled_log_means(np.log(pairs), resamples=resamples, seed=seed))
    differences = means[:, 0] - means[:, 1]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(differences, [tail, 100 - tail])
    point = float(np.exp(np.log(pairs[:, 0]).mean()) - np.exp(np.log(pairs[:, 1]).mean()))
    return point, float(low), float(high), len(pairs)


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
    fill: str = "-"  # transfer: what filled the places the neighbours left (none, random, model)
    low: float = math.nan  # 95% bootstrap interval of fraction_of_optimum over the held-out subgraphs
    high: float = math.nan


def _row(method: str, encoder: str, k: int | None, outcomes: Sequence[HeldOut], times: Sequence[float],
         evaluations: Sequence[float], fill: str = "-") -> Row:
    fractions = [o.optimum_s / t for o, t in zip(outcomes, times, strict=True)]
    return Row(
        method, encoder, k,
        geomean(fractions),
        float(np.mean(evaluations)),
        float(np.mean([e / o.space_size for o, e in zip(outcomes, evaluations, strict=True)])),
        geomean([o.eager_s / t for o, t in zip(outcomes, times, strict=True)]),
        geomean([o.default_s / t for o, t in zip(outcomes, times, strict=True)]),
        fill, *bootstrap_interval(fractions),
    )


@dataclass(frozen=True)
class Difference:
    """A paired comparison over the held-out subgraphs: fraction of the optimum of ``a`` minus that of ``b``
    (geomeans; points of the optimum), its 95% bootstrap interval, and each side's mean evaluations."""

    a: str
    b: str
    k: int
    difference: float
    low: float
    high: float
    evaluations_a: float
    evaluations_b: float
    subgraphs: int


def _transfer(outcomes: Sequence[HeldOut], key: str, k: int) -> tuple[list[float], float]:
    picked = [o.transfer[key][k] for o in outcomes]
    return [o.optimum_s / t["s"] for o, t in zip(outcomes, picked, strict=True)], float(
        np.mean([t["evaluations"] for t in picked]))


def _label(encoder: str, fill: str) -> str:
    return f"{encoder} (no fill)" if fill == "none" else f"{encoder} ({fill} fill)"


def differences(outcomes: Sequence[HeldOut], config: BenchConfig) -> list[Difference]:
    """learned - static and oracle - learned (each fill and k), transfer - random at equal evaluations (each encoder,
    fill but none, and k the random baseline has), and each fill against the one before it (model - random,
    random - none; each encoder and k)."""
    out = []

    def add(a: tuple[list[float], float], b: tuple[list[float], float], names: tuple[str, str], k: int) -> None:
        difference, low, high, n = paired_difference(a[0], b[0])
        out.append(Difference(*names, k, difference, low, high, a[1], b[1], n))

    encoders, fills = config.encoders, config.fill_modes
    for fill in fills:
        for better, worse in (("learned", "static"), (ORACLE, "learned")):
            if better in encoders and worse in encoders:
                for k in config.ks:
                    add(_transfer(outcomes, transfer_key(better, fill, config), k),
                        _transfer(outcomes, transfer_key(worse, fill, config), k),
                        (_label(better, fill), _label(worse, fill)), k)
    for fill in fills:
        if fill == "none":
            continue
        for encoder in encoders:
            for k in config.ks:
                if k in config.random_k:
                    add(_transfer(outcomes, transfer_key(encoder, fill, config), k),
                        ([o.optimum_s / o.random[k] for o in outcomes],
                         float(np.mean([k + 1 + o.library for o in outcomes]))),
                        (_label(encoder, fill), f"random {k}"), k)
    for better, worse in (("model", "random"), ("random", "none")):
        if better in fills and worse in fills:
            for encoder in encoders:
                for k in config.ks:
                    add(_transfer(outcomes, transfer_key(encoder, better, config), k),
                        _transfer(outcomes, transfer_key(encoder, worse, config), k),
                        (_label(encoder, better), _label(encoder, worse)), k)
    return out


def table(outcomes: Sequence[HeldOut], config: BenchConfig) -> list[Row]:
    rows = [
        _row("eager", "-", None, outcomes, [o.eager_s for o in outcomes], [0] * len(outcomes)),
        _row("default recipe", "-", None, outcomes, [o.default_s for o in outcomes], [1] * len(outcomes)),
        _row(f"{config.strategy} search", "-", config.budget, outcomes, [o.search_s for o in outcomes],
             [o.searched for o in outcomes]),
    ]
    for k in config.random_k:
        rows.append(_row("random", "-", k, outcomes, [o.random[k] for o in outcomes],
                         [k + 1 + o.library for o in outcomes]))
    for fill in config.fill_modes:
        for name in config.encoders:
            key = transfer_key(name, fill, config)
            for k in config.ks:
                rows.append(_row("transfer", name, k, outcomes, [o.transfer[key][k]["s"] for o in outcomes],
                                 [o.transfer[key][k]["evaluations"] for o in outcomes], fill))
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
        "differences": [asdict(d) for d in differences(outcomes, config)],
        "bootstrap": {"resamples": RESAMPLES, "seed": SEED, "level": LEVEL, "over": "held-out subgraphs"},
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


def _optimum_note(outcomes: Sequence[HeldOut], config: BenchConfig) -> str:
    covered = sum(o.recorded >= o.space_size for o in outcomes)
    searched = {}
    for o in outcomes:
        searched[o.optimum_search] = searched.get(o.optimum_search, 0) + 1
    note = (f"the measurements held for a subgraph cover its whole space for {covered} of the {len(outcomes)}"
            f" (median {np.median([o.recorded for o in outcomes]):.0f} recipes of a median space of "
            f"{np.median([o.space_size for o in outcomes]):.0f}).")
    if config.optimum == "strong":
        note += (f" Strong optimum: exhaustive below {config.exhaustive_below} recipes "
                 f"({searched.get('exhaustive', 0)} subgraphs), else an evolutionary search of "
                 f"{config.strong_budget} new recipes seeded with the cross table, own search, random picks and "
                 "vendor ranks "
                 f"({searched.get('evolutionary', 0)}).")
    else:
        note += " No strong optimum was searched (--optimum recorded): the optimum is as weak as the run."
    return note


def _pool_note(config: BenchConfig) -> str:
    if config.fill_pool == "space":
        return "256 uniform random recipes"
    own = f" and the {config.budget} of the subgraph's own random search" if config.strategy == "random" else ""
    return f"the {max(config.random_k)} random-baseline recipes{own}, all recorded"


def _targets(rows: Sequence[Row], diffs: Sequence[Difference], config: BenchConfig) -> list[str]:
    """The issue's done-means at k = 5, per fill, for the learned encoder (or the first one)."""
    k = _shown_k(config.ks)
    encoder = "learned" if "learned" in config.encoders else config.encoders[0]
    optimum = ("the strong optimum" if config.optimum == "strong" else
               "the run's own optimum (not the strong one: these cannot pass for the done-means)")
    lines = [f"Targets at k = {k}, {encoder} encoder, against {optimum}:", "",
             "| fill | >= 0.97 of optimum | <= 0.5% of space | >= 5 points above random at equal evaluations | "
             "learned - static interval above 0 |", "|---|---|---|---|---|"]
    by_diff = {(d.a, d.b, d.k): d for d in diffs}
    for fill in config.fill_modes:
        row = next(r for r in rows if (r.method, r.encoder, r.fill, r.k) == ("transfer", encoder, fill, k))
        cells = [f"{'yes' if row.fraction_of_optimum >= 0.97 else 'no'}: {row.fraction_of_optimum:.3f} "
                 f"[{row.low:.3f}, {row.high:.3f}]",
                 f"{'yes' if row.space_fraction <= 0.005 else 'no'}: {row.space_fraction:.2%}"]
        random = by_diff.get((_label(encoder, fill), f"random {k}", k))
        cells.append("-" if random is None else
                     f"{'yes' if random.difference >= 0.05 else 'no'}: {random.difference:+.3f} "
                     f"[{random.low:+.3f}, {random.high:+.3f}]" + (
                         f" ({random.evaluations_a:.1f} vs {random.evaluations_b:.1f} evaluations)"
                         if abs(random.evaluations_a - random.evaluations_b) > 0.05 else ""))
        learned = by_diff.get((_label("learned", fill), _label("static", fill), k))
        cells.append("-" if learned is None else
                     f"{'yes' if learned.low > 0 else 'no'}: {learned.difference:+.3f} "
                     f"[{learned.low:+.3f}, {learned.high:+.3f}]")
        lines.append(f"| {fill} | " + " | ".join(cells) + " |")
    return lines


def report_markdown(outcomes: Sequence[HeldOut], config: BenchConfig, measurer: Measurer,
                    runs: Sequence[Mapping[str, Any]] = ()) -> str:
    device = measurer.table.device
    exact = sum(o.exact_match for o in outcomes)
    whole = sum(o.searched >= o.space_size for o in outcomes)
    split = {"model": "leave-one-model-out", "family": "leave-one-family-out"}[config.split]
    lines = [
        f"# Transfer tuning, {split}",
        "",
        f"Device: {device.name} ({device.device_class}; {device.bandwidth_gbps:.1f} GB/s, "
        f"{device.peak_gflops:.0f} GFLOP/s measured). Backend {config.backend}; "
        f"toolchain `{measurer.table.toolchain.splitlines()[0]}`.",
        f"Models ({len(config.models)}): {', '.join(config.models)}.",
        f"Held-out subgraphs: {len(outcomes)} (over {len({o.fold for o in outcomes})} folds; {exact} also occur in "
        "a model outside the fold and are "
        + ("excluded from their own neighbours)." if config.split == "model" else
           "removed from the fold's database, as is everything the held-out family has).")
        + f" Split: {config.split}.",
        f"Optimum: fastest time measured on the subgraph by anything in the run, including a {config.strategy} "
        f"search of {config.budget} recipes (+ default), which covered the whole space of {whole} of the "
        f"{len(outcomes)}; {_optimum_note(outcomes, config)} {measurer.table.size} kernels measured "
        f"({measurer.evaluations} by this process). "
        f"Recipes per neighbour: {config.per_neighbour}"
        f"; fills compared: {', '.join(config.fill_modes)} (random: variants, vendor-ranked and uniform random "
        "recipes fill the places neighbours leave; model: variants, vendor-ranked and the best of a pool ranked by a "
        f"cost model fitted on the fold's database, pool: {_pool_note(config)}). "
        f"Local search after transfer: {config.local_budget} recipes. Database: "
        + ("each subgraph's own search and cross table, as a crawl stores them." if config.database == "crawl" else
           "each subgraph's own search, cross table and strong-optimum search (a crawl as thorough as the optimum)."),
    ]
    if runs:
        lines.append("Measured in: " + "; ".join(
            f"({n}) {r['date']}, {r['kernels']} kernels, `{r['command']}`" for n, r in enumerate(runs, 1)) + ".")
    lines += [
        "",
        "Fraction of the optimum with its 95% bootstrap interval over the held-out subgraphs:",
        "",
        "| method | encoder | fill | k | fraction of optimum (geomean) | 95% interval | evaluations (mean) | "
        "share of space | x eager (geomean) | x default (geomean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = table(outcomes, config)
    for r in rows:
        lines.append(
            f"| {r.method} | {r.encoder} | {r.fill} | {'-' if r.k is None else r.k} | {r.fraction_of_optimum:.3f} | "
            f"[{r.low:.3f}, {r.high:.3f}] | {r.evaluations:.1f} | {r.space_fraction:.2e} | "
            f"{r.speedup_vs_eager:.2f} | {r.speedup_vs_default:.2f} |"
        )
    diffs = differences(outcomes, config)
    lines += ["", "Paired differences (fraction of the optimum, geomean of a minus geomean of b, in points of the "
              "optimum; 95% bootstrap interval, same subgraphs on both sides; beyond noise where the interval "
              "excludes 0):", "",
              "| a | b | k | a - b | 95% interval | evaluations a / b | beyond noise |",
              "|---|---|---|---|---|---|---|"]
    for d in diffs:
        verdict = "a > b" if d.low > 0 else "a < b" if d.high < 0 else "no"
        lines.append(f"| {d.a} | {d.b} | {d.k} | {d.difference:+.3f} | [{d.low:+.3f}, {d.high:+.3f}] | "
                     f"{d.evaluations_a:.1f} / {d.evaluations_b:.1f} | {verdict} |")
    lines += ["", *_targets(rows, diffs, config), "", *_by_kind(outcomes, config)]
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
