"""Build and run results as values: a failing candidate is a result with an error kind, never an exception.

Standard library only: this module is on the GPU measurement path.
"""

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

#: "slow": not run, its launch cannot beat the fastest time known (``transforms.launch_bound``).
ErrorKind = Literal["compile", "launch", "timeout", "wrong", "nan", "slow"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


def _check_kind(ok: bool, error_kind: str | None) -> None:
    if ok != (error_kind is None):
        raise ValueError("a result is ok exactly when it has no error kind")
    if error_kind is not None and error_kind not in ERROR_KINDS:
        raise ValueError(f"unknown error kind {error_kind!r}; choose one of: {', '.join(ERROR_KINDS)}")


@dataclass(frozen=True)
class BuildResult:
    """One compiled candidate: ``artifact`` (a .so or .ptx path) or ``error_kind`` (compile | timeout) + ``error``."""

    backend: str
    artifact: str | None = None
    error_kind: ErrorKind | None = None
    error: str = ""
    seconds: float = 0.0
    cached: bool = False

    def __post_init__(self) -> None:
        _check_kind(self.artifact is not None, self.error_kind)

    @property
    def ok(self) -> bool:
        return self.artifact is not None


@dataclass(frozen=True)
class RunResult:
    """One validated and timed candidate.

    ``median_s`` / ``iqr_s`` / ``min_s`` are over ``repeats`` timed runs (seconds; one for a candidate far slower
    than the fastest known). ``max_rel_err`` is the largest relative error against the reference (None when the
    kernel did not produce output).
    """

    ok: bool
    median_s: float = math.inf
    iqr_s: float = 0.0
    min_s: float = math.inf
    repeats: int = 0
    error_kind: ErrorKind | None = None
    error: str = ""
    max_rel_err: float | None = None

    def __post_init__(self) -> None:
        _check_kind(self.ok, self.error_kind)

    @classmethod
    def failure(cls, kind: ErrorKind, error: str, max_rel_err: float | None = None) -> "RunResult":
        return cls(ok=False, error_kind=kind, error=error, max_rel_err=max_rel_err)

    @property
    def score(self) -> float:
        """What search minimizes: the median time, infinity for a failure."""
        return self.median_s if self.ok else math.inf

    def to_json(self) -> dict[str, Any]:
        """A strict-JSON dict: non-finite floats become None (``from_json`` restores the infinite times)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunResult":
        return cls(**{k: (math.inf if k in ("median_s", "min_s") and v is None else v) for k, v in data.items()})
