"""``tunebank inspect MODEL``: the subgraphs of a model, their kinds, sizes and static features; for a plan file
(``.tbplan``), also how each subgraph runs: a kernel (with the layout steps folded into it), eager (a layout step
left eager is a view, or one copy where data must move), folded into a kernel's store or loads, or part of an
attention run as one fused call."""

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from embed.canonical import family_hash
from embed.errors import EmbedError
from embed.features import StaticFeatures, static_features
from embed.ir import Graph
from embed.lower import lower
from embed.partition import partition, partition_nodes
from embed.subgraph import Subgraph, SubgraphKind
from service.strict_json import strict_json
from transforms.plan import Plan, PlanError, fold_side, read_plan
from tunebank.cli.common import load_graph, settings
from tunebank.cli.errors import fail
from tunebank.cli.text import plain, printable, stdout_console

console = stdout_console()


def _raw(features: StaticFeatures, name: str) -> float:
    """Undo the ``lg(x) = log2(1 + x)`` scaling of a feature."""
    return 2.0 ** features.as_dict()[name] - 1.0


def _si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _shapes(sub: Subgraph) -> str:
    graph = sub.graph
    ins = [graph.tensors[n] for n in graph.inputs if graph.tensors[n].role.value == "input"]
    outs = [graph.tensors[n] for n in graph.outputs]
    fmt = lambda ts: ", ".join("x".join(map(str, t.shape)) or "scalar" for t in ts[:4]) + (  # noqa: E731
        f", …(+{len(ts) - 4})" if len(ts) > 4 else "")
    return f"{fmt(ins)} -> {fmt(outs)}"


def _ops(sub: Subgraph, limit: int = 6) -> str:
    ops = [n.attrs["name"] if n.op == "opaque" else n.op for n in sub.graph.nodes]
    return "+".join(ops[:limit]) + (f"+…({len(ops) - limit})" if len(ops) > limit else "")


def _analyse(sub: Subgraph, max_nodes: int) -> tuple[Any, StaticFeatures | None]:
    """Loop program and static features of a tunable subgraph of at most ``max_nodes`` nodes (the larger ones could
    not be tuned either: TUNEBANK_MAX_KERNEL_NODES)."""
    if not sub.tunable or len(sub.graph.nodes) > max_nodes:
        return None, None
    program = lower(sub.graph)
    return program, static_features(program, family_hash=family_hash(sub.graph))


def _row(sub: Subgraph, features: StaticFeatures | None) -> list[str]:
    if features is None:
        numbers = ["-", "-", "-"]
    else:
        flops, nbytes = _raw(features, "lg_flops"), _raw(features, "lg_min_bytes")
        numbers = [_si(flops), _si(nbytes) + "B", f"{flops / nbytes:.2f}" if nbytes else "-"]
    return [sub.structural_hash[:8], sub.kind.value, plain(_ops(sub)), _shapes(sub), *numbers]


_VIEW_OPS = frozenset({"transpose", "reshape", "slice", "expand"})  # PyTorch runs them as views: no data moves


def runs_as(plan: Plan) -> list[str]:
    """How each step of ``plan`` runs, in words: ``kernel`` (``kernel +folds #j,..``), ``eager`` (a layout step:
    ``eager view`` where no data moves, ``eager copy`` otherwise), ``folded into #k store|load``, ``attention
    (fused, of #a,#r,#k)`` (``fused, causal``: optimize tried it ``is_causal``, its mask a weight holding a causal
    mask) and its score and softmax steps ``in attention #k``."""
    parts = partition_nodes(plan.graph)
    folds = plan.folds
    rows = plan.report.get("attentions")
    causal = {row["steps"][-1] for row in rows if isinstance(row, dict) and row.get("causal") and row.get("steps")
              and isinstance(row["steps"], list)} if isinstance(rows, list) else set()
    out = []
    for j, step in enumerate(plan.steps):
        sub = parts[j][0]
        if step.impl == "folded" and plan.steps[folds[j]].impl == "attention":
            out.append(f"in attention #{folds[j]}")
        elif step.impl == "folded":
            out.append(f"folded into #{folds[j]} {fold_side(plan.graph, parts, folds[j], j)}")
        elif step.impl == "attention":
            fused = "fused, causal" if j in causal else "fused"
            out.append(f"attention ({fused}, of #{step.folded[0]},#{step.folded[1]},#{j})")
        elif step.impl == "kernel":
            out.append("kernel" + (f" +folds {','.join(f'#{i}' for i in step.folded)}" if step.folded else ""))
        elif sub.kind == SubgraphKind.LAYOUT:
            out.append("eager view" if set(sub.ops) <= _VIEW_OPS else "eager copy")
        else:
            out.append("eager")
    return out


def _document(graph: Graph, analysed: list[tuple[Subgraph, Any, StaticFeatures | None]],
              runs: list[str] | None) -> dict[str, Any]:
    return {
        "model": graph.name,
        "graph": graph.model_dump(mode="json"),
        "subgraphs": [
            {
                "structural_hash": sub.structural_hash,
                "family_hash": sub.family_hash,
                "kind": sub.kind.value,
                "tunable": sub.tunable,
                "not_tunable_reason": sub.not_tunable_reason,
                "source_inputs": list(sub.source_inputs),
                "source_outputs": list(sub.source_outputs),
                "graph": sub.graph.model_dump(mode="json"),
                "loop_program": None if program is None else str(program),
                "features": None if features is None else features.as_dict(),
                **({} if runs is None else {"runs_as": runs[n]}),
            }
            for n, (sub, program, features) in enumerate(analysed)
        ],
    }


def inspect_command(
    model: Annotated[str, typer.Argument(help="zoo model name or zoo:NAME, .onnx file, IR .json (a graph "
                                              "document or what inspect --json wrote), or a .tbplan plan file (then "
                                              "also how each subgraph runs, and which layout ops were folded)")] = "",
    json_path: Annotated[Path | None, typer.Option("--json", help="write the full IR and features here")] = None,
    list_zoo: Annotated[bool, typer.Option("--list-zoo", help="list the zoo's model names and exit")] = False,
) -> None:
    """Cut MODEL into subgraphs and print one row per subgraph and a summary."""
    if list_zoo:
        from embed import zoo

        console.print("\n".join(zoo.names()))
        return
    if not model:
        fail("missing MODEL: give an .onnx path or zoo:NAME (tunebank inspect --list-zoo lists the zoo)")
    config = settings()
    plan = None
    if model.endswith(".tbplan"):
        try:
            plan = read_plan(model)[0]
        except PlanError as exc:
            fail(str(exc))
        graph = plan.graph
    else:
        with console.status(escape(printable(f"importing {model}", 60))):
            graph = load_graph(model, config)
    try:
        subgraphs = partition(graph)
        analysed = [(sub, *_analyse(sub, config.max_kernel_nodes)) for sub in subgraphs]
        if plan is not None and [s.structural_hash for s in plan.steps] != [s.structural_hash for s in subgraphs]:
            fail("the plan's steps do not match its graph's subgraphs (made by another tunebank version, or edited)")
        runs = None if plan is None else runs_as(plan)
    except (EmbedError, PlanError) as exc:
        fail(str(exc))
    except MemoryError:
        fail(f"out of memory analysing {model!r}")

    table = Table(title=plain(f"{graph.name or model}: {len(subgraphs)} subgraphs"))
    columns = ["hash", "kind", "ops", "shapes", "flops", "bytes", "flop/B"] + ([] if runs is None else ["runs as"])
    for column in columns:
        numeric = column in ("flops", "bytes", "flop/B")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column not in ("ops", "shapes"),
                         overflow="fold")
    for n, (sub, _, features) in enumerate(analysed):
        table.add_row(*_row(sub, features), *([] if runs is None else [plain(f"#{n} {runs[n]}")]))
    console.print(table)

    kinds = Counter(sub.kind.value for sub in subgraphs)
    reasons = Counter(sub.not_tunable_reason for sub in subgraphs if not sub.tunable)
    distinct = len({sub.structural_hash for sub in subgraphs})
    console.print(
        f"{len(subgraphs)} subgraphs ({distinct} distinct): " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        markup=False)
    if runs is not None:
        folded = [f"#{n} {'+'.join(subgraphs[n].ops)} {r}" for n, r in enumerate(runs) if r.startswith("folded")]
        layouts = sum(sub.kind == SubgraphKind.LAYOUT for sub in subgraphs)
        console.print(plain(f"layout subgraphs folded: {len(folded)} of {layouts}", 10**6),
                      *(plain(f"  {f}") for f in folded), sep="\n")
    not_tunable = sum(reasons.values())
    console.print(plain(f"not tunable: {not_tunable}", 10**6), *(plain(f"  {n} x {reason}") for reason, n in
                                                                   reasons.items()), sep="\n")
    if json_path is not None:
        try:
            json_path.write_text(strict_json(_document(graph, analysed, runs)))
        except OSError as exc:
            fail(f"cannot write {json_path}: {exc.strerror or exc}")
        console.print(plain(f"wrote {json_path}"))
