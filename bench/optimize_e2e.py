"""Whole-model time of each held-out model (``bench/e2e_models.py``) under several implementations ("columns").

Every column is a function ``(module, inputs) -> dict`` with at least ``ms`` (median whole-model time of one
call), and ``compile_s`` where something is compiled. ``measure`` does the timing and the output check, so a
column only builds its callable::

    @column("tunebank")
    def tunebank_column(module, inputs):
        import tunebank
        start = time.perf_counter()
        compiled = tunebank.compile(module, inputs)
        return measure(compiled, module, inputs, compile_s=time.perf_counter() - start)

Timing (``measure``): the callable is called once (its cold first call, e.g. a compile, is the column's
business), warmed up, then called many times in bursts of back-to-back calls, each call between two CUDA events
(wall clock on cpu), its bursts alternating with eager's (``eager_ms``, the speedup's denominator), over
``copies`` input sets rotated so that they are not all L2-resident (their bytes add up to >= 2x a 60 MB L2,
between 2 and 16 sets; float copies are the example inputs times U(0.5, 1.5), never zeros; integer inputs are
shared). The median of the calls is ``ms``. Outputs are checked against eager (``module(*inputs)``) on two input
sets: ``max_rel_err`` = max |out - eager| / max |eager|.

The JSON (``--out PREFIX`` -> PREFIX.json, PREFIX.md) is a checkpoint: it is written after every
(model, column), with a "running" marker before each, so ``--resume FILE`` measures only what is missing. A
``--deadline`` watchdog stops the process before an outer time limit, recording the (model, column) in flight
as ``unfinished`` with the seconds it had run; unfinished entries are kept on resume unless
``--retry-unfinished``. ``--report FILE`` writes the markdown table from a JSON without running anything.
``--merge FILE...`` combines checkpoints of calls that ran side by side (shards of the models, each on its own GPU,
each resumed from the same file): for each (model, column) the entry started last wins.

    python3 bench/optimize_e2e.py --out $OUT/optimize_e2e_h200 --columns eager,default --deadline 500
    python3 bench/optimize_e2e.py --resume bench/results/optimize_e2e_h200.json --out $OUT/optimize_e2e_h200 \
        --columns max-autotune --deadline 520
    python3 bench/optimize_e2e.py --report bench/results/optimize_e2e_h200.json --out bench/results/optimize_e2e_h200

The GPU path imports torch (and pydantic through ``embed.zoo`` for the zoo models) only: no database packages.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `embed` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Column = Callable[[Any, tuple[Any, ...]], dict[str, Any]]
COLUMNS: dict[str, Column] = {}
SCHEMA = 1
L2_BYTES = 60 * 2**20  # the H200's L2; the H100's is 50 MB


def column(name: str) -> Callable[[Column], Column]:
    """Register ``fn(module, inputs) -> dict(ms=..., compile_s=..., ...)`` as column ``name`` (report order)."""
    def register(fn: Column) -> Column:
        COLUMNS[name] = fn
        return fn
    return register


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- timing and checking ---------------------------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def input_sets(inputs: Sequence[Any], copies: int | None = None, seed: int = 1) -> list[tuple[Any, ...]]:
    """``inputs`` then copies of it: float tensors times U(0.5, 1.5), others shared; enough to pass 2x L2."""
    import torch

    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    if copies is None:
        copies = min(16, max(2, math.ceil(2 * L2_BYTES / max(nbytes, 1))))
    gen = torch.Generator(device=tensors[0].device if tensors else "cpu").manual_seed(seed)
    sets = [tuple(inputs)]
    for _ in range(copies - 1):
        sets.append(tuple(
            t * (0.5 + torch.rand(t.shape, generator=gen, device=t.device, dtype=t.dtype))
            if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs))
    return sets


def _flat(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    return []


def max_rel_err(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| over all output tensors (in float64); inf on a shape mismatch or NaN."""
    outs, refs = _flat(out), _flat(ref)
    if len(outs) != len(refs) or any(o.shape != r.shape for o, r in zip(outs, refs, strict=True)):
        return math.inf
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o, r = o.detach().double(), r.detach().double()
        err = float((o - r).abs().max()) if o.numel() else 0.0
        scale = float(r.abs().max()) if r.numel() else 0.0
        if math.isnan(err):
            return math.inf
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


def first_call(fn: Callable[..., Any], inputs: Sequence[Any]) -> tuple[Any, float]:
    """``fn(*inputs)`` once, synchronized: (output, wall seconds), e.g. a lazy compile's cold cost."""
    import torch

    device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), "cpu")
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(*inputs)
    _sync(device)
    return out, time.perf_counter() - start


def time_calls(fn: Callable[..., Any], sets: Sequence[tuple[Any, ...]], *, reference: Callable[..., Any] | None = None,
               min_calls: int = 50, max_calls: int = 2000, target_s: float = 1.0, warmup_s: float = 0.2,
               bursts: int = 10) -> dict[str, Any]:
    """Per-call times (ms) of ``fn`` over rotated input sets, calls back to back in ``bursts`` bursts (CUDA events
    on cuda, wall clock on cpu). With ``reference`` (eager), its bursts alternate with ``fn``'s (A B B A ...), so that
    a drift of the host moves both alike: ``eager_ms`` is its median."""
    import torch

    device = next((t.device for t in sets[0] if isinstance(t, torch.Tensor)), torch.device("cpu"))
    with torch.no_grad():
        per_call = max(_warm_up(f, sets, device, max_calls=max_calls, warmup_s=warmup_s)
                       for f in (fn, reference) if f is not None)
        calls = int(min(max_calls, max(min_calls, target_s / max(per_call, 1e-6))))
        size = max(1, calls // bursts)
        fns = [fn] if reference is None else [fn, reference]
        times: list[list[float]] = [[] for _ in fns]
        for b in range(bursts):
            for n in range(len(fns)) if b % 2 == 0 else reversed(range(len(fns))):
                times[n] += _burst(fns[n], sets, b * size, size, device)
    q = statistics.quantiles(times[0], n=10)
    result = {"ms": statistics.median(times[0]), "p10_ms": q[0], "p90_ms": q[-1], "calls": size * bursts,
              "copies": len(sets), "timer": "cuda events" if device.type == "cuda" else "wall clock"}
    if reference is not None:
        result["eager_ms"] = statistics.median(times[1])
    return result


def _warm_up(fn: Callable[..., Any], sets: Sequence[tuple[Any, ...]], device: Any, *, max_calls: int,
             warmup_s: float) -> float:
    """Calls ``fn`` for ``warmup_s`` (at least 3 calls): seconds per call after the first 3."""
    warm, warm_start, start = 0, 0, time.perf_counter()
    while warm < 3 or (time.perf_counter() - start < warmup_s and warm < max_calls):
        fn(*sets[warm % len(sets)])
        warm += 1
        if warm == 3:
            _sync(device)
            start = time.perf_counter()
            warm_start = warm
    _sync(device)
    return (time.perf_counter() - start) / max(warm - warm_start, 1)


def _burst(fn: Callable[..., Any], sets: Sequence[tuple[Any, ...]], first: int, calls: int, device: Any) -> list[float]:
    import torch

    if device.type != "cuda":
        times = []
        for i in range(first, first + calls):
            t0 = time.perf_counter()
            fn(*sets[i % len(sets)])
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for i, (begin, end) in enumerate(events, first):
        begin.record()
        fn(*sets[i % len(sets)])
        end.record()
    torch.cuda.synchronize()
    return [begin.elapsed_time(end) for begin, end in events]


def measure(fn: Callable[..., Any], module: Any, inputs: Sequence[Any], *, compile_s: float | None = None,
            first_output: Any = None, **extra: Any) -> dict[str, Any]:
    """Time ``fn`` (already called once) over rotated inputs and check it against eager ``module`` on two sets."""
    import torch

    sets = input_sets(inputs)
    result: dict[str, Any] = {"compile_s": compile_s, **extra}
    with torch.no_grad():
        errs = []
        for s in (sets[0], sets[-1]):
            ref = module(*s)
            out = fn(*s)
            errs.append(max_rel_err(out, ref))
            del out, ref
        if first_output is not None:
            errs.append(max_rel_err(first_output, module(*sets[0])))
    result["max_rel_err"] = max(errs)
    result.update(time_calls(fn, sets, reference=None if fn is module else module))
    return result


# -- columns -----------------------------------------------------------------------------------------------------


@column("eager")
def eager_column(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
    return measure(module, module, inputs)


def _fresh_inductor(tmp: str) -> None:
    """Cold compile: new inductor and Triton cache dirs, no dynamo or in-memory inductor caches left."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
    torch._dynamo.reset()
    try:
        from torch._inductor.utils import clear_inductor_caches

        clear_inductor_caches()
    except ImportError:  # older torch
        pass


def compile_column(mode: str) -> Column:
    def run(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
        import torch

        with tempfile.TemporaryDirectory(prefix="inductor-") as tmp:
            _fresh_inductor(tmp)
            compiled = torch.compile(module, mode=mode)
            out, seconds = first_call(compiled, inputs)
            out = [t.clone() for t in _flat(out)]  # cudagraph trees may reuse the output's memory
            result = measure(compiled, module, inputs, compile_s=seconds, first_output=out, mode=mode)
            torch._dynamo.reset()
            return result
    return run


column("default")(compile_column("default"))
column("max-autotune")(compile_column("max-autotune"))


@column("tunebank")
def tunebank_column(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
    """``tunebank.compile`` transferring from a copy of the database at ``$TUNEBANK_E2E_DB`` (built from a recording
    whose models exclude this one), so no model sees what another held-out model stored; a fresh data dir per model
    (cold kernel cache, encoder fitted from that database). compile_s: cold seconds to optimize."""
    return _tunebank(module, inputs)


@column("tunebank-warm")
def tunebank_warm_column(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
    """The ``tunebank`` column again, right after it in the same process: a fresh data dir and database copy (cold
    kernel cache, nothing stored), on a machine that has optimized before (CuPy's compiled kernels of the reference
    evaluator and the output check cached on disk, modules imported), as a user's machine is from its second model
    on. Run it after the ``tunebank`` column (``--columns tunebank,tunebank-warm``)."""
    return _tunebank(module, inputs)


def _tunebank(module: Any, inputs: tuple[Any, ...]) -> dict[str, Any]:
    import shutil

    import tunebank
    from tunebank.settings import Settings

    # imported before the clock, as the compile columns have it (_fresh_inductor's torch._dynamo.reset() imports it
    # before theirs): the capture, torch.export, runs on dynamo, whose first import took 2.5-2.9 s of the first model
    importlib.import_module("torch._dynamo")
    with tempfile.TemporaryDirectory(prefix="tunebank-") as tmp:
        shutil.copy(os.environ["TUNEBANK_E2E_DB"], Path(tmp) / "tunebank.db")
        settings = Settings(data_dir=Path(tmp))
        start = time.perf_counter()
        fast = tunebank.compile(module, inputs, settings=settings, compare_compile=False)
        optimize_s = time.perf_counter() - start
        out, _ = first_call(fast, inputs)
        out = [t.clone() for t in _flat(out)]
        report = fast.plan.report
        summary = {"kernels": fast.plan.kernels, "attentions": fast.plan.attentions, "steps": len(fast.plan.steps),
                   "measured": report.get("measured"), "model_fallback": report.get("model_fallback"),
                   "stages_s": report.get("stages_s"), "sources": _sources(report),
                   "built_ahead": report.get("built_ahead"), "step_impls": [step.impl for step in fast.plan.steps],
                   "ways_s": report.get("ways_s"),
                   "attention_trials": report.get("attentions"), "subgraphs": _subgraph_rows(report)}
        result = measure(fast, module, inputs, compile_s=optimize_s, first_output=out, **summary)
        # a plan that wanted a CUDA graph but runs without one: a capture failed (PlanModule._replay)
        result["graph_lost"] = fast.device.type == "cuda" and fast.plan.cuda_graph and not fast.use_cuda_graph
        return result


def _subgraph_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per distinct subgraph: what was chosen (and its recipe), its times, the candidates tried (origin, recipe,
    seconds or error kind) and the neighbours they came from (hash, distance, the device that lent its recipe)."""
    return [{"ops": "+".join(r["ops"]), "hash": r["structural_hash"], "source": r["source"], "choice": r["choice"],
             "recipe": r.get("recipe"), "kernel_s": r["kernel_s"], "eager_s": r["eager_s"],
             "tried": len(r.get("candidates") or ()),
             "candidates": [[c["origin"], c["recipe"], c["seconds"] if c["error"] is None else c["error"]]
                            for c in r.get("candidates") or ()],
             "neighbours": [[n["structural_hash"], n["distance"], n.get("lent_by")] for n in r.get("neighbours") or ()]}
            for r in report.get("subgraphs", [])]


def _sources(report: dict[str, Any]) -> dict[str, int]:
    """How many distinct subgraphs were hits / transfers and which ran a kernel or eager."""
    counts: dict[str, int] = {}
    for row in report.get("subgraphs", []):
        key = f"{row['source']}, {row['choice']}"
        counts[key] = counts.get(key, 0) + 1
    return counts


# -- the checkpoint ------------------------------------------------------------------------------------------------


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device_kind": device}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                   cudnn_tf32=torch.backends.cudnn.allow_tf32,
                   float32_matmul_precision=torch.get_float32_matmul_precision())
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    else:
        env.update(device=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


class Checkpoint:
    """``{"schema", "runs": [...], "results": {model: {column: entry}}}``, saved atomically after each change."""

    def __init__(self, path: Path | None, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.data = data or {"schema": SCHEMA, "runs": [], "results": {}}
        self.lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> dict[str, Any]:
        data = json.loads(Path(path).read_text())
        if data.get("schema") != SCHEMA:
            raise SystemExit(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA}")
        return data

    def entry(self, model: str, col: str) -> dict[str, Any] | None:
        return self.data["results"].get(model, {}).get(col)

    def put(self, model: str, col: str, entry: dict[str, Any]) -> None:
        with self.lock:
            self.data["results"].setdefault(model, {})[col] = entry
            self.save_locked()

    def save_locked(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, self.path)

    def mark_running_as_unfinished(self, note: str) -> None:
        for cols in self.data["results"].values():
            for col, entry in cols.items():
                if entry.get("status") == "running":
                    cols[col] = {**entry, "status": "unfinished", "note": note}


def merge(checkpoints: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint of several: their runs (each once, by date), and for each (model, column) the entry that
    started last (an entry without a start, e.g. one never run, loses to any that has one)."""
    runs = {(r["date"], r["command"]): r for data in checkpoints for r in data["runs"]}
    results: dict[str, dict[str, Any]] = {}
    for data in checkpoints:
        for model, cols in data["results"].items():
            for col, entry in cols.items():
                held = results.setdefault(model, {}).get(col)
                if held is None or entry.get("started", "") > held.get("started", ""):
                    results[model][col] = entry
    return {"schema": SCHEMA, "runs": sorted(runs.values(), key=lambda r: r["date"]), "results": results}


def todo(ckpt: Checkpoint, models: Sequence[str], columns: Sequence[str], *, retry_unfinished: bool = False,
         retry_errors: bool = False) -> list[tuple[str, str]]:
    """The (model, column) pairs the checkpoint lacks, model by model."""
    out = []
    for model in models:
        for col in columns:
            entry = ckpt.entry(model, col)
            status = entry.get("status") if entry else None
            if (entry is None or status == "running" or (status == "unfinished" and retry_unfinished)
                    or (status == "error" and retry_errors)):
                out.append((model, col))
    return out


def run(ckpt: Checkpoint, pairs: Sequence[tuple[str, str]], *, build: Callable[[str], tuple[Any, tuple[Any, ...]]],
        columns: dict[str, Column], env: dict[str, Any], deadline_s: float | None = None,
        log: Callable[[str], None] = print) -> int:
    """Measure ``pairs`` into ``ckpt``; 0 when all were measured, 3 when the deadline stopped it."""
    start = time.monotonic()
    current: dict[str, Any] = {}
    stopped = threading.Event()

    def watchdog() -> None:
        assert deadline_s is not None
        if stopped.wait(max(0.0, deadline_s - (time.monotonic() - start))):
            return
        with ckpt.lock:
            if current:
                entry = {"status": "unfinished", "seconds": round(time.monotonic() - current["t0"], 1),
                         "started": current["started"], "note": f"stopped at the {deadline_s:.0f} s deadline",
                         "device": env.get("device")}
                ckpt.data["results"].setdefault(current["model"], {})[current["column"]] = entry
            ckpt.save_locked()
        log(f"deadline {deadline_s:.0f} s: stopped during {current.get('model')} / {current.get('column')}")
        sys.stdout.flush()
        os._exit(3)

    if deadline_s is not None:
        threading.Thread(target=watchdog, daemon=True).start()
    built: tuple[str, Any] | None = None
    try:
        for model, col in pairs:
            if built is None or built[0] != model:
                if built is not None:
                    built = None
                    _free()
                built = (model, build(model))
            module, inputs = built[1]
            started = utc_now()
            with ckpt.lock:
                current.update(model=model, column=col, t0=time.monotonic(), started=started)
            ckpt.put(model, col, {"status": "running", "started": started, "device": env.get("device")})
            try:
                entry = {"status": "ok", **columns[col](module, inputs)}
            except Exception as exc:  # recorded, the run goes on
                entry = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            entry.update(started=started, seconds=round(time.monotonic() - current["t0"], 1), device=env.get("device"))
            with ckpt.lock:
                current.clear()
            ckpt.put(model, col, entry)
            log(f"{model} / {col}: {_cell(entry)}" + (f" (compile {entry['compile_s']:.1f} s)"
                                                       if entry.get("compile_s") else ""))
    finally:
        stopped.set()
    return 0


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the report ------------------------------------------------------------------------------------------------------


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    status = entry.get("status")
    if status == "ok":
        return f"{entry['ms']:.4g}"
    if status == "unfinished":
        return f"unfinished (>{entry.get('seconds', 0):.0f} s)" if entry.get("seconds") else "unfinished"
    if status == "error":
        return "error"
    return str(status)


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def report(data: dict[str, Any], *, origin: Callable[[str], str] | None = None,
           fastest_of: Sequence[dict[str, Any]] = ()) -> str:
    """The markdown table of a checkpoint: per model and column ms, speedup vs eager, compile s, max rel err; the
    geomean speedups, and tunebank's over each other column by absolute time; with ``fastest_of`` (other checkpoints
    of the same device), also over each model's fastest time of that column in any of them and this one."""
    results: dict[str, dict[str, Any]] = data["results"]
    present = {c for cols in results.values() for c in cols}
    cols = [c for c in COLUMNS if c in present] + sorted(present - set(COLUMNS))
    lines = ["# Whole-model time: eager, torch.compile and tunebank (`bench/optimize_e2e.py`)", ""]
    for r in data["runs"]:
        env = r.get("env", {})
        lines.append(f"- {r.get('date', '?')}: {env.get('device', '?')}, torch {env.get('torch', '?')}, "
                     f"triton {env.get('triton', '-')}, CUDA {env.get('cuda', '-')}, commit {r.get('commit') or '?'}; "
                     f"columns {','.join(r.get('columns', []))}; `{r.get('command', '')}`")
    lines += ["", "Median whole-model ms of one call, calls back to back (CUDA events; wall clock on cpu; rotated "
              "input copies past L2), fp32; in brackets eager ms / column ms (> 1: faster than eager), eager timed "
              "in turn with the column where the entry has its own eager_ms (bursts alternating, so a drift of the "
              "host moves both alike); compile: cold seconds of the first call; err: max |out - eager| / max |eager|.",
              ""]
    head = ["model", "origin"]
    for c in cols:
        head += [f"{c} ms"] if c == "eager" else [f"{c} ms (x eager)", f"{c} compile s", f"{c} err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    speedups: dict[str, list[float]] = {c: [] for c in cols}
    for model, entries in results.items():
        eager = entries.get("eager")
        eager_ms = eager["ms"] if eager and eager.get("status") == "ok" else None
        row = [model, origin(model) if origin else ""]
        for c in cols:
            e = entries.get(c)
            if c == "eager":
                row.append(_cell(e))
                continue
            cell = _cell(e)
            paired_ms = e.get("eager_ms", eager_ms) if e else None  # eager timed in turn with the column
            if e and e.get("status") == "ok" and paired_ms:
                speedups[c].append(paired_ms / e["ms"])
                cell += f" ({paired_ms / e['ms']:.2f}x)"
            ok = bool(e) and e.get("status") == "ok"
            row += [cell, f"{e['compile_s']:.1f}" if ok and e.get("compile_s") is not None else "-",
                    f"{e['max_rel_err']:.1e}" if ok and e.get("max_rel_err") is not None else "-"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for c in cols:
        g = _geomean(speedups[c])
        if c != "eager" and g is not None:
            lines.append(f"- {c}: geomean speedup over eager {g:.2f}x over {len(speedups[c])} models "
                         f"(min {min(speedups[c]):.2f}x, max {max(speedups[c]):.2f}x)")
    lines += _tunebank_by_ms(results, cols)
    if fastest_of:
        lines += _tunebank_by_fastest(results, cols, [data, *fastest_of])
    lost = [f"{m} / {c}" for m, es in results.items() for c, e in es.items() if e.get("graph_lost")]
    if lost:
        lines += ["", f"Ran without their plan's CUDA graph (a capture failed): {', '.join(lost)}"]
    problems = [f"{m} / {c}: {e.get('status')}: {e.get('error') or e.get('note', '')}"
                for m, es in results.items() for c, e in es.items() if e.get("status") not in ("ok",)]
    problems += [f"{m} / {c}: not run" for m, es in results.items() for c in cols if c not in es]
    if problems:
        lines += ["", "Not measured:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def _tunebank_by_ms(results: dict[str, dict[str, Any]], cols: Sequence[str]) -> list[str]:
    """tunebank against each other compiled column by absolute time (column ms / tunebank ms, > 1: tunebank faster),
    over the models where both ran: the comparison that holds when the columns' paired eagers ran on differently
    loaded hosts (columns with a CUDA graph are GPU-bound; a merged checkpoint may hold them from different calls)."""
    out = []
    for c in cols:
        if c == "eager" or c.startswith("tunebank"):
            continue
        ratios = [es[c]["ms"] / es["tunebank"]["ms"] for es in results.values()
                  if es.get(c, {}).get("status") == "ok" and es.get("tunebank", {}).get("status") == "ok"]
        g = _geomean(ratios)
        if g is not None:
            out.append(f"- tunebank over {c} by ms: geomean {g:.2f}x over {len(ratios)} models "
                       f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    return out


def _tunebank_by_fastest(results: dict[str, dict[str, Any]], cols: Sequence[str],
                         checkpoints: Sequence[dict[str, Any]]) -> list[str]:
    """tunebank (``results``) over each model's fastest time of each other compiled column any of ``checkpoints``
    (of one device) holds: the comparison that favours the other column where a call's host slowed it, e.g. a
    launch-bound block without a graph beside another call's compiles. Models below 1x are named."""
    devices = {e.get("device") for c in checkpoints for es in c["results"].values() for e in es.values()} - {None}
    if len(devices) > 1:
        raise SystemExit(f"--fastest-of mixes devices: {sorted(devices)}")
    present = {c for checkpoint in checkpoints for es in checkpoint["results"].values() for c in es}
    out = []
    for c in [*cols, *sorted(present - set(cols))]:
        if c == "eager" or c.startswith("tunebank"):
            continue
        fastest: dict[str, float] = {}
        for checkpoint in checkpoints:
            for model, entries in checkpoint["results"].items():
                e = entries.get(c, {})
                if e.get("status") == "ok":
                    fastest[model] = min(e["ms"], fastest.get(model, math.inf))
        ratios = {m: fastest[m] / es["tunebank"]["ms"] for m, es in results.items()
                  if m in fastest and es.get("tunebank", {}).get("status") == "ok"}
        g = _geomean(list(ratios.values()))
        if g is not None:
            below = ", ".join(f"{m} {r:.2f}x" for m, r in ratios.items() if r < 1) or "none"
            out.append(f"- tunebank over {c} by ms, each model's fastest {c} of {len(checkpoints)} checkpoints: "
                       f"geomean {g:.3f}x over {len(ratios)} models (min {min(ratios.values()):.2f}x, max "
                       f"{max(ratios.values()):.2f}x); below 1x: {below}")
    return out


def _origin(model: str) -> str:
    from bench import e2e_models

    return "new" if e2e_models.is_new(model) else "zoo"


def main(argv: Sequence[str] | None = None) -> int:
    from bench import e2e_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(e2e_models.MODELS), help="comma-separated (bench/e2e_models.py)")
    parser.add_argument("--columns", default="eager,default,max-autotune", help=f"of {','.join(COLUMNS)}")
    parser.add_argument("--out", type=Path, help="PREFIX: writes PREFIX.json (the checkpoint) and PREFIX.md")
    parser.add_argument("--resume", type=Path, help="a checkpoint JSON: only missing (model, column) are measured")
    parser.add_argument("--report", type=Path, help="write the markdown of this JSON (to --out PREFIX.md) and exit")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="FILE",
                        help="checkpoints to combine into --out PREFIX (the entry started last wins) and exit")
    parser.add_argument("--fastest-of", type=Path, nargs="+", metavar="FILE", default=[],
                        help="with --report: also compare tunebank with each model's fastest time of every other "
                             "column in these checkpoints (same device) and the reported one")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--deadline", type=float, help="seconds: stop before this, recording the pair in flight")
    parser.add_argument("--retry-unfinished", action="store_true")
    parser.add_argument("--retry-errors", action="store_true")
    parser.add_argument("--commit", help="commit of the code measured (default: git rev-parse, where git works)")
    args = parser.parse_args(argv)

    if args.merge:
        if not args.out:
            parser.error("--merge needs --out PREFIX")
        merged = merge([Checkpoint.load(f) for f in args.merge])
        Path(f"{args.out}.json").write_text(json.dumps(merged, indent=1) + "\n")
        args.report = Path(f"{args.out}.json")
    if args.report:
        text = report(Checkpoint.load(args.report), origin=_origin,
                      fastest_of=[Checkpoint.load(f) for f in args.fastest_of])
        if args.out:
            Path(f"{args.out}.md").write_text(text)
        print(text)
        return 0
    columns = [c for c in args.columns.split(",") if c]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        parser.error(f"unknown columns {unknown}; known: {list(COLUMNS)}")
    models = [m for m in args.models.split(",") if m]
    path = Path(f"{args.out}.json") if args.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
    data = Checkpoint.load(args.resume) if args.resume else None
    ckpt = Checkpoint(path, data)
    ckpt.mark_running_as_unfinished("the call that measured it ended before it finished")
    env = environment(args.device)
    devices = {e.get("device") for cols in ckpt.data["results"].values() for e in cols.values()} - {None}
    if devices - {env["device"]}:
        raise SystemExit(f"the checkpoint holds results of {sorted(devices)}, this is {env['device']}")
    pairs = todo(ckpt, models, columns, retry_unfinished=args.retry_unfinished, retry_errors=args.retry_errors)
    ckpt.data["runs"].append({"date": utc_now(), "commit": args.commit or _commit(), "env": env, "columns": columns,
                              "command": " ".join(["bench/optimize_e2e.py", *(argv if argv is not None
                                                                              else sys.argv[1:])]),
                              "pairs": len(pairs)})
    with ckpt.lock:
        ckpt.save_locked()
    print(f"{env['device']}, torch {env['torch']}: {len(pairs)} (model, column) pairs to measure", flush=True)
    code = run(ckpt, pairs, build=lambda m: e2e_models.build(m, args.device), columns=COLUMNS, env=env,
               deadline_s=args.deadline)
    text = report(ckpt.data, origin=_origin)
    if args.out:
        Path(f"{args.out}.md").write_text(text)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
