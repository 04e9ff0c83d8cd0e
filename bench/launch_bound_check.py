"""Check ``transforms.launch_bound`` against the GPU times of a ``tunebank bench transfer`` recording, on the cpu.

Each recorded kernel is generated again from its recipe and subgraph with today's code. Its bound (the subgraph's flops
over ``--lane-rate`` times the lanes of its widest launch, at most 128 a block) must not exceed the time the GPU
measured. The check counts the kernels the bound leaves out at 4x the recorded eager time (what optimize would not
compile or run, with eager as the only time known; never a default recipe) and the GPU seconds they took.

    PYTHONPATH=. python bench/launch_bound_check.py bench/results/transfer_strong_h100.json --lane-rate 4e9

Exits 1 when a kernel ran faster than its bound.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embed.features import static_features  # noqa: E402
from embed.partition import partition  # noqa: E402
from embed.profile import work  # noqa: E402
from service.bench_transfer import load_graph  # noqa: E402
from transforms.codegen import Kernel, generate  # noqa: E402
from transforms.launch_bound import LANE_FLOPS_PER_S, fewest_seconds  # noqa: E402
from transforms.recipe import parse  # noqa: E402
from transforms.run import SLOWER_FACTOR  # noqa: E402
from transforms.schedule import ScheduleError  # noqa: E402
from transforms.space import default_recipe  # noqa: E402
from transforms.transformation import apply_recipe  # noqa: E402
from transforms.tune import make_task  # noqa: E402


def check(recording: dict, lane_rate: float) -> int:
    tasks = {s.structural_hash: make_task(s) for spec in recording["config"]["models"]
             for s in partition(load_graph(spec)) if s.tunable}
    results, eager = recording["measurements"]["results"], recording["measurements"]["eager"]
    counts: collections.Counter[str] = collections.Counter()
    left_out: collections.Counter[str] = collections.Counter()
    seconds = {"recorded": 0.0, "left out": 0.0}
    worst: list[tuple[float, str, str]] = []
    defaults: dict[str, str] = {}
    for key, recipes in results.items():
        task = tasks.get(key)
        if task is None:
            counts["subgraph not rebuilt"] += len(recipes)
            continue
        flops = work(static_features(task.program))[0]
        defaults[key] = str(default_recipe(task.program, "cuda"))
        for text, measured in recipes.items():
            if isinstance(measured, str):
                continue
            seconds["recorded"] += measured
            try:
                kernel: Kernel = generate(apply_recipe(parse(text), task.program), "cuda")
            except (ScheduleError, ValueError):
                counts["no kernel today"] += 1
                continue
            bound = fewest_seconds(kernel, flops)
            if bound is None:
                counts["library or tensor cores: no bound"] += 1
                continue
            bound *= LANE_FLOPS_PER_S / lane_rate
            counts["checked"] += 1
            worst.append((bound / measured, task.name, text))
            if eager.get(key) and bound > SLOWER_FACTOR * eager[key] and text != defaults[key]:
                counts["left out"] += 1
                seconds["left out"] += measured
                left_out[task.name.split("(")[-1].rstrip(")")[:40]] += 1
    worst.sort()
    over = [w for w in worst if w[0] > 1]
    print(f"lane rate {lane_rate:.3g} flop/s: {dict(counts)}")
    print(f"kernels faster than their bound: {len(over)}; the closest: "
          + "; ".join(f"{r:.3f} of its time ({name}, {recipe})" for r, name, recipe in worst[-3:]))
    print(f"left out at {SLOWER_FACTOR:g}x eager: {counts['left out']} kernels, {seconds['left out']:.1f} of "
          f"{seconds['recorded']:.1f} recorded GPU seconds; by subgraph: {dict(left_out.most_common(8))}")
    return 1 if over else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--lane-rate", type=float, default=LANE_FLOPS_PER_S,
                        help=f"flop/s a lane is taken to do at most (default {LANE_FLOPS_PER_S:g}, as optimize)")
    args = parser.parse_args()
    return check(json.loads(args.recording.read_text()), args.lane_rate)


if __name__ == "__main__":
    sys.exit(main())
