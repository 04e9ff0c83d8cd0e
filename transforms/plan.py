"""The plan: what ``optimize`` gives a user, as data that can be saved, sent and run (``transforms.plan_runtime``).

A plan holds the model graph, one :class:`Step` per subgraph of ``embed.partition.partition(graph)`` (in that
order) saying how it runs, the device and toolchain it was tuned for, and the optimize report:

* ``eager``: the subgraph's own PyTorch ops (cuBLAS / cuDNN / BLAS behind them), the fallback that keeps a plan
  never slower than eager;
* ``kernel``: a generated kernel: its recipe, the source code and launches generated from it.

A plan file (``.tbplan``) is a zip archive of ``plan.json`` (this module's :data:`FORMAT`, version
:data:`VERSION`) and, when the weights are known, ``weights.safetensors``. Nothing in it is executed as it is:
:func:`verify` re-partitions the graph and regenerates every kernel from its recipe with this tunebank's own code
generator, and refuses the plan when a hash, a source or a launch differs (a tampered or foreign plan), so the
only code that ever runs is code tunebank generates. Weights are read with safetensors, never unpickled.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from embed.errors import EmbedError
from embed.ir import Graph, graph_from_json
from embed.lower import lower
from embed.partition import partition
from embed.subgraph import Subgraph
from transforms.codegen import Kernel, generate
from transforms.recipe import RecipeError, parse
from transforms.run import Launch
from transforms.schedule import ScheduleError
from transforms.transformation import apply_recipe

FORMAT = "tunebank-plan"
VERSION = 1
PLAN_MEMBER, WEIGHTS_MEMBER = "plan.json", "weights.safetensors"
MAX_PLAN_JSON_BYTES = 256 * 2**20  # uncompressed; a larger member is refused before it is read
MAX_WEIGHTS_BYTES = 16 * 2**30

Impl = Literal["eager", "kernel"]


class PlanError(ValueError):
    """A plan file that cannot be used here: corrupt, tampered, from another tunebank, or for another backend."""


@dataclass(frozen=True)
class Step:
    """How one subgraph runs: ``impl`` eager, or the kernel generated from ``recipe`` (``code`` and
    ``launches``, as JSON, are what that generation gave when the plan was made)."""

    structural_hash: str
    impl: Impl
    recipe: str | None = None
    code: str | None = None
    launches: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"structural_hash": self.structural_hash, "impl": self.impl, "recipe": self.recipe,
                "code": self.code, "launches": list(self.launches)}


@dataclass(frozen=True)
class Target:
    """What the plan's kernels were chosen on: backend, device (name, class, arch) and compiler toolchain."""

    backend: str
    device: str
    device_class: str
    arch: str
    toolchain: str


@dataclass(frozen=True)
class Plan:
    """A model graph, how each of its subgraphs runs, what it was tuned for, and the optimize report."""

    graph: Graph
    steps: tuple[Step, ...]
    target: Target
    report: dict[str, Any] = field(default_factory=dict)
    cuda_graph: bool = True  # on cuda, run the whole plan as one CUDA graph (optimize times both ways)

    @property
    def kernels(self) -> int:
        return sum(s.impl == "kernel" for s in self.steps)

    def with_all_eager(self) -> Plan:
        """The same plan with every subgraph running eagerly (the model-level fallback)."""
        return replace(self, steps=tuple(Step(s.structural_hash, "eager") for s in self.steps))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "graph": json.loads(self.graph.to_json()),
                "target": self.target.__dict__, "steps": [s.to_json() for s in self.steps], "report": self.report,
                "cuda_graph": self.cuda_graph}


def kernel_of(subgraph: Subgraph, recipe: str, backend: str) -> Kernel:
    """The kernel tunebank generates for ``subgraph`` under ``recipe`` on ``backend``."""
    return generate(apply_recipe(parse(recipe), lower(subgraph.graph)), backend)


def _launches(kernel: Kernel) -> list[dict[str, Any]]:
    """The kernel's launches as the JSON a plan file holds (lists, not tuples)."""
    return json.loads(json.dumps([x.to_json() for x in kernel.launches]))


def kernel_step(subgraph: Subgraph, recipe: str, backend: str) -> Step:
    kernel = kernel_of(subgraph, recipe, backend)
    return Step(subgraph.structural_hash, "kernel", recipe, kernel.code, tuple(_launches(kernel)))


def verify(plan: Plan) -> tuple[list[Subgraph], list[Kernel | None]]:
    """The plan's subgraphs and, per step, its kernel regenerated from the recipe (None for eager); raises
    :class:`PlanError` when the graph does not partition into the steps' hashes or a kernel differs from the one
    the plan carries."""
    try:
        subgraphs = partition(plan.graph)
    except EmbedError as e:
        raise PlanError(f"the plan's graph does not partition: {e}") from None
    if [s.structural_hash for s in subgraphs] != [s.structural_hash for s in plan.steps]:
        raise PlanError("the plan's steps do not match its graph's subgraphs (made by another tunebank version, "
                        "or edited); run optimize again")
    kernels: list[Kernel | None] = []
    for n, (subgraph, step) in enumerate(zip(subgraphs, plan.steps, strict=True)):
        if step.impl == "eager":
            kernels.append(None)
            continue
        if not subgraph.tunable or step.recipe is None:
            raise PlanError(f"step {n} asks for a kernel where none can be generated")
        try:
            kernel = kernel_of(subgraph, step.recipe, plan.target.backend)
        except (RecipeError, ScheduleError, EmbedError, ValueError) as e:
            raise PlanError(f"step {n}: recipe {step.recipe[:80]!r} does not apply: {e}") from None
        if kernel.code != step.code or _launches(kernel) != list(step.launches):
            raise PlanError(f"step {n}: the kernel source in the plan differs from what its recipe generates "
                            "(tampered, or made by another tunebank version); refusing to run it")
        kernels.append(kernel)
    return subgraphs, kernels


def plan_from_json(data: Any) -> Plan:
    """A plan from its JSON document (structure checked; :func:`verify` checks the kernels)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PlanError("not a tunebank plan (plan.json lacks format 'tunebank-plan')")
    if data.get("version") != VERSION:
        raise PlanError(f"plan format version {data.get('version')!r}; this tunebank reads version {VERSION}")
    try:
        graph = graph_from_json(json.dumps(data["graph"]))
        target = Target(**{k: str(data["target"][k]) for k in Target.__dataclass_fields__})
        steps = tuple(_step(s) for s in data["steps"])
        report = data.get("report") or {}
        cuda_graph = data.get("cuda_graph", True)
        if not isinstance(report, dict) or not isinstance(cuda_graph, bool):
            raise TypeError("report is not an object, or cuda_graph not a boolean")
    except EmbedError as e:
        raise PlanError(f"the plan's graph is invalid: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"malformed plan.json: {type(e).__name__}: {e}") from None
    return Plan(graph, steps, target, report, cuda_graph)


def _step(data: Mapping[str, Any]) -> Step:
    impl = data["impl"]
    if impl not in ("eager", "kernel"):
        raise ValueError(f"unknown step impl {impl!r}")
    launches = tuple(data.get("launches") or ())
    for launch in launches:
        Launch.from_json(dict(launch))  # shape-checks the launch description
    return Step(str(data["structural_hash"]), impl, data.get("recipe"), data.get("code"), launches)


def save_plan(plan: Plan, path: str | Path, weights: bytes | None = None) -> Path:
    """Write ``plan`` (and safetensors-encoded ``weights``) to the plan file ``path``."""
    document = json.dumps(plan.to_json(), allow_nan=False, separators=(",", ":")).encode()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(PLAN_MEMBER, document)
        if weights is not None:
            archive.writestr(WEIGHTS_MEMBER, weights)
    tmp.replace(path)
    return path


def read_plan(path: str | Path) -> tuple[Plan, bytes | None]:
    """The plan in file ``path`` and its weights (safetensors bytes, or None); :class:`PlanError` when it is not a
    readable plan. The plan is not verified yet (:func:`verify`)."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"{path}: no such plan file")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {i.filename: i for i in archive.infolist()}
            _check_sizes(members)
            document = archive.read(PLAN_MEMBER)
            weights = archive.read(WEIGHTS_MEMBER) if WEIGHTS_MEMBER in members else None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise PlanError(f"{path.name} is not a readable plan file (truncated or corrupt: {e})") from None
    try:
        data = json.loads(document)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise PlanError(f"{path.name}: plan.json is not valid JSON ({e})") from None
    return plan_from_json(data), weights


def _check_sizes(members: Mapping[str, zipfile.ZipInfo]) -> None:
    if PLAN_MEMBER not in members:
        raise PlanError("not a tunebank plan (no plan.json inside)")
    unknown = sorted(set(members) - {PLAN_MEMBER, WEIGHTS_MEMBER})
    if unknown:
        raise PlanError(f"unexpected member {unknown[0][:80]!r} in the plan file")
    if members[PLAN_MEMBER].file_size > MAX_PLAN_JSON_BYTES:
        raise PlanError(f"plan.json is {members[PLAN_MEMBER].file_size} bytes, over {MAX_PLAN_JSON_BYTES}")
    if WEIGHTS_MEMBER in members and members[WEIGHTS_MEMBER].file_size > MAX_WEIGHTS_BYTES:
        raise PlanError(f"the weights are {members[WEIGHTS_MEMBER].file_size} bytes, over {MAX_WEIGHTS_BYTES}")


def content_hash(graph: Graph, weights: Sequence[bytes] = ()) -> str:
    """A model's identity: its graph document and, when known, its weights."""
    h = hashlib.sha256(graph.to_json().encode())
    for w in weights:
        h.update(w)
    return h.hexdigest()
