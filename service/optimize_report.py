"""What optimize reports: per distinct subgraph where its implementation came from, what was tried and chosen; per
model the whole-model times and the wall time by stage. ``to_json`` is strict JSON (non-finite floats as null)."""

from dataclasses import asdict, dataclass, field
from typing import Any

from service.strict_json import finite


@dataclass
class SubgraphReport:
    """What optimize did with one distinct subgraph (times in seconds; None where there is none)."""

    name: str
    kind: str
    structural_hash: str
    ops: list[str]
    occurrences: int
    source: str  # hit | transfer | bound (eager under the roofline bound: nothing measured) | not tunable
    reason: str | None = None
    neighbours: list[dict[str, Any]] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    choice: str = "eager"  # eager | kernel
    recipe: str | None = None
    kernel_s: float | None = None
    eager_s: float | None = None
    queued: bool = False

    def choose(self, margin: float) -> None:
        """The kernel when it validated and beats eager by more than ``margin`` (or eager cannot run it), else eager."""
        if self.kernel_s is None:
            self.choice = "eager"
        elif self.eager_s is None:
            self.choice = "kernel"
        else:
            self.choice = "kernel" if self.kernel_s * (1 + margin) < self.eager_s else "eager"

    @property
    def speedup(self) -> float | None:
        """Eager time over the chosen implementation's time."""
        if self.choice == "kernel" and self.kernel_s and self.eager_s:
            return self.eager_s / self.kernel_s
        return 1.0 if self.eager_s else None


@dataclass
class OptimizeReport:
    model: str
    backend: str
    device: str
    toolchain: str
    subgraphs: list[SubgraphReport] = field(default_factory=list)
    stages_s: dict[str, float] = field(default_factory=dict)
    model_s: float | None = None  # the plan, run whole
    eager_model_s: float | None = None  # the model run eagerly, whole
    compile_model_s: float | None = None  # torch.compile default, whole (cuda)
    model_fallback: bool = False  # the kernels lost as a whole: every subgraph runs eagerly
    ways_s: dict[str, float] = field(default_factory=dict)  # each way the model was timed whole (service.whole_model)
    measured: int = 0  # kernels measured in this run
    folds_measured: int = 0  # of those, kernels with a layout step folded in, tried while making the plan
    built_ahead: int = 0  # problems the worker built while it waited, before their first trial (cuda)
    attentions: list[dict[str, Any]] = field(default_factory=list)  # service.fused_attention: fused or apart

    @property
    def speedup(self) -> float | None:
        return self.eager_model_s / self.model_s if self.model_s and self.eager_model_s else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.subgraphs:
            key = s.source if s.source == "not tunable" else f"{s.source}, {s.choice}"
            out[key] = out.get(key, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["speedup"] = self.speedup
        for row, s in zip(data["subgraphs"], self.subgraphs, strict=True):
            row["speedup"] = s.speedup
        return finite(data)
