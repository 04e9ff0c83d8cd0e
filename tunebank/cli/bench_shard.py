"""One shard's process of ``tunebank bench transfer --devices N``: ``python -m tunebank.cli.bench_shard JOB``.

JOB (written by ``tunebank.cli.bench_devices.measure_on_devices``) names the shard, the table to resume from and the
file where its table and kernel count are saved; the exit code is 0, or ``STOPPED`` at the time limit.
"""

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from service.bench_transfer import BenchConfig, Shard, run_bench
from service.measure import Checkpoint, MeasurementTable, RunStopped, live_measurer
from transforms.run import Worker
from tunebank.cli.bench_devices import STOPPED, write_json


def measure_shard(job: dict[str, Any]) -> int:
    """One shard's process: measure its part, save its table and kernel count to ``job['out']``; its exit code."""
    shard, out = Shard(**job["shard"]), Path(job["out"])
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    table = MeasurementTable.from_json(json.loads(Path(job["resume"]).read_text()))
    started = time.monotonic()
    with Worker() as worker:
        def save(table: MeasurementTable) -> None:
            write_json(out, {"measurements": table.to_json(), "kernels": measurer.evaluations})

        saver = Checkpoint(save, stop_after_s=job["stop_after_s"] or math.inf)
        measurer = live_measurer(table, backend=job["backend"], cache_dir=Path(job["cache_dir"]), worker=worker,
                                 repeats=job["repeats"], checkpoint=saver, timeout_s=job["timeout_s"])

        def progress(message: str) -> None:
            console.print(f"[{shard.stage} {shard.index}/{shard.count}: {time.monotonic() - started:5.0f} s, "
                          f"{measurer.evaluations} kernels] {message}", markup=False)

        try:
            run_bench(BenchConfig.from_json(job["config"]), measurer, progress=progress, shard=shard)
        except RunStopped:
            return STOPPED
        save(table)
    return 0


if __name__ == "__main__":
    sys.exit(measure_shard(json.loads(Path(sys.argv[1]).read_text())))
