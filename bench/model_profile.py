"""Where a model's GPU time goes: eager, torch.compile default and a tunebank plan, kernel by kernel and step by step.

For each model of ``bench/e2e_models.py`` (transferring from ``$TUNEBANK_E2E_DB`` as ``bench/optimize_e2e.py``
does, the plan kept whatever its whole-model timing would say):

* ``steps``: every plan step's GPU time, run eagerly and as the plan runs it (kernel, eager or folded), both
  uncaptured, each call queued behind a GPU busy-wait so that launch gaps do not count (CUDA events around each
  step, median of ``--calls`` calls over rotated inputs), with what the optimize report says of its subgraph (its
  times and every candidate tried);
* ``kernels``: the kernels of one call of eager, of torch.compile default and of the plan in its CUDA graph
  (``torch.profiler``, summed by name over ``--calls`` calls and divided by them).

    TUNEBANK_E2E_DB=out/h200.db python bench/model_profile.py --models swin_block-c128-i56-w7-b4 --out $OUT/profile

Writes PREFIX.json (one entry per model, written after each) and prints a summary per model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEAD_START_CYCLES = 60_000_000  # ~30 ms of GPU busy-wait: the host queues a whole call behind it


def step_times(module: Any, sets: Sequence[tuple[Any, ...]], calls: int) -> list[float]:
    """Median GPU microseconds of each step of a PlanModule run uncaptured, launch gaps hidden by a head start."""
    import torch

    per_step: list[list[float]] = [[] for _ in module.steps]
    for n in range(calls + 3):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(module.steps) + 1)]
        env = dict(module.params)
        env.update(zip(module.input_names, sets[n % len(sets)], strict=True))
        torch.cuda._sleep(HEAD_START_CYCLES)
        events[0].record()
        for step, event in zip(module.steps, events[1:], strict=True):
            step(env)
            event.record()
        torch.cuda.synchronize()
        if n >= 3:
            for i in range(len(module.steps)):
                per_step[i].append(events[i].elapsed_time(events[i + 1]) * 1e3)
    return [statistics.median(t) for t in per_step]


def kernel_table(fn: Callable[..., Any], sets: Sequence[tuple[Any, ...]], calls: int) -> dict[str, Any]:
    """Kernels of one call of ``fn``: microseconds and launches per call by kernel name, and their sums."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for s in sets[:3]:
            fn(*s)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for n in range(calls):
                fn(*sets[n % len(sets)])
            torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            slot = by_name.setdefault(event.name[:120], [0.0, 0])
            slot[0] += event.time_range.elapsed_us() / calls
            slot[1] += 1 / calls
    rows = sorted(([name, round(us, 2), round(count, 2)] for name, (us, count) in by_name.items()),
                  key=lambda r: -r[1])
    return {"us": round(sum(r[1] for r in rows), 1), "launches": round(sum(r[2] for r in rows), 1),
            "rows": [r for r in rows if "memcpy" not in r[0].lower() or r[1] > 0.5]}


def profile_model(name: str, calls: int) -> dict[str, Any]:
    import torch

    from bench.e2e_models import build
    from bench.optimize_e2e import _fresh_inductor, input_sets
    from service.weights import named_tensors
    from tunebank.api import bind, optimize
    from tunebank.settings import Settings

    module, inputs = build(name, "cuda")
    sets = input_sets(inputs)
    entry: dict[str, Any] = {"model": name}
    with tempfile.TemporaryDirectory(prefix="tunebank-") as tmp:
        shutil.copy(os.environ["TUNEBANK_E2E_DB"], Path(tmp) / "tunebank.db")
        settings = Settings(data_dir=Path(tmp))
        result = optimize(module, inputs, settings=settings, time_model=False)
        plan = result.plan
        weights = named_tensors(module)
        planned = bind(replace(plan, cuda_graph=False), weights, settings=settings)
        eager_steps = bind(replace(plan.with_all_eager(), cuda_graph=False), weights, settings=settings)
        graphed = bind(replace(plan, cuda_graph=True), weights, settings=settings)
        with torch.no_grad():
            plan_us, eager_us = step_times(planned, sets, calls), step_times(eager_steps, sets, calls)
        rows = {r["structural_hash"]: r for r in plan.report["subgraphs"]}
        entry["steps"] = []
        for step, p, e in zip(plan.steps, plan_us, eager_us, strict=True):
            row = rows.get(step.structural_hash, {})
            entry["steps"].append({"ops": "+".join(row.get("ops", []))[:60], "kind": row.get("kind"),
                                   "impl": step.impl, "recipe": step.recipe, "plan_us": round(p, 2),
                                   "eager_us": round(e, 2), "kernel_s": row.get("kernel_s"),
                                   "eager_s": row.get("eager_s"), "candidates": row.get("candidates")})
        entry["kernels"] = {"eager": kernel_table(module, sets, calls), "tunebank": kernel_table(graphed, sets, calls)}
    with tempfile.TemporaryDirectory(prefix="inductor-") as tmp:
        _fresh_inductor(tmp)
        compiled = torch.compile(module)
        entry["kernels"]["default"] = kernel_table(compiled, sets, calls)
        torch._dynamo.reset()
    return entry


def summary(entry: dict[str, Any]) -> str:
    lines = [f"== {entry['model']}: GPU us per call " + ", ".join(
        f"{k} {v['us']} ({v['launches']} launches)" for k, v in entry["kernels"].items())]
    steps = entry["steps"]
    plan_us, eager_us = sum(s["plan_us"] for s in steps), sum(s["eager_us"] for s in steps)
    lines.append(f"   steps: plan {plan_us:.1f} us, eager {eager_us:.1f} us (uncaptured)")
    for s in steps:
        lines.append(f"   {s['impl']:7s} {s['plan_us']:8.1f} {s['eager_us']:8.1f}  {s['kind'] or '':11s} "
                     f"{s['ops']:40s} {s['recipe'] or ''}")
    for column, table in entry["kernels"].items():
        lines.append(f"   -- {column}: " + "; ".join(f"{r[0][:50]} {r[1]}us x{r[2]}" for r in table["rows"][:12]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated names of bench/e2e_models.py")
    parser.add_argument("--out", required=True, help="output prefix: PREFIX.json")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    out = Path(args.out + ".json")
    done: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    for name in args.models.split(","):
        try:
            done[name] = profile_model(name, args.calls)
            print(summary(done[name]), flush=True)
        except Exception as e:  # one model's failure is recorded, the others go on
            done[name] = {"model": name, "error": f"{type(e).__name__}: {e}"[:500]}
            print(f"== {name}: {done[name]['error']}", flush=True)
        out.write_text(json.dumps(done, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
