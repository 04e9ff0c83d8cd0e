import itertools
import random
import re

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from embed.builder import GraphBuilder
from embed.canonical import canonicalize, canonicalize_with_names, family_hash, structural_hash
from embed.ir import Graph, Node

UNARY = ["relu", "exp", "neg", "tanh"]
BINARY = ["add", "mul", "sub", "maximum"]
KINDS = ["ab", "a1", "b"]  # shape kinds: (a, b), (a, 1), (b,)


@st.composite
def recipes(draw: st.DrawFn, max_nodes: int = 6) -> dict:
    """A random graph description: inputs (role, shape kind) and steps reading earlier tensors."""
    inputs = [("input", "ab")] + draw(
        st.lists(st.tuples(st.sampled_from(["input", "param"]), st.sampled_from(KINDS)), max_size=2)
    )
    kinds = [kind for _, kind in inputs]
    steps = []
    for _ in range(draw(st.integers(1, max_nodes))):
        choice = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "softmax", "const"]))
        full = [i for i, k in enumerate(kinds) if k == "ab"]
        if choice == "unary":
            steps.append(("unary", draw(st.sampled_from(UNARY)), draw(st.integers(0, len(kinds) - 1))))
            kinds.append(kinds[steps[-1][2]])
        elif choice == "binary":
            x, y = draw(st.integers(0, len(kinds) - 1)), draw(st.integers(0, len(kinds) - 1))
            steps.append(("binary", draw(st.sampled_from(BINARY)), x, y))
            kinds.append(kinds[x] if kinds[x] == kinds[y] else "ab")
        elif choice == "const":
            steps.append(("const", draw(st.sampled_from([0.5, 2.0])), draw(st.integers(0, len(kinds) - 1))))
            kinds.append(kinds[steps[-1][2]])
        else:
            steps.append((choice, draw(st.sampled_from(full))))
            kinds.append("a1" if choice == "reduce" else "ab")
    return {"inputs": inputs, "steps": steps}


def build(recipe: dict, a: int = 3, b: int = 4, dtype: str = "float32") -> Graph:
    shapes = {"ab": (a, b), "a1": (a, 1), "b": (b,)}
    g = GraphBuilder("random")
    pool: list[tuple[str, str]] = []
    for k, (role, kind) in enumerate(recipe["inputs"]):
        pool.append((getattr(g, role)(f"x{k}", shapes[kind], dtype), kind))
    used: set[str] = set()
    for step in recipe["steps"]:
        if step[0] == "unary":
            (src, kind) = pool[step[2]]
            out = g.node(step[1], [src], shapes[kind], dtype)
            used.add(src)
        elif step[0] == "binary":
            (x, kx), (y, ky) = pool[step[2]], pool[step[3]]
            kind = kx if kx == ky else "ab"
            out = g.node(step[1], [x, y], shapes[kind], dtype)
            used |= {x, y}
        elif step[0] == "const":
            (src, kind) = pool[step[2]]
            out = g.node("mul", [src, g.const(step[1], dtype)], shapes[kind], dtype)
            used.add(src)
        else:
            src = pool[step[1]][0]
            kind = "a1" if step[0] == "reduce" else "ab"
            attrs = {"axes": [-1], "keepdim": True} if step[0] == "reduce" else {"axis": -1}
            out = g.node("reduce_sum" if step[0] == "reduce" else "softmax", [src], shapes[kind], dtype, **attrs)
            used.add(src)
        pool.append((out, kind))
    sinks = [name for name, _ in pool if name not in used and name not in g.inputs]
    return g.build(sinks)


def relisted(graph: Graph, seed: int) -> Graph:
    """The same graph with tensors renamed at random and independent nodes listed in a random order."""
    rng = random.Random(seed)
    names = list(graph.tensors)
    fresh = [f"v{k}" for k in range(len(names))]
    rng.shuffle(fresh)
    rename = dict(zip(names, fresh, strict=True))
    producers = graph.producers()
    done: set[str] = {n for n in graph.tensors if n not in producers}
    remaining = list(range(len(graph.nodes)))
    order = []
    while remaining:
        ready = [i for i in remaining if all(t in done for t in graph.nodes[i].inputs)]
        pick = rng.choice(ready)
        remaining.remove(pick)
        order.append(pick)
        done |= set(graph.nodes[pick].outputs)
    nodes = [
        Node(op=n.op, inputs=tuple(rename[t] for t in n.inputs), outputs=tuple(rename[t] for t in n.outputs),
             attrs=dict(reversed(list(n.attrs.items()))))
        for n in (graph.nodes[i] for i in order)
    ]
    tensors = [(rename[k], v) for k, v in graph.tensors.items()]
    rng.shuffle(tensors)
    inputs, outputs = [rename[t] for t in graph.inputs], [rename[t] for t in graph.outputs]
    rng.shuffle(inputs)
    rng.shuffle(outputs)
    return Graph(name="other", tensors=dict(tensors), nodes=tuple(nodes), inputs=tuple(inputs), outputs=tuple(outputs))


def brute_form(graph: Graph) -> tuple:
    """A complete isomorphism invariant by brute force: the least listing over all topological orders."""
    producers = graph.producers()
    best = None
    for order in itertools.permutations(range(len(graph.nodes))):
        position = {i: k for k, i in enumerate(order)}
        if any(position[producers[t]] > position[i] for i in order for t in graph.nodes[i].inputs if t in producers):
            continue
        index: dict[str, int] = {}
        for i in order:
            for t in (*graph.nodes[i].inputs, *graph.nodes[i].outputs):
                index.setdefault(t, len(index))

        def describe(t: str) -> tuple:
            tensor = graph.tensors[t]
            return tensor.shape, tensor.dtype, tensor.role, tensor.value, t in graph.outputs

        form = (
            tuple(describe(t) for t in index),
            tuple((graph.nodes[i].op, sorted(graph.nodes[i].attrs.items()),
                   [index[t] for t in graph.nodes[i].inputs], [index[t] for t in graph.nodes[i].outputs])
                  for i in order),
            tuple(sorted(describe(t) for t in graph.tensors if t not in index)),
            tuple(sorted(index[t] for t in graph.outputs if t in index)),
        )
        best = form if best is None else min(best, form, key=repr)
    return best


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(recipes(), st.integers(0, 2**32 - 1))
def test_renaming_and_relisting_keep_both_hashes(recipe: dict, seed: int) -> None:
    graph = build(recipe)
    other = relisted(graph, seed)
    assert structural_hash(other) == structural_hash(graph)
    assert family_hash(other) == family_hash(graph)
    assert canonicalize(other).model_dump(exclude={"name"}) == canonicalize(graph).model_dump(exclude={"name"})


@FAST
@given(recipes(), st.sampled_from([(2, 5), (4, 3), (5, 7)]))
def test_shape_change_changes_structural_hash_only(recipe: dict, dims: tuple[int, int]) -> None:
    graph, resized = build(recipe), build(recipe, *dims)
    assert structural_hash(resized) != structural_hash(graph)
    assert family_hash(resized) == family_hash(graph)


@FAST
@given(recipes(), st.sampled_from(["float16", "float64", "bfloat16"]))
def test_dtype_change_changes_both_hashes(recipe: dict, dtype: str) -> None:
    graph, cast = build(recipe), build(recipe, dtype=dtype)
    assert structural_hash(cast) != structural_hash(graph)
    assert family_hash(cast) != family_hash(graph)


@FAST
@given(recipes(), st.data())
def test_op_change_changes_structural_hash(recipe: dict, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(recipe["steps"]) - 1))
    step = recipe["steps"][k]
    if step[0] == "unary":
        new = (step[0], data.draw(st.sampled_from([op for op in UNARY if op != step[1]])), *step[2:])
    elif step[0] == "binary":
        new = (step[0], data.draw(st.sampled_from([op for op in BINARY if op != step[1]])), *step[2:])
    elif step[0] == "const":
        new = (step[0], 3.0, step[2])  # a constant's value is part of the structure
    else:
        new = ("softmax" if step[0] == "reduce" else "reduce", step[1])
    changed = {**recipe, "steps": [*recipe["steps"][:k], new, *recipe["steps"][k + 1:]]}
    assert structural_hash(build(changed)) != structural_hash(build(recipe))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes(max_nodes=5), st.data())
def test_hash_equality_matches_isomorphism(recipe: dict, data: st.DataObject) -> None:
    """Rewire one operand: the hashes agree exactly when a brute-force isomorphism test says so."""
    binaries = [k for k, s in enumerate(recipe["steps"]) if s[0] == "binary"]
    graph = build(recipe)
    if binaries:
        k = data.draw(st.sampled_from(binaries))
        op, x, y = recipe["steps"][k][1:]
        y = data.draw(st.integers(0, len(recipe["inputs"]) + k - 1))
        recipe = {**recipe, "steps": [*recipe["steps"][:k], ("binary", op, x, y), *recipe["steps"][k + 1:]]}
    rewired = build(recipe)
    assert (structural_hash(rewired) == structural_hash(graph)) == (brute_form(rewired) == brute_form(graph))


@FAST
@given(recipes())
def test_canonicalize_is_idempotent_and_names_by_role(recipe: dict) -> None:
    canonical, renaming = canonicalize_with_names(build(recipe))
    assert canonicalize(canonical) == canonical
    prefix = {"input": "in", "param": "w", "const": "c", "intermediate": "t"}
    for name, tensor in canonical.tensors.items():
        assert re.fullmatch(prefix[tensor.role.value] + r"\d+", name)
    assert sorted(renaming.values()) == sorted(canonical.tensors)


def _symmetric(chain: tuple[str, ...]) -> Graph:
    """Two identical branches x -> chain and y -> chain: every node has a twin it is tied with."""
    g = GraphBuilder()
    ends = []
    for name in ("x", "y"):
        t = g.input(name, (4,), "float32")
        for op in chain:
            t = g.node(op, [t], (4,), "float32")
        ends.append(t)
    return g.build(ends)


def test_tied_branches_hash_alike_in_every_listing() -> None:
    for chain in [("relu", "exp", "sin"), ("sin", "exp", "relu"), ("cos", "neg", "abs", "tanh")]:
        graph = _symmetric(chain)
        forms = {canonicalize(relisted(graph, seed)).model_dump_json(exclude={"name"}) for seed in range(30)}
        assert len(forms) == 1
        assert len({structural_hash(relisted(graph, seed)) for seed in range(30)}) == 1


def test_wiring_and_attributes_are_part_of_the_hash() -> None:
    def graph(swap: bool, eps: float) -> Graph:
        g = GraphBuilder()
        x, w = g.input("x", (2, 4), "float32"), g.param("w", (4,), "float32")
        h = g.node("sub", [w, x] if swap else [x, w], (2, 4), "float32")
        return g.build([g.node("layer_norm", [h], (2, 4), "float32", axes=[-1], eps=eps)])

    hashes = {structural_hash(graph(s, e)) for s in (False, True) for e in (1e-5, 1e-6)}
    assert len(hashes) == 4
    assert structural_hash(graph(False, 1e-5)) == structural_hash(graph(False, 1e-5))


def test_family_form_ignores_size_attributes_but_keeps_rank() -> None:
    def graph(n: int, rank: int = 1) -> Graph:
        g = GraphBuilder()
        x = g.input("x", (2, n), "float32")
        shape = [2 * n] if rank == 1 else [n, 2]
        y = g.node("reshape", [x], shape, "float32", shape=shape)
        return g.build([g.node("slice", [y], [n, *shape[1:]], "float32", axis=0, start=0, end=n, step=1)])

    assert family_hash(graph(4)) == family_hash(graph(8))
    assert structural_hash(graph(4)) != structural_hash(graph(8))
    assert family_hash(graph(4)) != family_hash(graph(4, rank=2))
