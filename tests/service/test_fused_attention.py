"""Fused or apart (``service.fused_attention``): the fused attention replaces its three steps only when it
validates and beats them, as they were timed, by more than the margin; an attention with an untimed step is left
apart; a trial is stored, and a later run on the device reuses it. The fused call really runs (cpu); the steps'
times are given."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from db.migrate import upgrade
from db.session import Database
from embed.partition import partition_nodes
from service.fused_attention import ATTENTION, CAUSAL, fuse_attentions
from service.measurement_store import MeasurementStore
from tests.service.conftest import DEVICE
from tests.transforms.test_attention import L, attention_graph, causal_mask
from transforms import attention
from transforms.plan import Step, step_subgraph


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MeasurementStore]:
    database = Database(f"sqlite:///{tmp_path / 'tb.db'}")
    upgrade(database.engine)
    yield MeasurementStore(database, DEVICE, "test-toolchain", [])
    database.dispose()


def choose(seconds: list[float | None], store: MeasurementStore, margin: float = 0.05,
           params: dict[str, torch.Tensor] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    graph = attention_graph()
    parts = partition_nodes(graph)
    steps = [Step(s.structural_hash, "eager") for s, _ in parts]
    rows = fuse_attentions(graph, parts, steps, seconds, store, backend="cpu", margin=margin, params=params,
                           repeats=3)
    return [s.impl for s in steps], rows


def test_fused_where_it_beats_the_steps_apart(store: MeasurementStore) -> None:
    impls, rows = choose([0.5, 0.5, 0.5], store)  # 1.5 s apart: microseconds fused
    assert impls == ["folded", "folded", "attention"]
    (row,) = rows
    assert row["choice"] == "fused" and row["steps"] == [0, 1, 2] and row["apart_s"] == 1.5
    assert 0 < row["fused_s"] < 1.5 and row["error"] <= row["tolerance"]


def test_apart_where_the_steps_are_faster_or_not_all_timed(store: MeasurementStore) -> None:
    impls, rows = choose([1e-9, 1e-9, 1e-9], store)
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["fused_s"] > 3e-9
    impls, rows = choose([None, 0.5, 0.5], store)
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["fused_s"] is None


def test_apart_where_the_fused_call_does_not_validate(store: MeasurementStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fused = attention.run

    def scaled_twice(att: attention.Attention, env: dict[str, Any], **kwargs: bool) -> None:
        fused(attention.Attention(att.parts, att.query, att.key, att.value, att.mask, 2 * att.scale, att.output), env,
              **kwargs)

    monkeypatch.setattr(attention, "run", scaled_twice)
    impls, rows = choose([0.5, 0.5, 0.5], store)
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["error"] > rows[0]["tolerance"]
    monkeypatch.setattr(attention, "trial", _not_timed_again)
    impls, rows = choose([0.5, 0.5, 0.5], store)  # the stored failure: still apart, with nothing run
    assert impls == ["eager"] * 3 and rows[0]["stored"] and rows[0]["fused_s"] is None


def _not_timed_again(*args: object, **kwargs: object) -> attention.Trial:
    raise AssertionError("the attention was timed again")


def test_a_trial_is_stored_and_a_later_run_decides_from_it_without_timing(store: MeasurementStore,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _, (first,) = choose([0.5, 0.5, 0.5], store)
    assert first["choice"] == "fused" and not first["stored"]
    graph = attention_graph()
    parts = partition_nodes(graph)
    merged = step_subgraph(graph, parts, 2, (0, 1))
    assert store.results(merged) == {ATTENTION: first["fused_s"]}  # kept as a measurement of the three merged
    monkeypatch.setattr(attention, "trial", _not_timed_again)
    fused = first["fused_s"]
    assert isinstance(fused, float)
    impls, (again,) = choose([fused / 3] * 3, store, margin=0.0)  # apart exactly as fast as the stored trial
    assert again["stored"] and again["fused_s"] == fused and again["choice"] == "apart" and impls == ["eager"] * 3
    impls, (again,) = choose([fused / 2] * 3, store, margin=0.0)
    assert again["stored"] and again["choice"] == "fused" and impls == ["folded", "folded", "attention"]


def test_a_causal_mask_among_the_weights_is_tried_as_is_causal_and_stored_apart(store: MeasurementStore) -> None:
    _, (causal,) = choose([0.5, 0.5, 0.5], store, params={"m": causal_mask(L, L)})
    _, (masked,) = choose([0.5, 0.5, 0.5], store, params={"m": torch.rand(L, L)})
    assert causal["causal"] and causal["choice"] == "fused" and not causal["stored"]
    assert not masked["causal"] and not masked["stored"]  # the causal trial says nothing of a general mask
    graph = attention_graph()
    merged = step_subgraph(graph, partition_nodes(graph), 2, (0, 1))
    assert store.results(merged) == {CAUSAL: causal["fused_s"], ATTENTION: masked["fused_s"]}
