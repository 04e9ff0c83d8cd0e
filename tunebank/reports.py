"""What the HTTP client (and ``tunebank.local()``) returns: typed, read-only views of the service's JSON, each with a
readable ``repr`` and, where it is a table, ``to_dataframe()`` (needs pandas, which tunebank does not install).

They are built from plain JSON, so this module imports nothing of the service."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


def _dataframe(rows: list[dict[str, Any]], what: str) -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{what}.to_dataframe() needs pandas, which tunebank does not install: "
                          "pip install pandas (or read the rows from .to_rows())") from None
    return pandas.DataFrame(rows)


def _pick(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    return {f.name: data.get(f.name) for f in fields(cls) if f.name in data}


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f} us"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


@dataclass(frozen=True)
class SubgraphResult:
    """One distinct subgraph of an optimize report: where its implementation came from (``hit``, ``transfer``,
    ``not tunable``), what runs (``kernel`` or ``eager``) and the times side by side (seconds)."""

    name: str
    kind: str
    structural_hash: str
    ops: tuple[str, ...]
    occurrences: int = 1
    source: str = ""
    choice: str = "eager"
    recipe: str | None = None
    kernel_s: float | None = None
    eager_s: float | None = None
    speedup: float | None = None
    queued: bool = False
    reason: str | None = None
    neighbours: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # distance, recipe of each neighbour
    candidates: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # each recipe tried: time, or why it failed

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubgraphResult:
        values = _pick(cls, data)
        for name in ("ops", "neighbours", "candidates"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)


@dataclass(frozen=True)
class Report:
    """An optimize report: per distinct subgraph what was chosen, and the whole model's plan and eager times."""

    model: str
    backend: str
    device: str
    toolchain: str
    subgraphs: tuple[SubgraphResult, ...] = ()
    model_s: float | None = None
    eager_model_s: float | None = None
    compile_model_s: float | None = None
    speedup: float | None = None
    model_fallback: bool = False
    measured: int = 0
    stages_s: dict[str, float] = field(default_factory=dict)
    ways_s: dict[str, float] = field(default_factory=dict)  # each way the model was timed whole

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        values = _pick(cls, data)
        values["subgraphs"] = tuple(SubgraphResult.from_json(s) for s in data.get("subgraphs") or ())
        values["stages_s"] = dict(values.get("stages_s") or {})
        values["ways_s"] = dict(values.get("ways_s") or {})
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON (what the service sent, for the fields this view keeps)."""
        return asdict(self)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.subgraphs:
            key = s.source if s.source == "not tunable" else f"{s.source}, {s.choice}"
            out[key] = out.get(key, 0) + 1
        return out

    def to_rows(self) -> list[dict[str, Any]]:
        return [{"name": s.name, "kind": s.kind, "ops": "+".join(s.ops), "occurrences": s.occurrences,
                 "source": s.source, "choice": s.choice, "kernel_s": s.kernel_s, "eager_s": s.eager_s,
                 "speedup": s.speedup, "recipe": s.recipe, "structural_hash": s.structural_hash}
                for s in self.subgraphs]

    def to_dataframe(self) -> Any:
        """One row per distinct subgraph (a pandas DataFrame)."""
        return _dataframe(self.to_rows(), "Report")

    def __repr__(self) -> str:
        whole = f"plan {_ms(self.model_s)} vs eager {_ms(self.eager_model_s)}"
        if self.speedup:
            whole += f" ({self.speedup:.2f}x)"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items()) or "none"
        lines = [f"Report({self.model!r} on {self.device}: {whole}; subgraphs: {counts})"]
        for n, s in enumerate(self.subgraphs):
            chosen = s.kernel_s if s.choice == "kernel" else s.eager_s
            x = f"{s.speedup:.2f}x" if s.speedup else "-"
            lines.append(f"  #{n} {'+'.join(s.ops)[:40]:<40} {s.source:<11} {s.choice:<6} {_us(chosen):>12} "
                         f"vs eager {_us(s.eager_s):>12} {x:>6}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Job:
    """A job on the service: ``status`` is queued, running, succeeded, failed or cancelled; ``report`` is there
    once an optimize job succeeded."""

    id: int
    kind: str
    status: str
    progress: float = 0.0
    error: str | None = None
    model: str | None = None
    created_at: str | None = None
    finished_at: str | None = None
    report: Report | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        values = _pick(cls, data)
        report = data.get("report")
        values["report"] = Report.from_json(report) if isinstance(report, dict) else None
        values["progress"] = float(values.get("progress") or 0.0)
        return cls(**values)

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")

    def __repr__(self) -> str:
        head = f"Job({self.id}, {self.kind}, {self.status}"
        if self.status in ("queued", "running"):
            head += f", {self.progress:.0%}"
        if self.error:
            head += f", error={self.error[:200]!r}"
        head += ")"
        return head + ("\n" + repr(self.report) if self.report is not None else "")


@dataclass(frozen=True)
class Neighbour:
    id: int
    structural_hash: str
    kind: str
    distance: float
    recipe: str | None = None
    median_s: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """Per query subgraph (``queries[i]``: id, structural hash, kind) its nearest stored neighbours."""

    device_class: str
    encoder: str
    encoder_version: str
    queries: tuple[dict[str, Any], ...]
    neighbours: tuple[tuple[Neighbour, ...], ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchResult:
        results = data.get("results") or []
        return cls(data["device_class"], data["encoder"], data["encoder_version"],
                   tuple(r["query"] for r in results),
                   tuple(tuple(Neighbour(**_pick(Neighbour, n)) for n in r["neighbours"]) for r in results))

    def to_rows(self) -> list[dict[str, Any]]:
        return [{"query": q.get("structural_hash"), "query_kind": q.get("kind"), **n.__dict__}
                for q, ns in zip(self.queries, self.neighbours, strict=True) for n in ns]

    def to_dataframe(self) -> Any:
        return _dataframe(self.to_rows(), "SearchResult")

    def __repr__(self) -> str:
        lines = [f"SearchResult({self.device_class}, encoder {self.encoder} {self.encoder_version}, "
                 f"{len(self.queries)} queries)"]
        for q, ns in zip(self.queries, self.neighbours, strict=True):
            lines.append(f"  {str(q.get('structural_hash'))[:12]} ({q.get('kind')}): {len(ns)} neighbours")
            lines += [f"    {n.structural_hash[:12]} d={n.distance:.3g} {n.recipe or '-'}" for n in ns]
        return "\n".join(lines)


@dataclass(frozen=True)
class Stats:
    """Rows per table, and coverage per device and per subgraph kind."""

    tables: dict[str, int]
    devices: tuple[dict[str, Any], ...]
    kinds: tuple[dict[str, Any], ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(dict(data.get("tables") or {}), tuple(data.get("devices") or ()), tuple(data.get("kinds") or ()))

    def to_dataframe(self) -> Any:
        """Coverage per device (a pandas DataFrame)."""
        return _dataframe(list(self.devices), "Stats")

    def __repr__(self) -> str:
        tables = ", ".join(f"{k} {v:,}" for k, v in self.tables.items() if v)
        return f"Stats({tables or 'empty'}; {len(self.devices)} devices, {len(self.kinds)} kinds)"
