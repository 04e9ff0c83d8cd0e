"""Measurements through one memo: each (subgraph, recipe) is built, validated and timed at most once.

``Measurer`` runs kernels live (``live_measurer``) or replays a recorded ``MeasurementTable``:
the same harness code runs on a GPU, on the cpu, or from a recording, and a recording of a run replays it
exactly (every decision depends only on the recorded numbers). A live measurer given a partial table (a
``Checkpoint``'s) measures only what the table lacks, so a long run can stop and resume.
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embed.profile import DeviceSpec
from transforms.compilers.cpu import from_recorded
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

    def fastest(self, key: str) -> float:
        """The fastest time held for subgraph ``key``, eager's or a kernel's (inf when none)."""
        times = [v for v in self.results.get(key, {}).values() if not isinstance(v, str)]
        eager = self.eager.get(key)
        return min([math.inf, *times, *([eager] if eager is not None else [])])

    @property
    def size(self) -> int:
        """Recipe measurements held (failures included; eager times not)."""
        return sum(len(v) for v in self.results.values())

    def merge(self, other: "MeasurementTable") -> int:
        """Add what ``other`` holds and this table lacks (this table's values win); the measurements added."""
        added = 0
        for key, recipes in other.results.items():
            known = self.results.setdefault(key, {})
            for recipe, value in recipes.items():
                if recipe not in known:
                    known[recipe], added = value, added + 1
        for key, seconds in other.eager.items():
            self.eager.setdefault(key, seconds)
        return added

    def to_json(self) -> dict[str, Any]:
        return {"device": asdict(self.device), "toolchain": self.toolchain, "results": self.results,
                "eager": self.eager}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MeasurementTable":
        # older recordings hold the long cpu toolchain id: read as today's, so their measurements stay hits here
        return cls(DeviceSpec(**data["device"]), from_recorded(data["toolchain"]), data["results"], data["eager"])


def _result(value: float | str, message: str | None = None) -> RunResult:
    if isinstance(value, str):
        return RunResult.failure(value, message or "recorded failure")  # type: ignore[arg-type]
    return RunResult(ok=True, median_s=value, min_s=value, repeats=1)


RunRecipes = Callable[[Task, list[Recipe]], list[RunResult]]
EagerTime = Callable[[Task], float]


class RunStopped(RuntimeError):
    """A run reached its time limit before a measurement it needed; its table was saved first."""


class Checkpoint:
    """Saves a live run's table (``save(table)``) before a new measurement once ``every_s`` seconds have passed
    since the last save, and stops the run (``RunStopped``, after saving) before the first new measurement past
    ``stop_after_s`` seconds from its creation."""

    def __init__(self, save: Callable[[MeasurementTable], None], *, every_s: float = 30.0,
                 stop_after_s: float = math.inf, clock: Callable[[], float] = time.monotonic) -> None:
        self.save, self.every_s, self.stop_after_s, self.clock = save, every_s, stop_after_s, clock
        self.start = self.last = clock()

    def before_measuring(self, table: MeasurementTable) -> None:
        now = self.clock()
        if now - self.start >= self.stop_after_s:
            self.save(table)
            raise RunStopped(f"stopped after {now - self.start:.0f} s (limit {self.stop_after_s:g} s)")
        if now - self.last >= self.every_s:
            self.save(table)
            self.last = now


class Measurer:
    """``measure(task, key, recipes)`` and ``eager(task, key)`` through the table; ``key`` names the subgraph
    (its structural hash). What the table lacks is measured with ``run`` / ``eager_time`` (a replay has neither
    and raises ``MissingMeasurementError``). ``evaluations`` counts the recipes actually run; ``checkpoint`` is
    consulted before each live measurement. The table keeps a failure's kind; the failures this measurer ran keep
    their message too (``messages``, by subgraph and recipe), which recordings do not hold."""

    def __init__(self, table: MeasurementTable, *, run: RunRecipes | None = None,
                 eager_time: EagerTime | None = None, checkpoint: Checkpoint | None = None) -> None:
        self.table, self.run, self.eager_time, self.checkpoint = table, run, eager_time, checkpoint
        self.evaluations = 0
        self.messages: dict[tuple[str, str], str] = {}

    def measure(self, task: Task, key: str, recipes: Sequence[Recipe]) -> list[RunResult]:
        known = self.table.results.setdefault(key, {})
        new = list(dict.fromkeys(str(r) for r in recipes if str(r) not in known))
        if new:
            if self.run is None:
                raise MissingMeasurementError(f"the recording has no measurement of {new[0]!r} on subgraph {key}")
            if self.checkpoint is not None:
                self.checkpoint.before_measuring(self.table)
            unique = {str(r): r for r in recipes}
            for text, result in zip(new, self.run(task, [unique[t] for t in new]), strict=True):
                known[text] = result.median_s if result.ok else str(result.error_kind)
                if not result.ok:
                    self.messages[key, text] = result.error
            self.evaluations += len(new)
        return [_result(known[str(r)], self.messages.get((key, str(r)))) for r in recipes]

    def eager(self, task: Task, key: str) -> float:
        if key not in self.table.eager:
            if self.eager_time is None:
                raise MissingMeasurementError(f"the recording has no eager time of subgraph {key}")
            if self.checkpoint is not None:
                self.checkpoint.before_measuring(self.table)
            seconds = self.eager_time(task)
            self.table.eager[key] = seconds if math.isfinite(seconds) else None
        value = self.table.eager[key]
        return math.nan if value is None else value


class ProvisionalReplay(Measurer):
    """A replay of a partial recording that takes each measurement it lacks as a failed kernel (and an eager time it
    lacks as unknown) instead of stopping. ``missing`` counts them: what a live run resuming the recording still has
    to measure, exactly where no choice of what to measure depends on them (a run stopped in its last stage: see
    ``service.bench_transfer.STAGES``). ``forget()`` takes the made-up failures (and unknown eager times) out of the
    table again."""

    def __init__(self, table: MeasurementTable) -> None:
        super().__init__(table, run=self._failed, eager_time=lambda task: math.nan)
        self.made_up: list[tuple[str, str]] = []
        self.unknown_eager: list[str] = []
        self._key = ""

    @property
    def missing(self) -> int:
        return len(self.made_up)

    def measure(self, task: Task, key: str, recipes: Sequence[Recipe]) -> list[RunResult]:
        self._key = key
        return super().measure(task, key, recipes)

    def eager(self, task: Task, key: str) -> float:
        if key not in self.table.eager:
            self.unknown_eager.append(key)
        return super().eager(task, key)

    def _failed(self, task: Task, recipes: list[Recipe]) -> list[RunResult]:
        self.made_up += [(self._key, str(r)) for r in recipes]
        self.evaluations -= len(recipes)  # no kernel runs: ``measure`` counts these as evaluations
        return [RunResult.failure("launch", "not in the recording (provisional replay)") for _ in recipes]

    def forget(self) -> None:
        """Remove the made-up failures (and unknown eager times) from the table, e.g. before reporting its size."""
        for key, recipe in self.made_up:
            self.table.results[key].pop(recipe, None)
        for key in self.unknown_eager:
            self.table.eager.pop(key, None)


Record = Callable[[Task, list[Recipe], list[RunResult]], None]


def live_measurer(table: MeasurementTable, *, backend: str, cache_dir: Path, worker: Worker,
                  repeats: int = 10, checkpoint: Checkpoint | None = None, record: Record | None = None,
                  timeout_s: float = 30.0) -> Measurer:
    """A measurer that builds, validates and times kernels on ``backend`` (and eager PyTorch) when ``table``
    lacks them, each candidate bounded by ``timeout_s``; ``record`` is told each batch of results as soon as it is
    measured (e.g. to store it). A candidate far slower than the fastest time the table holds for its subgraph
    (``task.key``), eager's included, is timed by one call (``transforms.run.SLOWER_FACTOR``): it cannot be chosen."""

    def run(task: Task, recipes: list[Recipe]) -> list[RunResult]:
        results = evaluator(task, backend=backend, cache_dir=cache_dir, worker=worker, repeats=repeats,
                            timeout_s=timeout_s, best_s=table.fastest(task.key))(recipes)
        if record is not None:
            record(task, recipes, results)
        return results

    return Measurer(table, run=run, eager_time=lambda task: eager_seconds(task, repeats=repeats, backend=backend),
                    checkpoint=checkpoint)
