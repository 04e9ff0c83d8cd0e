"""Replay recorded measurements instead of running kernels: for testing and simulating strategies."""

from collections.abc import Mapping

from transforms.recipe import Recipe
from transforms.results import ERROR_KINDS, RunResult


class Replay:
    """An ``evaluate`` function over a table: canonical recipe string -> seconds, or an error kind."""

    def __init__(self, table: Mapping[str, float | str]) -> None:
        bad = {v for v in table.values() if isinstance(v, str) and v not in ERROR_KINDS}
        if bad:
            raise ValueError(f"unknown error kinds {sorted(bad)}; choose from: {', '.join(ERROR_KINDS)}")
        self.table = dict(table)
        self.calls: list[Recipe] = []

    def __call__(self, recipes: list[Recipe]) -> list[RunResult]:
        self.calls += recipes
        return [self._result(str(r)) for r in recipes]

    def _result(self, key: str) -> RunResult:
        if key not in self.table:
            raise KeyError(f"no recorded measurement for recipe {key!r}")
        value = self.table[key]
        if isinstance(value, str):
            return RunResult.failure(value, "replayed failure")  # type: ignore[arg-type]
        return RunResult(ok=True, median_s=value, min_s=value, repeats=1)
