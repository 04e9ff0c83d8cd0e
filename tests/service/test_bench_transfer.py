"""The transfer benchmark harness: one real (small) cpu run, its exact replay, and the comparison of transfer
with the default recipe and random picks on a recorded cpu measurement table."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from embed.partition import partition
from service.bench_report import report_json, report_markdown, table
from service.bench_transfer import ORACLE, BenchConfig, load_graph, run_bench
from service.measure import (
    Checkpoint,
    MeasurementTable,
    Measurer,
    MissingMeasurementError,
    RunStopped,
    live_measurer,
)
from tests.service.conftest import DEVICE, synthetic_seconds, transfer_cli
from transforms.compilers.cpu import toolchain_id
from transforms.results import RunResult
from transforms.run import Worker
from transforms.tune import make_task

DATA = Path(__file__).parent / "data"
ENCODERS = ("static", "static+profiled", "learned")
REAL = BenchConfig(models=("lm_head-h64-v256-t32", "cnn_head-c32-i7-b1", "gcn-n256-f32-d0.01"), budget=4, ks=(1, 2),
                   encoders=(*ENCODERS, ORACLE))


def test_real_cpu_run_stopped_resumed_and_replayed_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # kernel workers: steadier timings on a shared machine
    saved: list[dict] = []
    ticks = iter(range(10**6))  # a clock that advances one second per live measurement
    checkpoint = Checkpoint(lambda table: saved.append(table.to_json()), every_s=3, stop_after_s=12,
                            clock=lambda: next(ticks))
    with Worker() as worker:
        first = live_measurer(MeasurementTable(DEVICE, toolchain_id()), backend="cpu", cache_dir=tmp_path / "k",
                              worker=worker, repeats=3, checkpoint=checkpoint)
        with pytest.raises(RunStopped, match="stopped after 12 s"):
            run_bench(REAL, first, workdir=tmp_path / "first")
        partial = MeasurementTable.from_json(json.loads(json.dumps(saved[-1])))
        assert len(saved) == 4 and 0 < partial.size == first.table.size == first.evaluations
        measurer = live_measurer(MeasurementTable.from_json(json.loads(json.dumps(saved[-1]))), backend="cpu",
                                 cache_dir=tmp_path / "k", worker=worker, repeats=3)
        outcomes = run_bench(REAL, measurer, workdir=tmp_path)
    assert measurer.evaluations == measurer.table.size - partial.size  # nothing measured twice
    assert all(measurer.table.results[key][r] == v for key, done in partial.results.items() for r, v in done.items())
    assert len(outcomes) == 9 and {o.model for o in outcomes} == set(REAL.models)
    for o in outcomes:
        assert set(o.transfer) == {*ENCODERS, ORACLE} and set(o.random) == {1, 2}
        for per_k in o.transfer.values():
            for k, t in per_k.items():
                assert 1 <= t["evaluations"] <= k + 1 and len(t["neighbours"]) <= k
                assert t["s"] == measurer.table.results[o.key][t["winner"]]  # the winner's own recorded time
        measured = [v for v in measurer.table.results[o.key].values() if not isinstance(v, str)]
        assert o.optimum_s == min(measured) and o.space_size > 1000 and o.searched == REAL.budget + 1
    report = json.loads(json.dumps(report_json(outcomes, REAL, measurer), allow_nan=False))
    rows = {(r["method"], r["encoder"], r["k"]): r for r in report["table"]}
    assert rows[("default recipe", "-", None)]["evaluations"] == 1.0
    assert 0 < rows[("transfer", "learned", 2)]["fraction_of_optimum"] <= 1.0
    markdown = report_markdown(outcomes, REAL, measurer)
    assert "| transfer | static+profiled | random | 2 |" in markdown and "| contraction | 4 | " in markdown

    replay = Measurer(MeasurementTable.from_json(report["measurements"]))
    again = run_bench(REAL, replay, workdir=tmp_path / "replay")
    assert replay.evaluations == 0
    assert [asdict(o) for o in again] == [asdict(o) for o in outcomes]
    with pytest.raises(MissingMeasurementError, match="has no measurement"):
        run_bench(BenchConfig(models=REAL.models, budget=5, ks=(1,)), replay, workdir=tmp_path / "other")
    # without fill, the neighbours ranked by their measured transfer bound every encoder, subgraph by subgraph
    bounded = run_bench(replace(REAL, fill=False), replay, workdir=tmp_path / "no-fill")
    assert replay.evaluations == 0
    for o in bounded:
        for k in REAL.ks:
            assert o.transfer[ORACLE][k]["s"] <= min(o.transfer[e][k]["s"] for e in ENCODERS)
        # its neighbours are ranked by their recipe's recorded time on the held-out subgraph, fastest first
        ranked = o.transfer[ORACLE][max(REAL.ks)]["neighbours"]
        times = [n["distance"] for n in ranked]
        assert times == sorted(times) and times == [replay.table.results[o.key][n["recipe"]] for n in ranked]
    assert sum(bool(o.transfer[ORACLE][max(REAL.ks)]["neighbours"]) for o in bounded) >= len(bounded) // 2


def test_transfer_beats_default_and_random_picks_on_a_recorded_cpu_table() -> None:
    # Recorded with `tunebank bench transfer` on this project's 2-core development machine (OMP_NUM_THREADS=1):
    # 4 models, 32 held-out subgraphs, evolutionary search of 16 recipes each, cross table, random and transfer picks.
    recording = json.loads((DATA / "transfer_cpu_replay.json").read_text())
    config = BenchConfig(**{**recording["config"], "models": tuple(recording["config"]["models"]),
                            "ks": tuple(recording["config"]["ks"]), "encoders": tuple(recording["config"]["encoders"]),
                            "held_out": None})
    measurer = Measurer(MeasurementTable.from_json(recording["measurements"]))
    outcomes = run_bench(config, measurer)
    assert measurer.evaluations == 0 and len(outcomes) == 32
    rows = {(r.method, r.encoder, r.k): r for r in table(outcomes, config)}
    default, random5 = rows[("default recipe", "-", None)], rows[("random", "-", 5)]
    # the replay is exact: what the recording gave (to 0.01 of the optimum), each k from its own k neighbours
    assert (default.fraction_of_optimum, random5.fraction_of_optimum) == pytest.approx((0.211, 0.397), abs=0.01)
    recorded = {"static": (0.619, 0.759, 0.790), "static+profiled": (0.616, 0.765, 0.790),
                "learned": (0.593, 0.778, 0.788)}
    for encoder in config.encoders:
        fractions = [rows[("transfer", encoder, k)].fraction_of_optimum for k in config.ks]
        assert min(a - b for a, b in zip(fractions, recorded[encoder], strict=True)) > -0.01, (encoder, fractions)
        transfer5 = rows[("transfer", encoder, 5)]
        assert transfer5.fraction_of_optimum > 3.5 * default.fraction_of_optimum
        assert transfer5.fraction_of_optimum > 1.9 * random5.fraction_of_optimum
        assert transfer5.evaluations == random5.evaluations == 6  # k + 1: random recipes fill what neighbours leave
        assert transfer5.speedup_vs_default > 3.5
        for o in outcomes:  # the recording's database holds 4 other layout subgraphs and at least 5 of each kind
            available = 4 if o.kind == "layout" else 5
            assert [len(o.transfer[encoder][k]["neighbours"]) for k in config.ks] == [min(k, available)
                                                                                      for k in config.ks]


def test_cli_replays_a_recording(tmp_path: Path) -> None:
    app = transfer_cli()
    recording = json.loads((DATA / "transfer_cpu_replay.json").read_text())["config"]
    out = tmp_path / "r"
    result = CliRunner().invoke(app, [
        "--models", ",".join(recording["models"]), "--budget", "16", "--k", "1,3,5", "--encoders", "static",
        "--held-out", "lm_head-h128-v512-t64", "--replay", str(DATA / "transfer_cpu_replay.json"), "--out", str(out),
        "--encoder-seed", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert len(report["held_out"]) == 2 and report["kernels_run"] == 0
    assert (report["config"]["seed"], report["config"]["encoder_seed"]) == (0, 3)  # the measurements keep seed 0
    assert (replace(REAL, seed=2).training_seed, replace(REAL, seed=2, encoder_seed=0).training_seed) == (2, 0)
    assert "| transfer | static | random | 5 |" in out.with_suffix(".md").read_text()
    bad = CliRunner().invoke(app, ["--models", "a", "--replay", "x.json"])
    assert bad.exit_code == 2 and "at least 2 models" in bad.output
    missing = CliRunner().invoke(app, ["--models", ",".join(recording["models"]), "--budget", "3",
                                       "--replay", str(DATA / "transfer_cpu_replay.json"), "--out", str(out)])
    assert missing.exit_code == 2 and "the recording has no measurement" in missing.output


def test_cli_stops_at_its_time_limit_and_resumes_from_the_checkpoint(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path / "data"))
    app = transfer_cli()
    checkpoint, out = tmp_path / "partial.json", tmp_path / "r"
    tiny = ["--models", "lm_head-h64-v256-t32,cnn_head-c32-i7-b1", "--budget", "2", "--k", "1", "--encoders", "static",
            "--repeats", "2", "--checkpoint", str(checkpoint), "--out", str(out)]
    stopped = CliRunner().invoke(app, [*tiny, "--stop-after", "0.001"])
    assert stopped.exit_code == 3 and f"continue with --resume {checkpoint}" in stopped.output
    assert len(json.loads(checkpoint.read_text())["runs"]) == 1 and not out.with_suffix(".json").exists()
    resumed = CliRunner().invoke(app, [*tiny, "--resume", str(checkpoint)])
    assert resumed.exit_code == 0, resumed.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["kernels"] for r in report["runs"]] == [0, report["kernels_run"]] and report["kernels_run"] > 10
    assert json.loads(checkpoint.read_text())["measurements"] == report["measurements"]
    assert "| transfer | static | random | 1 |" in out.with_suffix(".md").read_text()

    report["measurements"]["device"]["name"] = "cuda:NVIDIA H200"
    checkpoint.write_text(json.dumps(report))
    other = CliRunner().invoke(app, [*tiny, "--resume", str(checkpoint)])
    assert other.exit_code == 2 and "was measured on cuda:NVIDIA H200" in other.output
    unsaved = CliRunner().invoke(app, ["--models", "a,b", "--stop-after", "60"])
    assert unsaved.exit_code == 2 and "--stop-after needs --checkpoint" in unsaved.output


class _Counting(Measurer):
    """The synthetic measurer (conftest), recording every (subgraph, recipe) it runs."""

    def __init__(self, table: MeasurementTable, runs: list[tuple[str, str]], checkpoint: Checkpoint | None = None):
        super().__init__(table, run=lambda task, recipes: [
            RunResult(ok=True, median_s=synthetic_seconds(task, r), repeats=1) for r in recipes],
            eager_time=lambda task: 1.5e-3, checkpoint=checkpoint)
        self.runs = runs

    def measure(self, task, key, recipes):
        known = self.table.results.get(key, {})
        new = list(dict.fromkeys(str(r) for r in recipes if str(r) not in known))
        results = super().measure(task, key, recipes)
        self.runs.extend((key, r) for r in new)  # after measuring: a run stopped before it measured nothing
        return results


def _counting_measurer(table: MeasurementTable, runs: list[tuple[str, str]],
                       checkpoint: Checkpoint | None = None) -> Measurer:
    return _Counting(table, runs, checkpoint)


FAMILY = BenchConfig(models=("lm_head-h64-v256-t32", "lm_head-h64-v128-t32", "cnn_head-c32-i7-b1"), budget=2,
                     ks=(1, 2), encoders=("static",), split="family")


def test_the_family_split_holds_a_whole_family_out_of_its_database(tmp_path: Path) -> None:
    import sqlite3

    measurer = _counting_measurer(MeasurementTable(DEVICE, "synthetic"), [])
    outcomes = run_bench(FAMILY, measurer, workdir=tmp_path)
    keys = {o.model: set() for o in outcomes}
    for o in outcomes:
        keys[o.model].add(o.key)
    assert {o.fold for o in outcomes} == {"lm_head", "cnn_head"} and len(keys) == 3
    assert {o.model for o in outcomes if o.fold == "lm_head"} == {"lm_head-h64-v256-t32", "lm_head-h64-v128-t32"}
    for fold, held in enumerate((keys["lm_head-h64-v256-t32"] | keys["lm_head-h64-v128-t32"],
                                 keys["cnn_head-c32-i7-b1"])):
        with sqlite3.connect(tmp_path / f"fold{fold}.db") as db:
            stored = {h for (h,) in db.execute("select structural_hash from subgraphs")}
        assert stored and not stored & held  # no model of the held-out family is in its database
        assert stored == set().union(*keys.values()) - held
    # leave-one-model-out keeps the other lm_head in the database of each lm_head fold
    by_model = run_bench(replace(FAMILY, split="model"), measurer, workdir=tmp_path / "model")
    assert {o.fold for o in by_model} == set(FAMILY.models)
    with sqlite3.connect(tmp_path / "model" / "fold0.db") as db:
        stored = {h for (h,) in db.execute("select structural_hash from subgraphs")}
    assert keys["lm_head-h64-v128-t32"] <= stored
    with pytest.raises(ValueError, match="at least 2 families"):
        BenchConfig(models=("lm_head-h64-v256-t32", "lm_head-h64-v128-t32"), split="family")


STRONG = BenchConfig(models=("lm_head-h64-v256-t32", "cnn_head-c32-i7-b1"), budget=2, ks=(1, 2),
                     encoders=("static",), fills=("random", "model", "none"), optimum="strong", strong_budget=8)


def test_a_strong_database_stores_each_subgraphs_strong_search_so_its_best_recipe_is_the_strong_optimum(
        tmp_path: Path) -> None:
    import sqlite3

    from transforms.space import RecipeSpace

    subgraphs = {s.structural_hash: s for m in STRONG.models for s in partition(load_graph(m)) if s.tunable}
    sizes = {key: RecipeSpace(make_task(s).program, "cpu").size() for key, s in subgraphs.items()}
    enumerated = {key for key, size in sizes.items() if size < min(sizes.values()) + 1}  # the smallest space
    stored = {}
    for database in ("crawl", "strong"):
        config = replace(STRONG, exhaustive_below=min(sizes.values()) + 1, database=database)
        outcomes = run_bench(config, _counting_measurer(MeasurementTable(DEVICE, "synthetic"), []),
                             workdir=tmp_path / database)
        optimum = {o.key: o.optimum_s for o in outcomes}
        stored[database] = {}
        for fold in range(len(STRONG.models)):  # leave one model out: the other model's subgraphs are stored
            with sqlite3.connect(tmp_path / database / f"fold{fold}.db") as db:
                stored[database] |= {key: (count, best) for key, count, best in db.execute(
                    "select s.structural_hash, count(*), min(m.median_s) from measurements m"
                    " join subgraphs s on s.id = m.subgraph_id group by s.structural_hash")}
    assert enumerated and enumerated <= set(stored["strong"])
    for key in enumerated:  # its whole space, and so its strong optimum, is in the strong database only
        count, best = stored["strong"][key]
        assert count >= sizes[key] and best == pytest.approx(optimum[key])
        assert stored["crawl"][key][0] < sizes[key]
    assert all(stored["strong"][key][0] > stored["crawl"][key][0] for key in stored["crawl"])
    with pytest.raises(ValueError, match="needs --optimum strong"):
        replace(STRONG, optimum="recorded", database="strong")


def test_the_strong_optimum_is_exhaustive_under_the_threshold_and_resumes_without_remeasuring(tmp_path: Path) -> None:
    from transforms.space import RecipeSpace

    sizes = {o.key: o.space_size for o in run_bench(replace(STRONG, optimum="recorded"),
                                                    _counting_measurer(MeasurementTable(DEVICE, "s"), []))}
    config = replace(STRONG, exhaustive_below=min(sizes.values()) + 1)  # the smallest space is enumerated
    runs: list[tuple[str, str]] = []
    whole = _counting_measurer(MeasurementTable(DEVICE, "synthetic"), runs)
    outcomes = run_bench(config, whole, workdir=tmp_path / "whole")
    assert len(runs) == len(set(runs)) == whole.table.size  # every recipe measured once
    exhaustive = [o for o in outcomes if o.optimum_search == "exhaustive"]
    assert exhaustive and all(sizes[o.key] < config.exhaustive_below for o in exhaustive)
    subgraphs = {s.structural_hash: s for m in config.models for s in partition(load_graph(m))}
    for o in exhaustive:
        every = {str(r) for r in RecipeSpace(make_task(subgraphs[o.key]).program, "cpu").enumerate()}
        assert every <= {r for key, r in runs if key == o.key} and o.recorded >= o.space_size == len(every)
        assert o.optimum_s == min(v for v in whole.table.results[o.key].values())
    for o in outcomes:
        if o.optimum_search == "evolutionary":
            assert o.strong_searched == config.strong_budget  # new recipes beyond its seeds
            assert o.optimum_s <= min(o.transfer[f"static|{f}" if f != "random" else "static"][2]["s"]
                                      for f in ("random", "model", "none"))
    # stopped part-way through the strong search, then resumed from the checkpoint: nothing measured twice, and the
    # same recording as the uninterrupted run
    calls = iter(range(10**6))  # a clock that advances one tick per live measurement call
    count = Checkpoint(lambda table: None, every_s=10**6, clock=lambda: next(calls))
    run_bench(config, _counting_measurer(MeasurementTable(DEVICE, "synthetic"), [], count))
    total = next(calls) - 1
    saved: list[dict] = []
    ticks = iter(range(10**6))
    stop = Checkpoint(lambda table: saved.append(table.to_json()), every_s=10**6, stop_after_s=total // 2,
                      clock=lambda: next(ticks))  # stops mid-run: in the strong search, most of the run's calls
    first: list[tuple[str, str]] = []
    with pytest.raises(RunStopped):
        run_bench(config, _counting_measurer(MeasurementTable(DEVICE, "synthetic"), first, stop),
                  workdir=tmp_path / "first")
    second: list[tuple[str, str]] = []
    resumed = _counting_measurer(MeasurementTable.from_json(json.loads(json.dumps(saved[-1]))), second)
    again = run_bench(config, resumed, workdir=tmp_path / "second")
    assert first and second and not set(first) & set(second)
    assert resumed.table.results == whole.table.results
    assert [asdict(o) for o in again] == [asdict(o) for o in outcomes]
