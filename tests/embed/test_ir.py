import json

import pytest

from embed.builder import GraphBuilder
from embed.errors import InvalidGraphError
from embed.ir import MAX_ELEMENTS, MAX_NAME, DType, graph_from_json
from embed.registry import Registry, UnknownNameError


def _graph():
    b = GraphBuilder("g")
    x = b.input("x", (4, 8), "float16")
    w = b.param("w", (8,), "float16")
    y = b.node("add", [x, w], (4, 8), "float16")
    s = b.node(
        "softmax", [b.node("mul", [y, b.const(0.125, "float16")], (4, 8), "float16")], (4, 8), "float16", axis=-1
    )
    return b.build([s])


def _document(**changes):
    doc = json.loads(_graph().to_json())
    doc.update(changes)
    return doc


def test_json_round_trip_keeps_the_graph():
    graph = _graph()
    assert graph_from_json(graph.to_json()) == graph
    assert graph.tensors["x"].nbytes == 4 * 8 * 2
    assert DType("bfloat16").itemsize == 2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["tensors"]["x"].update(shape=[2**20, 2**20, 2**20]), "over the limit"),
        (lambda d: d["tensors"]["x"].update(shape=[1] * 9), "at most 8"),
        (lambda d: d["tensors"]["x"].update(shape=[-1, 8]), "greater than or equal to 0"),
        (lambda d: d["tensors"]["x"].update(dtype="complex128"), "dtype"),
        (lambda d: d["nodes"][0].update(op="fancy_op"), "unknown op 'fancy_op'"),
        (lambda d: d["nodes"][0].update(inputs=["x", "nowhere"]), "'nowhere' is not a declared tensor"),
        (lambda d: d["nodes"][2].update(attrs={}), "needs attributes ['axis']"),
        (lambda d: d["nodes"][2].update(attrs={"axis": "last"}), "must be int"),
        (lambda d: d["nodes"][2].update(attrs={"axis": -1, "bogus": 1}), "has no attribute 'bogus'"),
        (lambda d: d["nodes"].reverse(), "before it is produced"),
        (lambda d: d.update(outputs=["ghost"]), "'ghost' is not a declared tensor"),
        (lambda d: d["tensors"].update({"n" * (MAX_NAME + 1): d["tensors"]["x"]}), "at most 256"),
    ],
)
def test_hostile_documents_are_refused_with_one_clear_line(mutate, message):
    doc = _document()
    mutate(doc)
    with pytest.raises(InvalidGraphError) as err:
        graph_from_json(json.dumps(doc))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_not_json_at_all_is_refused():
    with pytest.raises(InvalidGraphError, match="Invalid JSON"):
        graph_from_json(b"\x00\xff garbage")


def test_element_limit_is_exact():
    b = GraphBuilder()
    b.input("x", (2**18, 2**18), "bool")
    assert b.tensors["x"].numel == MAX_ELEMENTS
    with pytest.raises(InvalidGraphError, match="over the limit"):
        GraphBuilder().input("x", (2**18, 2**18, 2), "bool")
    with pytest.raises(InvalidGraphError, match="less than or equal to 2147483647"):
        GraphBuilder().input("x", (2**31,), "bool")


def test_registry_lists_valid_names_and_imports_lazily():
    reg: Registry[object] = Registry("thing")
    reg.register("a", 1)
    reg.register_lazy("b", "embed.ir:DType")
    assert reg.get("b") is DType
    assert reg.names() == ["a", "b"]
    with pytest.raises(UnknownNameError, match="unknown thing 'c'; choose one of: a, b"):
        reg.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a", 2)
