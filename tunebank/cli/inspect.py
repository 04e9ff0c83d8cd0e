"""``tunebank inspect MODEL``: the subgraphs of a model, their kinds, sizes and static features."""

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
from embed.partition import partition
from embed.subgraph import Subgraph
from service.strict_json import strict_json
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


def _document(graph: Graph, analysed: list[tuple[Subgraph, Any, StaticFeatures | None]]) -> dict[str, Any]:
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
            }
            for sub, program, features in analysed
        ],
    }


def inspect_command(
    model: Annotated[str, typer.Argument(help="zoo model name or zoo:NAME, .onnx file, or IR .json (a graph "
                                              "document or what inspect --json wrote)")] = "",
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
    with console.status(escape(printable(f"importing {model}", 60))):
        graph = load_graph(model, config)
    try:
        subgraphs = partition(graph)
        analysed = [(sub, *_analyse(sub, config.max_kernel_nodes)) for sub in subgraphs]
    except EmbedError as exc:
        fail(str(exc))
    except MemoryError:
        fail(f"out of memory analysing {model!r}")

    table = Table(title=plain(f"{graph.name or model}: {len(subgraphs)} subgraphs"))
    for column in ("hash", "kind", "ops", "shapes", "flops", "bytes", "flop/B"):
        numeric = column in ("flops", "bytes", "flop/B")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=column not in ("ops", "shapes"),
                         overflow="fold")
    for sub, _, features in analysed:
        table.add_row(*_row(sub, features))
    console.print(table)

    kinds = Counter(sub.kind.value for sub in subgraphs)
    reasons = Counter(sub.not_tunable_reason for sub in subgraphs if not sub.tunable)
    distinct = len({sub.structural_hash for sub in subgraphs})
    console.print(
        f"{len(subgraphs)} subgraphs ({distinct} distinct): " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        markup=False)
    not_tunable = sum(reasons.values())
    console.print(plain(f"not tunable: {not_tunable}", 10**6), *(plain(f"  {n} x {reason}") for reason, n in
                                                                   reasons.items()), sep="\n")
    if json_path is not None:
        try:
            json_path.write_text(strict_json(_document(graph, analysed)))
        except OSError as exc:
            fail(f"cannot write {json_path}: {exc.strerror or exc}")
        console.print(plain(f"wrote {json_path}"))
