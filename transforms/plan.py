"""The plan: what ``optimize`` gives a user, as data that can be saved, sent and run (``transforms.plan_runtime``).

A plan holds the model graph, one :class:`Step` per subgraph of ``embed.partition.partition(graph)`` (in that
order) saying how it runs, the device and toolchain it was tuned for, and the optimize report:

* ``eager``: the subgraph's own PyTorch ops (cuBLAS / cuDNN / BLAS behind them), the fallback that keeps a plan
  never slower than eager;
* ``kernel``: a generated kernel: its recipe, the source code and launches generated from it;
* ``folded``: a layout subgraph (transpose, reshape, slice, ...) that has no step of its own: the kernel step that
  lists it in ``folded`` runs its ops as index maps, storing its result where the layout puts it (the layout reads
  that kernel's output: :data:`STORE`) or reading its input through the layout's map (the layout feeds that kernel:
  :data:`LOAD`). That kernel is generated from the union of both subgraphs (``embed.partition.merged_subgraph``)
  with the views folded (``transforms.views.fold_layout``). A layout step left eager is a PyTorch view where no data
  moves (transpose, reshape of a contiguous tensor, slice) and one copy otherwise (concat, gather);
* ``attention``: the output matmul of an attention (``transforms.attention``: score matmul, scaled softmax, output
  matmul) runs the three as PyTorch's fused scaled dot-product attention; the other two are ``folded`` into it.

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
from typing import Any, Literal, get_args

from embed.errors import EmbedError
from embed.ir import Graph, graph_from_json
from embed.lower import lower
from embed.partition import merged_subgraph, partition_nodes
from embed.subgraph import Subgraph, SubgraphKind
from transforms import attention
from transforms.codegen import Kernel, generate
from transforms.recipe import RecipeError, parse
from transforms.run import Launch
from transforms.schedule import ScheduleError
from transforms.transformation import apply_recipe
from transforms.views import kernel_program

FORMAT = "tunebank-plan"
VERSION = 1
PLAN_MEMBER, WEIGHTS_MEMBER = "plan.json", "weights.safetensors"
MAX_PLAN_JSON_BYTES = 256 * 2**20  # uncompressed; a larger member is refused before it is read
MAX_WEIGHTS_BYTES = 16 * 2**30

Impl = Literal["eager", "kernel", "folded", "attention"]
STORE, LOAD = "store", "load"  # where a folded layout goes: the kernel's store (it reads the kernel) or its loads


class PlanError(ValueError):
    """A plan file that cannot be used here: corrupt, tampered, from another tunebank, or for another backend."""


@dataclass(frozen=True)
class Step:
    """How one subgraph runs: ``impl`` eager, folded into another step, the kernel generated from ``recipe``
    (``code`` and ``launches``, as JSON, are what that generation gave when the plan was made) that also runs the
    layout steps ``folded`` (their indices in the plan), or an attention that also runs its score and softmax
    steps (``folded``)."""

    structural_hash: str
    impl: Impl
    recipe: str | None = None
    code: str | None = None
    launches: tuple[dict[str, Any], ...] = ()
    folded: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"structural_hash": self.structural_hash, "impl": self.impl, "recipe": self.recipe,
               "code": self.code, "launches": list(self.launches)}
        return out | {"folded": list(self.folded)} if self.folded else out


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

    @property
    def tuned(self) -> int:
        """Steps that do not run their subgraph's own PyTorch ops: kernels and fused attentions."""
        return sum(s.impl in ("kernel", "attention") for s in self.steps)

    @property
    def attentions(self) -> int:
        return sum(s.impl == "attention" for s in self.steps)

    @property
    def folds(self) -> dict[int, int]:
        """Each folded step's index -> the index of the kernel or attention step that runs it."""
        return {j: k for k, s in enumerate(self.steps) for j in s.folded}

    def with_all_eager(self) -> Plan:
        """The same plan with every subgraph running eagerly (the model-level fallback)."""
        return replace(self, steps=tuple(Step(s.structural_hash, "eager") for s in self.steps))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "graph": json.loads(self.graph.to_json()),
                "target": self.target.__dict__, "steps": [s.to_json() for s in self.steps], "report": self.report,
                "cuda_graph": self.cuda_graph}


def kernel_of(subgraph: Subgraph, recipe: str, backend: str, *, fold: bool = False) -> Kernel:
    """The kernel tunebank generates for ``subgraph`` under ``recipe`` on ``backend`` (``fold``: a merged subgraph
    of a kernel step with folded layout steps, whose views become index maps)."""
    program = kernel_program(lower(subgraph.graph), subgraph.kind, fold=fold)
    return generate(apply_recipe(parse(recipe), program), backend)


def _launches(kernel: Kernel) -> list[dict[str, Any]]:
    """The kernel's launches as the JSON a plan file holds (lists, not tuples)."""
    return json.loads(json.dumps([x.to_json() for x in kernel.launches]))


def kernel_step(subgraph: Subgraph, recipe: str, backend: str, *, folded: tuple[int, ...] = (),
                structural_hash: str | None = None) -> Step:
    """The kernel step of ``subgraph`` under ``recipe``; with ``folded``, ``subgraph`` is the merged subgraph of
    the step (hash ``structural_hash``) and those layout steps (:func:`step_subgraph`)."""
    kernel = kernel_of(subgraph, recipe, backend, fold=bool(folded))
    return Step(structural_hash or subgraph.structural_hash, "kernel", recipe, kernel.code, tuple(_launches(kernel)),
                tuple(sorted(folded)))


Parts = list[tuple[Subgraph, tuple[int, ...]]]  # embed.partition.partition_nodes(graph)


def fold_side(graph: Graph, parts: Parts, kernel: int, layout: int) -> str | None:
    """Whether layout subgraph ``layout`` can run inside the kernel of subgraph ``kernel``: :data:`STORE` when it
    reads only what that subgraph computes (besides the model's inputs and weights), :data:`LOAD` when that
    subgraph alone reads what it computes (and the model does not output it); None otherwise (then the union
    could hold a path out and back in, or other steps would miss the layout's result)."""
    sub, other = parts[layout][0], parts[kernel][0]
    if sub.kind != SubgraphKind.LAYOUT or not sub.tunable or not other.tunable or other.kind == SubgraphKind.LAYOUT:
        return None
    made = {t: k for k, (s, _) in enumerate(parts) for t in s.source_outputs}
    if layout > kernel and all(made.get(t, kernel) == kernel for t in sub.source_inputs):
        return STORE
    readers = {k for k, (s, _) in enumerate(parts) for t in s.source_inputs if t in sub.source_outputs}
    if layout < kernel and readers == {kernel} and not set(sub.source_outputs) & set(graph.outputs):
        return LOAD
    return None


def step_subgraph(graph: Graph, parts: Parts, k: int, folded: tuple[int, ...]) -> Subgraph:
    """What kernel step ``k`` runs: its subgraph, merged with the layout subgraphs ``folded`` when there are any."""
    if not folded:
        return parts[k][0]
    nodes = [i for j in (k, *folded) for i in parts[j][1]]
    return merged_subgraph(graph, nodes, parts[k][0].kind, k)


def verify(plan: Plan) -> tuple[list[Subgraph], list[Kernel | None]]:
    """What each step runs (its subgraph, or for a kernel step with folded layout steps the merged one) and its
    kernel regenerated from the recipe (None for eager and folded steps); raises :class:`PlanError` when the graph
    does not partition into the steps' hashes, a fold is not one :func:`fold_side` allows, or a kernel differs from
    the one the plan carries."""
    try:
        parts = partition_nodes(plan.graph)
    except EmbedError as e:
        raise PlanError(f"the plan's graph does not partition: {e}") from None
    subgraphs = [s for s, _ in parts]
    if [s.structural_hash for s in subgraphs] != [s.structural_hash for s in plan.steps]:
        raise PlanError("the plan's steps do not match its graph's subgraphs (made by another tunebank version, "
                        "or edited); run optimize again")
    _check_folds(plan, parts)
    kernels: list[Kernel | None] = []
    for n, step in enumerate(plan.steps):
        if step.impl != "kernel":
            kernels.append(None)
            continue
        subgraph = subgraphs[n] = step_subgraph(plan.graph, parts, n, step.folded)
        if not subgraph.tunable or step.recipe is None:
            raise PlanError(f"step {n} asks for a kernel where none can be generated")
        try:
            kernel = kernel_of(subgraph, step.recipe, plan.target.backend, fold=bool(step.folded))
        except (RecipeError, ScheduleError, EmbedError, ValueError) as e:
            raise PlanError(f"step {n}: recipe {step.recipe[:80]!r} does not apply: {e}") from None
        if kernel.code != step.code or _launches(kernel) != list(step.launches):
            raise PlanError(f"step {n}: the kernel source in the plan differs from what its recipe generates "
                            "(tampered, or made by another tunebank version); refusing to run it")
        kernels.append(kernel)
    return subgraphs, kernels


def _check_folds(plan: Plan, parts: Parts) -> None:
    folds: dict[int, int] = {}
    for k, step in enumerate(plan.steps):
        if step.impl == "attention":
            found = attention.match(plan.graph, parts, k)
            if found is None or tuple(step.folded) != found.folded or set(found.folded) & set(folds):
                raise PlanError(f"step {k} runs an attention that subgraphs {list(step.folded)} and {k} do not form "
                                "(edited plan?)")
            folds.update(dict.fromkeys(found.folded, k))
            continue
        for j in step.folded:
            if step.impl != "kernel" or not 0 <= j < len(parts) or j in folds or j == k:
                raise PlanError(f"step {k} folds step {j}, which no kernel step can fold (edited plan?)")
            if fold_side(plan.graph, parts, k, j) is None:
                raise PlanError(f"step {k} folds layout step {j}, which it neither produces nor alone consumes")
            folds[j] = k
    for j, step in enumerate(plan.steps):
        if (step.impl == "folded") != (j in folds):
            raise PlanError(f"step {j} is {'folded' if step.impl == 'folded' else 'not folded'}, but "
                            f"{'no' if j not in folds else 'a'} kernel step runs it (edited plan?)")


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
    if impl not in get_args(Impl):
        raise ValueError(f"unknown step impl {impl!r}")
    launches = tuple(data.get("launches") or ())
    for launch in launches:
        Launch.from_json(dict(launch))  # shape-checks the launch description
    folded = tuple(data.get("folded") or ())
    if not all(type(j) is int for j in folded):
        raise TypeError("a step's folded steps are not integers")
    return Step(str(data["structural_hash"]), impl, data.get("recipe"), data.get("code"), launches, folded)


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
