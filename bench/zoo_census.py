"""Census of the model zoo: models, subgraphs and distinct structural/family hashes per kind.

    .venv/bin/python bench/zoo_census.py --out bench/results/zoo_census.md
"""

import argparse
import os
import platform
import time
from collections import Counter, defaultdict
from datetime import date
from pathlib import Path

from embed import zoo
from embed.partition import partition


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def census() -> tuple[int, Counter, dict, dict, float]:
    started = time.perf_counter()
    families = set(zoo.families())
    models = [name for name in zoo.names() if name not in families]  # aliases repeat a grid member
    instances: Counter = Counter()
    structural: dict[str, set[str]] = defaultdict(set)
    family: dict[str, set[str]] = defaultdict(set)
    for name in models:
        for sub in partition(zoo.load(name)):
            instances[sub.kind.value] += 1
            structural[sub.kind.value].add(sub.structural_hash)
            family[sub.kind.value].add(sub.family_hash)
    return len(models), instances, structural, family, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    n_models, instances, structural, family, seconds = census()
    rows = [
        f"| {kind} | {instances[kind]} | {len(structural[kind])} | {len(family[kind])} |"
        for kind in sorted(instances, key=lambda k: -len(structural[k]))
    ]
    total = (
        f"| **total** | {sum(instances.values())} | {sum(len(s) for s in structural.values())} "
        f"| {sum(len(s) for s in family.values())} |"
    )
    text = "\n".join([
        "# Zoo census",
        "",
        f"{date.today()} on {os.cpu_count()}-core {platform.machine()} ({cpu_name()}), "
        f"{n_models} zoo models (grid members, aliases excluded), imported and partitioned in {seconds:.0f} s.",
        "",
        "| kind | subgraph instances | distinct structural hashes | distinct family hashes |",
        "|---|---|---|---|",
        *rows,
        total,
        "",
    ])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
