"""Measurements through one memo: each (subgraph, recipe) is built, validated and timed at most once.

``Measurer`` runs kernels live (``live_measurer``) or replays a recorded ``MeasurementTable``:
the same harness code runs on a GPU, on the cpu, or from a recording, and a recording of a run replays it
exactly (every decision depends only on the recorded numbers).
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embed.profile import DeviceSpec
from transforms.recipe import Recipe
from transforms.results import RunResult
from transforms.run import Worker
from transforms.tune import Task, eager_seconds, evaluator


class MissingMeasurementError(KeyError):
    """A replay was asked for a measurement the recording does not hold."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class MeasurementTable:
    """Recorded medians: subgraph structural hash -> canonical recipe -> seconds, or an error kind."""

    device: DeviceSpec
    toolchain: str
    results: dict[str, dict[str, float | str]] = field(default_factory=dict)
    eager: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"device": asdict(self.device), "toolchain": self.toolchain, "results": self.results,
                "eager": self.eager}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MeasurementTable":
        return cls(DeviceSpec(**data["device"]), data["toolchain"], data["results"], data["eager"])


def _result(value: float | str) -> RunResult:
    if isinstance(value, str):
        return RunResult.failure(value, "recorded failure")  # type: ignore[arg-type]
    return RunResult(ok=True, median_s=value, min_s=value, repeats=1)


RunRecipes = Callable[[Task, list[Recipe]], list[RunResult]]
EagerTime = Callable[[Task], float]


class Measurer:
    """``measure(task, key, recipes)`` and ``eager(task, key)`` through the table; ``key`` names the subgraph
    (its structural hash). What the table lacks is measured with ``run`` / ``eager_time`` (a replay has neither
    and raises ``MissingMeasurementError``). ``evaluations`` counts the recipes actually run."""

    def __init__(self, table: MeasurementTable, *, run: RunRecipes | None = None,
                 eager_time: EagerTime | None = None) -> None:
        self.table, self.run, self.eager_time = table, run, eager_time
        self.evaluations = 0

    def measure(self, task: Task, key: str, recipes: Sequence[Recipe]) -> list[RunResult]:
        known = self.table.results.setdefault(key, {})
        new = list(dict.fromkeys(str(r) for r in recipes if str(r) not in known))
        if new:
            if self.run is None:
                raise MissingMeasurementError(f"the recording has no measurement of {new[0]!r} on subgraph {key}")
            unique = {str(r): r for r in recipes}
            for text, result in zip(new, self.run(task, [unique[t] for t in new]), strict=True):
                known[text] = result.median_s if result.ok else str(result.error_kind)
            self.evaluations += len(new)
        return [_result(known[str(r)]) for r in recipes]

    def eager(self, task: Task, key: str) -> float:
        if key not in self.table.eager:
            if self.eager_time is None:
                raise MissingMeasurementError(f"the recording has no eager time of subgraph {key}")
            seconds = self.eager_time(task)
            self.table.eager[key] = seconds if math.isfinite(seconds) else None
        value = self.table.eager[key]
        return math.nan if value is None else value


def live_measurer(table: MeasurementTable, *, backend: str, cache_dir: Path, worker: Worker,
                  repeats: int = 10) -> Measurer:
    """A measurer that builds, validates and times kernels on ``backend`` (and eager PyTorch) when needed."""

    def run(task: Task, recipes: list[Recipe]) -> list[RunResult]:
        return evaluator(task, backend=backend, cache_dir=cache_dir, worker=worker, repeats=repeats)(recipes)

    return Measurer(table, run=run, eager_time=lambda task: eager_seconds(task, repeats=repeats, backend=backend))
