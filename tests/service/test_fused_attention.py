"""Fused or apart (``service.fused_attention``): the fused attention replaces its three steps only when it
validates and beats them, as they were timed, by more than the margin; an attention with an untimed step is left
apart. The fused call really runs (cpu); the steps' times are given."""

from typing import Any

import pytest

from embed.partition import partition_nodes
from service.fused_attention import fuse_attentions
from tests.transforms.test_attention import attention_graph
from transforms import attention
from transforms.plan import Step


def choose(seconds: list[float | None], margin: float = 0.05) -> tuple[list[str], list[dict[str, Any]]]:
    graph = attention_graph()
    parts = partition_nodes(graph)
    steps = [Step(s.structural_hash, "eager") for s, _ in parts]
    rows = fuse_attentions(graph, parts, steps, seconds, backend="cpu", margin=margin, repeats=3)
    return [s.impl for s in steps], rows


def test_fused_where_it_beats_the_steps_apart() -> None:
    impls, rows = choose([0.5, 0.5, 0.5])  # 1.5 s apart: microseconds fused
    assert impls == ["folded", "folded", "attention"]
    (row,) = rows
    assert row["choice"] == "fused" and row["steps"] == [0, 1, 2] and row["apart_s"] == 1.5
    assert 0 < row["fused_s"] < 1.5 and row["error"] <= row["tolerance"]


def test_apart_where_the_steps_are_faster_or_not_all_timed() -> None:
    impls, rows = choose([1e-9, 1e-9, 1e-9])
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["fused_s"] > 3e-9
    impls, rows = choose([None, 0.5, 0.5])
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["fused_s"] is None


def test_apart_where_the_fused_call_does_not_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    fused = attention.run

    def scaled_twice(att: attention.Attention, env: dict[str, Any]) -> None:
        fused(attention.Attention(att.parts, att.query, att.key, att.value, att.mask, 2 * att.scale, att.output), env)

    monkeypatch.setattr(attention, "run", scaled_twice)
    impls, rows = choose([0.5, 0.5, 0.5])
    assert impls == ["eager"] * 3 and rows[0]["choice"] == "apart" and rows[0]["error"] > rows[0]["tolerance"]
