"""Where transfer tuning's time goes: ``tunebank tune --strategy transfer`` on each dense GPU benchmark case, from a
database that never saw its shape, with its wall time split into phases (from a profile of the run).

    python -m bench.transfer_time --db /tmp/h200.db --out DIR [--only softmax,layernorm] [--passes 2]

Phases (cumulative seconds of the functions that do them; the rest is "other"): ``encoder`` (fit the encoder,
embed the database, open the index), ``problem`` (the task's validation problem: on cuda its spec and tolerances),
``codegen`` (recipes to CUDA sources), ``compile`` (NVRTC, disk cache), ``run`` (the worker: build the problem's
random inputs and reference outputs on the GPU from the spec, launch, validate, time), ``neighbours`` (index
search and adaptation); ``--worker-profile`` splits the worker's time (``LoadedProblem.open`` builds the
problem). Pass 2 repeats every case with the same compile cache but nothing else remembered (what a second model
with the same kernels pays). ``failed``: evaluations that did not validate (or run). Writes ``transfer_time.md`` /
``.json`` under ``--out``.
"""

import argparse
import cProfile
import datetime
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu_table import SPMM
from bench.gpu_transforms import cases

#: phase -> (module path suffix, function name) whose cumulative time is the phase's
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "encoder": (("service/embeddings.py", "fit_encoder"), ("service/embeddings.py", "embed_subgraphs"),
                ("db/index/vector_index.py", "open")),
    "problem": (("transforms/tune.py", "make_task"),),
    "neighbours": (("service/transfer.py", "neighbours"),),
    "codegen": (("transforms/tune.py", "kernels"),),
    "compile": (("transforms/build.py", "build"),),
    "run": (("transforms/run.py", "run"),),
}


def phases(profile: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds per phase of a profiled run."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = dict.fromkeys(PHASES, 0.0)
    for (path, _, name), (_, _, _, cumulative, _) in stats.items():
        for phase, functions in PHASES.items():
            if any(path.endswith(p) and name == f for p, f in functions):
                out[phase] += cumulative
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, required=True, help="SQLite tunebank database crawled on this device class")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", default="", help="comma-separated families (default: every dense case)")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--encoder", default="static")
    p.add_argument("--worker-profile", type=Path, help="also profile the worker process (cProfile) into this file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    from db.session import Database
    from service.tune_transfer import transfer_model
    from transforms.run import Worker
    from tunebank.cli.tune import transfer_measurer

    args = parse_args(argv)
    wanted = set(filter(None, args.only.split(",")))
    dense = [c for c in cases(quick=False) if c.family != SPMM and (not wanted or c.family in wanted)]
    cache = Path(tempfile.mkdtemp(prefix="tunebank-transfer-time-"))
    database = Database(f"sqlite:///{args.db}")
    rows: list[dict[str, Any]] = []
    with Worker(python=_profiled_python(args.worker_profile, cache) if args.worker_profile else sys.executable) \
            as worker:
        measurer = transfer_measurer("cuda", cache, worker)
        for pass_ in range(1, args.passes + 1):
            for case in dense:
                measurer.table.results.clear()
                profile = cProfile.Profile()
                started = time.perf_counter()
                profile.enable()
                found = transfer_model(database, case.graph, measurer, backend="cuda", index_dir=cache / "index",
                                       encoder=args.encoder, k=args.k)
                profile.disable()
                wall = time.perf_counter() - started
                split = phases(profile)
                row = {"pass": pass_, "family": case.family, "size": case.size, "wall_s": wall,
                       "subgraphs": len(found), "evaluations": sum(f.result.evaluations for f in found),
                       "failed": sum(not t.result.ok for f in found for t in f.result.tried),
                       "phases_s": split, "other_s": wall - sum(split.values())}
                rows.append(row)
                print(json.dumps(row), flush=True)
    database.dispose()
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "device": _device(),
            "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transfer_time.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "transfer_time.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


def _profiled_python(output: Path, folder: Path) -> str:
    """An executable that runs Python under cProfile, writing ``output`` when the worker exits."""
    script = folder / "profiled-python"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m cProfile -o {output} "$@"\n')
    script.chmod(0o755)
    return str(script)


def _device() -> str:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    head = ["pass", "family", "size", "wall s", "per subgraph s", "evaluations", "failed", *PHASES, "other"]
    lines = [f"# Transfer tuning time per case\n\nDevice: {meta['device']}, {meta['date']}. "
             f"Arguments: `{meta['args']}`.\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["pass"], r["family"], r["size"], f"{r['wall_s']:.2f}", f"{r['wall_s'] / max(r['subgraphs'], 1):.2f}",
                 r["evaluations"], r["failed"], *(f"{r['phases_s'][p]:.2f}" for p in PHASES), f"{r['other_s']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
