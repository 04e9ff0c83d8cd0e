"""``tunebank bench transfer --devices N``: a live run's measurements made on N GPUs at once.

Stage by stage (``service.bench_transfer.STAGES``: each subgraph's own searches, then the cross table and the
evolutionary strong optimum, then the folds' transfers), N processes (``python -m tunebank.cli.bench_shard JOB``)
each measure their shard of the stage on their own GPU (``CUDA_VISIBLE_DEVICES``), resuming from the merged table,
and their tables are merged into it before the next stage. A stage's decisions depend only on its subgraph's
measurements and the earlier stages', so the merged table replays the whole harness: the command's own run over it
afterwards measures (almost) nothing and writes the report.
"""

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.bench_transfer import STAGES, BenchConfig, Shard
from service.measure import MeasurementTable, RunStopped

STOPPED = 3  # exit code of a shard (and of the command) stopped at its time limit, its measurements saved


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a run killed while saving keeps its previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data, allow_nan=False))
    os.replace(partial, path)


def device_environments(backend: str, devices: int) -> list[dict[str, str]]:
    """The environment of each of ``devices`` processes: one visible GPU each on cuda (the n-th of this process's
    ``CUDA_VISIBLE_DEVICES``, else GPU n), nothing on the cpu."""
    if backend != "cuda":
        return [{} for _ in range(devices)]
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible or [str(n) for n in range(devices)]
    if len(ids) < devices:
        raise ValueError(f"--devices {devices} needs as many GPUs; CUDA_VISIBLE_DEVICES shows {len(ids)}")
    return [{"CUDA_VISIBLE_DEVICES": ids[n]} for n in range(devices)]


def measure_on_devices(config: BenchConfig, table: MeasurementTable, *, devices: int, backend: str, repeats: int,
                       timeout_s: float, cache_dir: Path, workdir: Path, stop_after_s: float = math.inf,
                       save: Callable[[MeasurementTable, int], None] = lambda table, kernels: None,
                       progress: Callable[[str], None] = lambda message: None) -> None:
    """Measure every stage of ``config``'s run in ``devices`` processes at once, merging into ``table``, which is
    saved with the kernels run so far after every stage (``save``). Raises ``RunStopped`` when a shard reached the
    time limit, ``RuntimeError`` when one failed (after saving what every shard measured)."""
    environments = device_environments(backend, devices)
    started, kernels = time.monotonic(), 0
    for stage in STAGES:
        left = stop_after_s - (time.monotonic() - started)
        if left <= 0:
            raise RunStopped(f"stopped after {stop_after_s:g} s before stage {stage}")
        resume = workdir / "merged.json"
        write_json(resume, table.to_json())
        jobs = []
        for n, environment in enumerate(environments):
            (workdir / f"shard{n}.json").unlink(missing_ok=True)
            job = {"config": asdict(config), "shard": asdict(Shard(stage, n, devices)), "resume": str(resume),
                   "out": str(workdir / f"shard{n}.json"), "backend": backend, "repeats": repeats,
                   "timeout_s": timeout_s, "cache_dir": str(cache_dir),
                   "stop_after_s": left if math.isfinite(left) else None}
            write_json(workdir / f"job{n}.json", job)
            command = [sys.executable, "-m", "tunebank.cli.bench_shard", str(workdir / f"job{n}.json")]
            jobs.append(subprocess.Popen(command, env={**os.environ, **environment}))
        codes = [job.wait() for job in jobs]
        failed = [n for n, code in enumerate(codes) if code not in (0, STOPPED)]
        for n in range(devices):  # what every shard measured is kept, a failed or stopped one's too
            out = workdir / f"shard{n}.json"
            if out.exists():
                done = json.loads(out.read_text())
                table.merge(MeasurementTable.from_json(done["measurements"]))
                kernels += done["kernels"]
        save(table, kernels)
        progress(f"stage {stage}: {devices} shards done, {kernels} kernels so far, {table.size} measurements")
        if failed:
            raise RuntimeError(f"stage {stage}: shard {failed[0]} exited with code {codes[failed[0]]} (its output is "
                               "above)")
        if STOPPED in codes:
            raise RunStopped(f"stopped in stage {stage} at the time limit")
