"""A transfer benchmark measured in shards, stage by stage, is the same run as one measured whole."""

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from embed.partition import partition
from service.bench_report import differences, table
from service.bench_transfer import STAGES, BenchConfig, Shard, TransferBench, family_of, load_graph, run_bench
from service.measure import MeasurementTable, Measurer, ProvisionalReplay
from tests.service.conftest import DEVICE
from transforms.results import RunResult

SHARDED = BenchConfig(models=("lm_head-h64-v256-t32", "lm_head-h64-v128-t32", "cnn_head-c32-i7-b1"), budget=6,
                      ks=(1, 2), encoders=("static",), fills=("random", "model"), split="family", optimum="strong",
                      exhaustive_below=1950, strong_budget=8)


class _Synthetic(Measurer):
    """Times that are a pseudo-random function of (subgraph, recipe), so that every subgraph has its own best recipe
    and the cross table depends on which subgraphs were tuned; ``runs`` gets every (subgraph, recipe) it runs."""

    def __init__(self, table: MeasurementTable, runs: list[tuple[str, str]]) -> None:
        super().__init__(table, run=lambda task, recipes: [
            RunResult(ok=True, median_s=self._seconds(r), repeats=1) for r in recipes], eager_time=lambda task: 1.5e-3)
        self.runs, self.key = runs, ""

    def _seconds(self, recipe) -> float:
        return 1e-3 * (1 + hashlib.sha256(f"{self.key}|{recipe}".encode()).digest()[0] / 255)

    def measure(self, task, key, recipes):
        known = self.table.results.get(key, {})
        self.runs.extend((key, r) for r in dict.fromkeys(str(r) for r in recipes if str(r) not in known))
        self.key = key
        return super().measure(task, key, recipes)





def test_shards_deal_every_item_once_largest_first_to_the_lightest_part() -> None:
    costs = {"a": 5, "b": 4, "c": 3, "d": 3, "e": 1}
    # by hand: a(5)->0; b(4)->1; c(3)->1 (4 < 5): 7; d(3)->0: 8; e(1)->1 (7 < 8): 8
    parts = [Shard("cross", n, 2).part(list(costs), costs.__getitem__) for n in range(2)]
    assert parts == [["a", "d"], ["b", "c", "e"]]
    for bad in (("folds", 4, 4), ("search", 0, 2), ("folds", -1, 2)):
        with pytest.raises(ValueError, match="shard"):
            Shard(*bad)


@pytest.mark.parametrize("config, count", [
    (replace(SHARDED, exhaustive_below=0), 2),  # same-kind subgraphs in both shards: the cross table needs them all
    (SHARDED, 3),  # the enumerated strong optimum's subgraph is one shard's alone, the rest are dealt to two
], ids=["evolutionary", "both"])
def test_a_run_measured_in_shards_replays_as_the_run_measured_whole(config: BenchConfig, count: int,
                                                                    tmp_path: Path) -> None:
    whole_runs: list[tuple[str, str]] = []
    whole = _Synthetic(MeasurementTable(DEVICE, "synthetic"), whole_runs)
    outcomes = run_bench(config, whole, workdir=tmp_path / "whole")

    merged = {1: MeasurementTable(DEVICE, "synthetic"), count: MeasurementTable(DEVICE, "synthetic")}
    measured: dict[tuple[str, int, int], set[tuple[str, str]]] = {}
    for stage in STAGES:
        for parts in (1, count):
            for n in range(parts):
                runs: list[tuple[str, str]] = []
                table = MeasurementTable.from_json(json.loads(json.dumps(merged[parts].to_json())))
                shard = Shard(stage, n, parts)
                assert run_bench(config, _Synthetic(table, runs), workdir=tmp_path / str(shard), shard=shard) == []
                measured[stage, parts, n] = set(runs)
                merged[parts].merge(table)
        parts = [measured[stage, count, n] for n in range(count)]
        # the stage measures in shards what it measures whole, each shard its own part
        assert measured[stage, 1, 0] == set().union(*parts) and sum(map(len, parts)) == len(measured[stage, 1, 0])
        if stage != "folds":  # a subgraph held out by two folds may be measured in both
            keys = [{key for key, _ in part} for part in parts]
            assert all(keys) and sum(map(len, keys)) == len(set().union(*keys))
    assert merged[count].results == whole.table.results and merged[count].eager == whole.table.eager
    assert set().union(*measured.values()) == set(whole_runs)

    replay = Measurer(merged[count])
    again = run_bench(config, replay, workdir=tmp_path / "replay")
    assert replay.evaluations == 0
    assert [asdict(o) for o in again] == [asdict(o) for o in outcomes]
    assert {o.optimum_search for o in again} == ({"exhaustive", "evolutionary"} if count == 3 else {"evolutionary"})


def test_a_later_stage_alone_measures_what_the_earlier_stages_lack(tmp_path: Path) -> None:
    config = replace(SHARDED, optimum="recorded")
    alone = _Synthetic(MeasurementTable(DEVICE, "synthetic"), [])
    run_bench(config, alone, shard=Shard("cross", 0, 1))
    whole = TransferBench(config, _Synthetic(MeasurementTable(DEVICE, "synthetic"), []), workdir=tmp_path)
    whole.run()
    assert set(alone.table.results) == set(whole.tasks)
    for key, results in alone.table.results.items():  # every subgraph's own search, then its cross table
        wanted = {r for r, _ in whole.own[key]} | set(whole.cross[key].values())
        assert len(whole.own[key]) == config.budget + 1 and wanted <= set(results)
        assert all(results[r] == whole.measurer.table.results[key][r] for r in results)


def test_model_files_name_their_family_and_load_as_ir_json(tmp_path: Path) -> None:
    graph = load_graph("lm_head-h64-v256-t32")
    path = tmp_path / "lm_head-h64-v256-t32.json"
    path.write_text(graph.to_json())
    assert family_of(str(path)) == family_of("zoo:lm_head-h64-v256-t32") == "lm_head"
    assert family_of("models/t5_block-h768-s256-b8.onnx") == "t5_block"
    hashes = [s.structural_hash for s in partition(graph)]
    assert [s.structural_hash for s in partition(load_graph(str(path)))] == hashes


def test_with_library_every_method_is_given_the_vendor_convolutions(tmp_path: Path) -> None:
    # the cuda space (computed on the host; the times are synthetic): a convolution's library alternatives are cuDNN's
    config = BenchConfig(models=("resnet_basic-c8-i8-b1", "resnet_stem-i32-b1", "lm_head-h64-v256-t32"),
                         backend="cuda", budget=2, ks=(1, 2), encoders=("static",), library=True)
    measurer = _Synthetic(MeasurementTable(DEVICE, "synthetic"), [])
    outcomes = run_bench(config, measurer, workdir=tmp_path)
    convolutions = [o for o in outcomes if o.library]
    # cuDNN's searched algorithm in TF32, the precision eager convolves in (torch's default lets cuDNN use TF32)
    assert {o.kind for o in convolutions} == {"convolution"} and all(o.library == 1 for o in convolutions)
    for o in outcomes:
        results = measurer.table.results[o.key]
        libraries = [r for r in results if r.startswith("conv(")]
        assert len(libraries) == o.library
        fastest_library = min((results[r] for r in libraries), default=float("inf"))
        for k in config.ks:  # no method does worse than the libraries it was given
            assert o.random[k] <= fastest_library and o.transfer["static"][k]["s"] <= fastest_library
            assert o.transfer["static"][k]["evaluations"] <= 1 + o.library + k
    given = 3 + sum(o.library for o in outcomes) / len(outcomes)  # default, 2 picks and the libraries
    rows = {(r.method, r.k): r for r in table(outcomes, config)}
    assert rows["random", 2].evaluations == pytest.approx(given)
    (paired,) = [d for d in differences(outcomes, config) if d.b == "random 2"]
    assert paired.evaluations_b == pytest.approx(given)


def test_a_provisional_replay_counts_what_a_resume_measures_and_bounds_its_transfers(tmp_path: Path) -> None:
    config = replace(SHARDED, strategy="random", fills=("random", "model"))
    table = MeasurementTable(DEVICE, "synthetic")
    run_bench(config, _Synthetic(table, []), shard=Shard("cross", 0, 1))  # stopped before the folds' transfers
    recorded = json.loads(json.dumps(table.to_json()))
    lacking, failing = list(recorded["eager"])[:2]
    del recorded["eager"][lacking]  # a recording without one eager time, and with one eager that could not run
    recorded["eager"][failing] = None
    provisional = ProvisionalReplay(MeasurementTable.from_json(json.loads(json.dumps(recorded))))
    guessed = run_bench(config, provisional, workdir=tmp_path / "provisional")
    runs: list[tuple[str, str]] = []
    resumed = run_bench(config, _Synthetic(table, runs), workdir=tmp_path / "resumed")
    assert provisional.missing == len(runs) > 0  # every kernel the resume measured, each counted once
    assert provisional.evaluations == 0  # none of them ran
    provisional.forget()  # the recording's own measurements again
    assert json.loads(json.dumps(provisional.table.to_json())) == recorded
    lower = 0
    for g, r in zip(guessed, resumed, strict=True):
        assert g.random == r.random  # complete before the folds
        assert g.optimum_s >= r.optimum_s  # a transfer the provisional replay lacks may beat the strong optimum
        for key, per_k in r.transfer.items():
            for k, outcome in per_k.items():  # a missing candidate taken as failed can only make a transfer slower
                assert g.transfer[key][k]["s"] >= outcome["s"]
                lower += g.transfer[key][k]["s"] > outcome["s"]
    assert lower
