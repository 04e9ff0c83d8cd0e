"""Fraction of the optimum per k and encoder across replays of one recording with different ``--encoder-seed``,
with and without fill (``tunebank bench transfer`` reports, JSON).

    python bench/encoder_seeds.py --out bench/results/transfer_h200_seeds.md [--encoders static,learned] \
        "fill,0=/tmp/s0.json" "fill,1=/tmp/s1.json" "no fill,0=/tmp/n0.json" ...

Each argument is ``FILL,SEED=REPORT``; rows are grouped by FILL, one per seed, with the mean over seeds last.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def fractions(report: Path, encoders: list[str]) -> dict[tuple[str, int], tuple[float, float]]:
    """(encoder, k) -> (fraction of the optimum, mean evaluations) of the report's transfer rows."""
    rows = json.loads(report.read_text())["table"]
    return {(r["encoder"], r["k"]): (r["fraction_of_optimum"], r["evaluations"]) for r in rows
            if r["method"] == "transfer" and r["encoder"] in encoders}


def markdown(runs: dict[str, dict[int, dict[tuple[str, int], tuple[float, float]]]]) -> str:
    found = {c for seeds in runs.values() for table in seeds.values() for c in table}
    columns = sorted(found, key=lambda c: (c[1], c[0] != "static"))  # by k, static first
    lines = ["| fill | encoder seed | " + " | ".join(f"{e}, k = {k}" for e, k in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for fill, seeds in runs.items():
        for seed, table in sorted(seeds.items()):
            cells = [f"{table[c][0]:.3f} ({table[c][1]:.1f})" if c in table else "-" for c in columns]
            lines.append(f"| {fill} | {seed} | " + " | ".join(cells) + " |")
        means = [statistics.mean(t[c][0] for t in seeds.values() if c in t) for c in columns]
        lines.append(f"| {fill} | mean | " + " | ".join(f"**{m:.3f}**" for m in means) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--encoders", default="static,learned")
    parser.add_argument("--title", default="", help="a first paragraph: what was replayed, where, when")
    parser.add_argument("reports", nargs="+", help="FILL,SEED=REPORT.json")
    args = parser.parse_args()
    runs: dict[str, dict[int, dict[tuple[str, int], tuple[float, float]]]] = {}
    for item in args.reports:
        label, path = item.split("=", 1)
        fill, seed = label.rsplit(",", 1)
        runs.setdefault(fill, {})[int(seed)] = fractions(Path(path), args.encoders.split(","))
    text = (f"{args.title}\n\n" if args.title else "") + markdown(runs)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
