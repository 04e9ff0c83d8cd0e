"""A generated corpus of hostile models and graph documents, one class per way a file can attack the importer,
the partitioner, the tuner or the terminal.

``cases()`` builds every case in memory (deterministic); ``Case.write(folder)`` puts its files on disk and returns
the model argument to give ``tunebank inspect`` and ``tunebank tune``. Each case must end with exit code 0 or 2 and
at most one line on stderr, within a time and memory cap (``tests/fuzz/test_fuzz.py``).
"""

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
Files = dict[str, bytes]


@dataclass(frozen=True)
class Case:
    klass: str
    name: str
    files: Files = field(default_factory=dict)
    model: str = "m.onnx"
    special: str = ""  # "fifo" | "folder": the model path is made a FIFO or a folder

    @property
    def id(self) -> str:
        return f"{self.klass}/{self.name}"

    def write(self, folder: Path) -> str:
        for name, data in self.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        model = folder / self.model
        if self.special == "fifo":
            os.mkfifo(model)
        elif self.special == "folder":
            model.mkdir()
        elif self.special == "symlink-out":
            (folder / "outside").mkdir()
            (folder / "outside" / "w.bin").write_bytes(np.ones(256, np.float32).tobytes())
            (folder / "w.bin").symlink_to(folder / "outside" / "w.bin")
        return str(model)


# -- building blocks --------------------------------------------------------------------------------------------------


def vi(name: str, shape: list[Any] | None, elem: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def model(
    nodes: list[Any],
    inputs: list[Any],
    outputs: list[Any],
    inits: list[Any] = (),
    *,  # type: ignore[assignment]
    value_info: list[Any] = (),
    name: str = "g",
    opset: int = OPSET,
) -> bytes:  # type: ignore[assignment]
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits), value_info=list(value_info))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return proto.SerializeToString()


def onnx_case(klass: str, name: str, data: bytes, **extra_files: bytes) -> Case:
    return Case(klass, name, {"m.onnx": data, **extra_files})


def chain(ops: list[str], shape: list[int], names: Callable[[int], str] = lambda i: f"t{i}", **graph: Any) -> bytes:
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else names(i)
        nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}"))
        prev = out
    return model(nodes, [vi("x", shape)], [vi("y", shape)], **graph)


def many_inputs(n: int, prefix: str) -> bytes:
    """``n`` inputs whose names share ``prefix`` (longer than the IR keeps), added up by a chain of n - 1 adds."""
    inputs = [vi(f"{prefix}{i}", [2]) for i in range(n)]
    nodes = [helper.make_node("Add", [inputs[0].name, inputs[1].name], ["s1"])]
    nodes += [helper.make_node("Add", [f"s{i - 1}", inputs[i].name], [f"s{i}"]) for i in range(2, n)]
    return model(nodes, inputs, [vi(f"s{n - 1}", [2])])


def ints(name: str, values: list[int]) -> Any:
    return numpy_helper.from_array(np.array(values, np.int64), name)


# -- classes ----------------------------------------------------------------------------------------------------------

HOSTILE_TEXT = [
    "[/x]",
    "[bold red]boom[/]",
    "[link=file:///etc/passwd]x[/link]",
    "\x1b[2J\x1b[H",
    "\x1b]0;pwned\x07",
    "\x1b[31mred",
    "a\rb",
    "line\nbreak",
    "tab\there",
    "\x00nul",
    "\u202eevil",
    "'; DROP TABLE subgraphs; --",
    "__import__('os').system('id')",
    "$(touch /tmp/tunebank_pwned)",
    "`id`",
    "{0.__class__}",
    "%s%s%n",
    '*/ system("id"); /*',
    "#include </etc/passwd>",
    "\\",
    "\ud7ff\ue000",
    "x" * 300,
    "..",
    "/etc/passwd",
    "[",
    "]",
    "[[/x]]",
    "\u200b",
    "emoji 🐍",
    "\x7f\x9b31m",
]


def names() -> Iterator[Case]:
    for i, text in enumerate(HOSTILE_TEXT):
        which = i % 3
        if which == 0:  # an unknown op named by the text (reaches the table as an opaque node)
            nodes = [
                helper.make_node(text.replace("\x00", "") or "x", ["x"], ["h"], domain="evil.domain", name=text),
                helper.make_node("Relu", ["h"], ["y"], name=text),
            ]
            data = model(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])], value_info=[vi("h", [4, 8])], name=text)
            data = model_with_opset(data, "evil.domain")
        elif which == 1:  # tensor names
            data = chain(["Relu", "Sigmoid", "Tanh"], [4, 8], names=lambda k, t=text: f"{t}{k}", name=text)
        else:  # graph name and node names on tunable ops, input named by the text
            nodes = [helper.make_node("Softmax", [text or "x"], ["y"], axis=-1, name=text)]
            data = model(nodes, [vi(text or "x", [4, 8])], [vi("y", [4, 8])], name=text)
        yield onnx_case("names", f"text{i}", data)
    yield Case("names", "json-markup", {"g.json": _ir_doc(name="[/x]", op_name="[bold]x[/]")}, model="g.json")
    yield Case("names", "json-escape", {"g.json": _ir_doc(name="\x1b[2J", op_name="\x1b]0;t\x07")}, model="g.json")


def model_with_opset(data: bytes, domain: str) -> bytes:
    from onnx import ModelProto

    proto = ModelProto()
    proto.ParseFromString(data)
    proto.opset_import.append(helper.make_opsetid(domain, 1))
    return proto.SerializeToString()


def attributes() -> Iterator[Case]:
    x, y = [vi("x", [4, 8])], [vi("y", [8, 4])]
    perms = [[1, 0, 2], [5, 0], [0, 0], [-1, 0], [2**62, 0], list(range(100_000)), [1], [-3, -4]]
    for i, perm in enumerate(perms):
        yield onnx_case("attributes", f"perm{i}", model([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], x, y))
    for i, axis in enumerate([2, -3, 2**40, -(2**62), 100]):
        for op in ("Softmax", "LogSoftmax", "Concat", "Flatten"):
            node = helper.make_node(op, ["x"] if op != "Concat" else ["x", "x"], ["y"], axis=axis)
            yield onnx_case("attributes", f"{op}-axis{i}", model([node], x, [vi("y", None)]))
    for i, axes in enumerate([[5], [0, 0], [-9], [2**40], list(range(70))]):
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
        yield onnx_case("attributes", f"reduce-axes{i}", model([node], x, [vi("y", None)], [ints("axes", axes)]))
    for i, index in enumerate([8, -9, 2**40, -(2**62)]):
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
        yield onnx_case(
            "attributes",
            f"gather-index{i}",
            model([node], x, [vi("y", None)], [numpy_helper.from_array(np.array(index, np.int64), "i")]),
        )
    weird = [
        ("Relu", {"alpha": "string"}),
        ("LeakyRelu", {"alpha": 1e308}),
        ("Gemm", {"transA": 7}),
        ("Softmax", {"axis": "one"}),
        ("Cast", {"to": 9999}),
        ("Cast", {"to": TensorProto.STRING}),
        ("Split", {"axis": 0, "num_outputs": 2**31}),
        ("Slice", {}),
        ("Pad", {"mode": "\x1b[2J"}),
        ("Conv", {"kernel_shape": [2**31, 2**31]}),
        ("Reshape", {"allowzero": 5}),
        ("Clip", {"min": 1.0}),
    ]
    for i, (op, attrs) in enumerate(weird):
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        yield onnx_case("attributes", f"weird{i}-{op}", model([node], x, [vi("y", None)]))


def lying_value_info() -> Iterator[Case]:
    """Small declared shapes for ops whose real output is huge (the 137-byte bombs), and declared shapes that
    disagree with the computed ones."""
    shapes = [[2**31 - 1], [65536, 65536], [2**20, 2**13], [3, 2**34], [1, 1, 1, 2**32]]
    for i, shape in enumerate(shapes):
        init = [ints("s", shape)]
        tiny = [vi("y", [1])]
        yield onnx_case(
            "lying_value_info",
            f"constant_of_shape{i}",
            model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], tiny, init),
        )
        yield onnx_case(
            "lying_value_info",
            f"expand{i}",
            model([helper.make_node("Expand", ["x", "s"], ["y"])], [vi("x", [1])], tiny, init),
        )
        yield onnx_case(
            "lying_value_info",
            f"constant_of_shape_vi{i}",
            model(
                [helper.make_node("ConstantOfShape", ["s"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                [],
                tiny,
                init,
                value_info=[vi("h", [1])],
            ),
        )
    for i, (start, limit, delta) in enumerate([(0, 2**40, 1), (0, 10**12, 3), (-(2**62), 2**62, 1), (0, 1, 0)]):
        init = [ints("a", [start]), ints("b", [limit]), ints("c", [delta])]
        init = [
            numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("a", start), ("b", limit), ("c", delta))
        ]
        yield onnx_case(
            "lying_value_info",
            f"range{i}",
            model(
                [helper.make_node("Range", ["a", "b", "c"], ["y"])],
                [],
                [vi("y", [4], TensorProto.INT64)],
                init,
                value_info=[vi("y", [4], TensorProto.INT64)],
            ),
        )
    for i, reps in enumerate([[2**20, 2**20], [2**31, 1], [1, 2**40]]):
        yield onnx_case(
            "lying_value_info",
            f"tile{i}",
            model(
                [helper.make_node("Tile", ["x", "r"], ["y"])], [vi("x", [4, 8])], [vi("y", [4, 8])], [ints("r", reps)]
            ),
        )
    for i, declared in enumerate([[4, 4], [1], [8, 4, 1], [0, 8], [2**31, 8]]):
        yield onnx_case(
            "lying_value_info",
            f"declared{i}",
            model(
                [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"])],
                [vi("x", [4, 8])],
                [vi("y", declared)],
                value_info=[vi("h", declared)],
            ),
        )
    for i, shape in enumerate([[2**16, 2**16], [-1, 2**31], [0, -5], [2**33]]):
        yield onnx_case(
            "lying_value_info",
            f"reshape{i}",
            model(
                [helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", [4, 8])], [vi("y", [32])], [ints("s", shape)]
            ),
        )


def dims() -> Iterator[Case]:
    """Legal but huge shapes, and zero-size ones."""
    huge = [
        [2**31 - 1],
        [32768, 32768],
        [2**33],
        [2**16, 2**17],
        [2**31 - 1, 2],
        [1] * 8 + [2**20],
        [1] * 9,
        [2**12] * 3,
        [65536, 65536, 4],
    ]
    for i, shape in enumerate(huge):
        yield onnx_case("dims", f"huge-relu{i}", chain(["Relu"], shape))
    yield onnx_case(
        "dims",
        "matmul-32k",
        model(
            [helper.make_node("MatMul", ["a", "b"], ["y"])],
            [vi("a", [32768, 32768]), vi("b", [32768, 32768])],
            [vi("y", [32768, 32768])],
        ),
    )
    yield onnx_case(
        "dims",
        "matmul-long-k",
        model(
            [helper.make_node("MatMul", ["a", "b"], ["y"])],
            [vi("a", [1, 2**30]), vi("b", [2**30, 1])],
            [vi("y", [1, 1])],
        ),
    )
    yield onnx_case(
        "dims",
        "weight-2^33",
        model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [vi("x", [2, 2**16])],
            [vi("y", [2, 2**17])],
            [TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**16, 2**17])],
        ),
    )
    zero = [[0], [0, 8], [8, 0], [4, 0, 8], [0, 0]]
    for i, shape in enumerate(zero):
        for op in ("Relu", "Softmax", "ReduceSum", "Exp"):
            nodes = [helper.make_node(op, ["x"], ["y"], **({"axis": -1} if op == "Softmax" else {}))]
            yield onnx_case("dims", f"zero{i}-{op}", model(nodes, [vi("x", shape)], [vi("y", None)]))
        yield onnx_case(
            "dims",
            f"zero{i}-matmul",
            model(
                [helper.make_node("MatMul", ["x", "w"], ["y"])],
                [vi("x", shape), vi("w", [shape[-1], 4])],
                [vi("y", None)],
            ),
        )
    yield onnx_case(
        "dims",
        "matmul-zero-k",
        model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [4, 0]), vi("w", [0, 4])], [vi("y", [4, 4])]),
    )
    yield onnx_case("dims", "negative", chain(["Relu"], [-3, 4]))
    yield onnx_case("dims", "symbolic", chain(["Relu"], ["batch", 4]))
    yield onnx_case(
        "dims", "no-shape", model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", None)], [vi("y", None)])
    )


def cycles() -> Iterator[Case]:
    yield onnx_case(
        "cycles",
        "two",
        model(
            [
                helper.make_node("Add", ["x", "b"], ["a"]),
                helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("Relu", ["a"], ["y"]),
            ],
            [vi("x", [4])],
            [vi("y", [4])],
        ),
    )
    yield onnx_case(
        "cycles", "self", model([helper.make_node("Add", ["x", "y"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    )
    for n in (3, 10, 1000):
        nodes = [helper.make_node("Relu", [f"t{(i + 1) % n}"], [f"t{i}"]) for i in range(n)]
        nodes.append(helper.make_node("Add", ["x", "t0"], ["y"]))
        yield onnx_case("cycles", f"ring{n}", model(nodes, [vi("x", [4])], [vi("y", [4])]))
    yield onnx_case("cycles", "output-is-input", model([], [vi("x", [4])], [vi("x", [4])]))
    yield onnx_case(
        "cycles", "dangling", model([helper.make_node("Add", ["x", "ghost"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    )
    yield onnx_case(
        "cycles", "unproduced-output", model([helper.make_node("Relu", ["x"], ["h"])], [vi("x", [4])], [vi("y", [4])])
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Add", ["a", "c"], ["y"]),
        helper.make_node("Relu", ["y"], ["c"]),
    ]
    yield onnx_case("cycles", "diamond-back", model(nodes, [vi("x", [4])], [vi("y", [4])]))
    yield Case("cycles", "json-cycle", {"g.json": _ir_cycle()}, model="g.json")


def big_graphs() -> Iterator[Case]:
    ops = ["Relu", "Neg", "Sigmoid", "Tanh"]
    yield onnx_case("big_graphs", "chain-20k", chain([ops[i % 4] for i in range(20_000)], [4, 4]))
    yield onnx_case("big_graphs", "chain-over-limit", chain(["Relu"] * 20_001, [4]))
    prefix = "p" * 300
    yield onnx_case("big_graphs", "inputs-20k-shared-prefix", many_inputs(20_000, prefix))
    fan = [helper.make_node("Relu", ["x"], [f"r{i}"]) for i in range(5000)]
    fan.append(helper.make_node("Sum", [f"r{i}" for i in range(5000)], ["y"]))
    yield onnx_case("big_graphs", "fan-5k", model(fan, [vi("x", [8])], [vi("y", [8])]))
    nodes = [helper.make_node("Relu", ["x"], ["t0"])]
    nodes += [helper.make_node("Add", [f"t{i}", f"t{max(i - 7, 0)}"], [f"t{i + 1}"]) for i in range(10_000)]
    nodes.append(helper.make_node("Relu", ["t10000"], ["y"]))
    yield onnx_case("big_graphs", "skip-chain-10k", model(nodes, [vi("x", [4])], [vi("y", [4])]))
    yield Case("big_graphs", "json-chain-20k", {"g.json": _ir_chain(20_000)}, model="g.json")


def colliding_names() -> Iterator[Case]:
    long = "n" * 400
    cases = {
        "produced-twice": [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
        "output-overwrites-input": [helper.make_node("Relu", ["x"], ["x"]), helper.make_node("Neg", ["x"], ["y"])],
        "truncated-collide": [
            helper.make_node("Relu", ["x"], [long + "a"]),
            helper.make_node("Neg", ["x"], [long + "b"]),
            helper.make_node("Add", [long + "a", long + "b"], ["y"]),
        ],
        "empty-name-output": [helper.make_node("Relu", ["x"], [""]), helper.make_node("Neg", ["x"], ["y"])],
        "generated-lookalike": [
            helper.make_node("Relu", ["x"], ["t1"]),
            helper.make_node("Neg", ["t1"], ["c1"]),
            helper.make_node("Add", ["c1", "t1"], ["y"]),
        ],
        "same-node-names": [
            helper.make_node("Relu", ["x"], ["a"], name="n"),
            helper.make_node("Neg", ["a"], ["y"], name="n"),
        ],
    }
    for name, nodes in cases.items():
        yield onnx_case("colliding_names", name, model(nodes, [vi("x", [4])], [vi("y", [4])]))
    w = numpy_helper.from_array(np.ones(4, np.float32), "x")
    yield onnx_case(
        "colliding_names",
        "input-is-initializer",
        model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4])], [w]),
    )
    yield onnx_case(
        "colliding_names",
        "two-initializers",
        model(
            [helper.make_node("Add", ["x", "w"], ["y"])],
            [vi("x", [4])],
            [vi("y", [4])],
            [
                numpy_helper.from_array(np.ones(4, np.float32), "w"),
                numpy_helper.from_array(np.zeros(4, np.float32), "w"),
            ],
        ),
    )
    yield onnx_case(
        "colliding_names",
        "duplicate-inputs",
        model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4]), vi("x", [8])], [vi("y", [4])]),
    )
    yield onnx_case(
        "colliding_names",
        "duplicate-outputs",
        model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4])], [vi("y", [4]), vi("y", [4])]),
    )
    for i, n in enumerate((2, 300)):
        yield onnx_case("colliding_names", f"long-prefix{i}", many_inputs(n, long))
    yield Case("colliding_names", "json-produced-twice", {"g.json": _ir_doc(twice=True)}, model="g.json")


def dtypes() -> Iterator[Case]:
    for elem in (
        TensorProto.STRING,
        TensorProto.COMPLEX64,
        TensorProto.UINT8,
        TensorProto.INT8,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.UNDEFINED,
        999,
        TensorProto.UINT64,
        TensorProto.INT4,
        TensorProto.COMPLEX128,
    ):
        yield onnx_case(
            "dtypes",
            f"input-{elem}",
            model([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [4], elem)], [vi("y", [4], elem)]),
        )
    for elem in (TensorProto.STRING, TensorProto.UINT8, 999, TensorProto.FLOAT16, TensorProto.BFLOAT16):
        w = TensorProto(name="w", data_type=elem, dims=[4], raw_data=b"\x01" * 3)
        yield onnx_case(
            "dtypes",
            f"initializer-{elem}",
            model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [4])], [vi("y", [4])], [w]),
        )
    for to in (TensorProto.STRING, TensorProto.UINT8, TensorProto.DOUBLE, TensorProto.BOOL, 12345):
        yield onnx_case(
            "dtypes",
            f"cast-{to}",
            model([helper.make_node("Cast", ["x"], ["y"], to=to)], [vi("x", [4])], [vi("y", [4], to)]),
        )
    yield onnx_case(
        "dtypes",
        "mixed-add",
        model(
            [helper.make_node("Add", ["x", "i"], ["y"])],
            [vi("x", [4]), vi("i", [4], TensorProto.INT64)],
            [vi("y", [4])],
        ),
    )
    yield onnx_case(
        "dtypes",
        "bool-softmax",
        model([helper.make_node("Softmax", ["x"], ["y"])], [vi("x", [4, 4], TensorProto.BOOL)], [vi("y", [4, 4])]),
    )
    yield onnx_case(
        "dtypes",
        "int-matmul",
        model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [vi("x", [4, 4], TensorProto.INT32), vi("w", [4, 4], TensorProto.INT32)],
            [vi("y", [4, 4], TensorProto.INT32)],
        ),
    )
    yield Case("dtypes", "json-bad-dtype", {"g.json": _ir_doc(dtype="complex64")}, model="g.json")


def sequences() -> Iterator[Case]:
    seq_out = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 4])
    yield onnx_case(
        "sequences",
        "sequence-output",
        model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)], [vi("x", [4, 4])], [seq_out]),
    )
    for n in (10**6, 10**5, 2**20):
        yield onnx_case(
            "sequences",
            f"split-bomb{n}",
            model(
                [
                    helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
                    helper.make_node("SequenceAt", ["s", "i"], ["y"]),
                ],
                [vi("x", [n])],
                [vi("y", [1])],
                [numpy_helper.from_array(np.array(0, np.int64), "i")],
            ),
        )
    for i, index in enumerate([4, -5, 2**40]):
        yield onnx_case(
            "sequences",
            f"sequence-at{i}",
            model(
                [
                    helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
                    helper.make_node("SequenceAt", ["s", "i"], ["y"]),
                ],
                [vi("x", [4, 4])],
                [vi("y", [1, 4])],
                [numpy_helper.from_array(np.array(index, np.int64), "i")],
            ),
        )
    yield onnx_case(
        "sequences",
        "split-sizes-zero",
        model(
            [
                helper.make_node("SplitToSequence", ["x", "k"], ["s"], axis=0),
                helper.make_node("SequenceAt", ["s", "i"], ["y"]),
            ],
            [vi("x", [4, 4])],
            [vi("y", [1, 4])],
            [numpy_helper.from_array(np.array(0, np.int64), "k"), numpy_helper.from_array(np.array(0, np.int64), "i")],
        ),
    )
    yield onnx_case(
        "sequences",
        "sequence-construct",
        model(
            [
                helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0),
            ],
            [vi("x", [4])],
            [vi("y", [8])],
        ),
    )
    yield onnx_case(
        "sequences",
        "sequence-input",
        model(
            [helper.make_node("SequenceAt", ["s", "i"], ["y"])],
            [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [4])],
            [vi("y", [4])],
            [numpy_helper.from_array(np.array(0, np.int64), "i")],
        ),
    )
    yield onnx_case(
        "sequences",
        "optional-output",
        model(
            [helper.make_node("Optional", ["x"], ["y"])],
            [vi("x", [4])],
            [
                helper.make_value_info(
                    "y", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [4]))
                )
            ],
        ),
    )
    yield onnx_case(
        "sequences",
        "split-empty-outputs",
        model(
            [
                helper.make_node("Split", ["x"], ["a", "", "b"], axis=0, num_outputs=3),
                helper.make_node("Add", ["a", "b"], ["y"]),
            ],
            [vi("x", [6])],
            [vi("y", [2])],
            opset=18,
        ),
    )
    yield onnx_case(
        "sequences",
        "loop",
        model(
            [helper.make_node("Loop", ["", ""], ["y"], body=helper.make_graph([], "b", [], []))],
            [vi("x", [4])],
            [vi("y", [4])],
        ),
    )


def _external_model(location: str, length: int = 1024, offset: int = 0) -> bytes:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16, 16], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        w.external_data.add(key=key, value=value)
    s = TensorProto(name="s", data_type=TensorProto.INT64, dims=[2], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset + 1024)), ("length", "16")):
        s.external_data.add(key=key, value=value)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "s"], ["y"])]
    return model(nodes, [vi("x", [4, 16])], [vi("y", None)], [w, s])


def external_data() -> Iterator[Case]:
    weights = np.ones(256, np.float32).tobytes() + np.array([4, 16], np.int64).tobytes()
    good = {"w.bin": weights}
    yield Case("external_data", "beside", {"m.onnx": _external_model("w.bin"), **good})
    yield Case("external_data", "subfolder", {"m.onnx": _external_model("d/w.bin"), "d/w.bin": weights})
    for i, location in enumerate(
        [
            "../w.bin",
            "/etc/passwd",
            "d/../../w.bin",
            "C:\\w.bin",
            "..\\w.bin",
            "\\\\host\\w",
            "/dev/zero",
            "/proc/self/mem",
            "",
            ".",
            "d",
            "w.bin\x00.txt",
            "~/w.bin",
            "x" * 5000,
        ]
    ):
        yield Case("external_data", f"location{i}", {"m.onnx": _external_model(location), **good, "d/keep": b""})
    for i, (length, offset) in enumerate([(12, 0), (1024, 10**9), (1024, -1), (2**62, 0), (1024, 2**63 - 1)]):
        yield Case("external_data", f"size{i}", {"m.onnx": _external_model("w.bin", length, offset), **good})
    yield Case("external_data", "symlink-out", {"m.onnx": _external_model("w.bin")}, special="symlink-out")
    yield Case("external_data", "missing", {"m.onnx": _external_model("gone.bin")})
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[16, 16], data_location=TensorProto.EXTERNAL)
    yield onnx_case(
        "external_data",
        "no-location",
        model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [4, 16])], [vi("y", [4, 16])], [w]),
    )
    w = TensorProto(name="w", data_type=TensorProto.STRING, dims=[4], data_location=TensorProto.EXTERNAL)
    w.external_data.add(key="location", value="w.bin")
    yield Case(
        "external_data",
        "string-type",
        {
            "m.onnx": model([helper.make_node("Identity", ["w"], ["y"])], [], [vi("y", [4], TensorProto.STRING)], [w]),
            **good,
        },
    )


def _ir_doc(*, name: str = "g", op_name: str = "mystery", dtype: str = "float32", twice: bool = False) -> bytes:
    tensors = {
        "x": {"shape": [4, 8], "dtype": dtype, "role": "input"},
        "h": {"shape": [4, 8], "dtype": dtype},
        "y": {"shape": [4, 8], "dtype": dtype},
    }
    nodes = [
        {"op": "opaque", "inputs": ["x"], "outputs": ["h"], "attrs": {"name": op_name}},
        {"op": "relu", "inputs": ["h"], "outputs": ["y"]},
    ]
    if twice:
        nodes.append({"op": "relu", "inputs": ["x"], "outputs": ["y"]})
    return json.dumps({"name": name, "tensors": tensors, "nodes": nodes, "inputs": ["x"], "outputs": ["y"]}).encode()


def _ir_cycle() -> bytes:
    tensors = {
        "x": {"shape": [4], "dtype": "float32", "role": "input"},
        "a": {"shape": [4], "dtype": "float32"},
        "b": {"shape": [4], "dtype": "float32"},
    }
    nodes = [{"op": "add", "inputs": ["x", "b"], "outputs": ["a"]}, {"op": "relu", "inputs": ["a"], "outputs": ["b"]}]
    return json.dumps({"tensors": tensors, "nodes": nodes, "inputs": ["x"], "outputs": ["b"]}).encode()


def _ir_chain(n: int) -> bytes:
    tensors = {"t0": {"shape": [4], "dtype": "float32", "role": "input"}}
    nodes = []
    for i in range(n):
        tensors[f"t{i + 1}"] = {"shape": [4], "dtype": "float32"}
        nodes.append({"op": ("relu", "neg", "exp")[i % 3], "inputs": [f"t{i}"], "outputs": [f"t{i + 1}"]})
    return json.dumps({"tensors": tensors, "nodes": nodes, "inputs": ["t0"], "outputs": [f"t{n}"]}).encode()


def json_documents() -> Iterator[Case]:
    base = json.loads(_ir_doc())
    docs: dict[str, Any] = {
        "valid": base,
        "empty-object": {},
        "list": [],
        "null": None,
        "number": 3,
        "string": "graph",
        "nested-lists": "[" * 100_000 + "]" * 100_000,
        "nested-objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "nan": '{"tensors": {"x": {"shape": [NaN], "dtype": "float32"}}}',
        "infinity-shape": '{"tensors": {"x": {"shape": [Infinity], "dtype": "float32"}}}',
        "huge-int": '{"tensors": {"x": {"shape": [' + "9" * 5000 + '], "dtype": "float32"}}}',
        "truncated": json.dumps(base)[:50],
        "not-utf8": b"\xff\xfe{\x00}",
        "bom": b"\xef\xbb\xbf" + json.dumps(base).encode(),
        "trailing-garbage": json.dumps(base) + "}}",
    }

    def mutate(path: list[Any], value: Any) -> Any:
        doc = json.loads(json.dumps(base))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc

    mutations = {
        "shape-string": (["tensors", "x", "shape"], "4x8"),
        "shape-float": (["tensors", "x", "shape"], [4.5, 8]),
        "shape-negative": (["tensors", "x", "shape"], [-4, 8]),
        "shape-huge": (["tensors", "x", "shape"], [2**31, 2**31]),
        "shape-zero": (["tensors", "x", "shape"], [0, 8]),
        "shape-rank-9": (["tensors", "x", "shape"], [1] * 9),
        "shape-bool": (["tensors", "x", "shape"], [True, 8]),
        "dtype-int": (["tensors", "x", "dtype"], 5),
        "role-bad": (["tensors", "x", "role"], "admin"),
        "nodes-dict": (["nodes"], {"0": 1}),
        "node-op-unknown": (["nodes", 1, "op"], "system"),
        "node-op-list": (["nodes", 1, "op"], ["relu"]),
        "node-inputs-missing": (["nodes", 1, "inputs"], ["ghost"]),
        "node-attr-huge": (["nodes", 1, "attrs"], {"x" * 10_000: 1}),
        "outputs-empty": (["outputs"], []),
        "inputs-number": (["inputs"], 7),
        "name-long": (["name"], "n" * 100_000),
        "schema-version": (["schema_version"], 2),
        "extra-field": (["evil"], "__import__('os')"),
        "tensors-list": (["tensors"], [1, 2]),
        "output-intermediate-missing": (["outputs"], ["zz"]),
        "value-on-input": (["tensors", "x", "value"], [1.0] * 32),
    }
    for name, (path, value) in mutations.items():
        docs[name] = mutate(path, value)
    many = json.loads(json.dumps(base))
    many["tensors"].update({f"t{i}": {"shape": [1], "dtype": "float32"} for i in range(90_000)})
    docs["tensors-over-limit"] = many
    docs["deep-attrs"] = mutate(["nodes", 0, "attrs"], {"name": {"a": {"b": [[[[1]]]]}}})
    for name, doc in docs.items():
        data = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
        yield Case("json_documents", name, {"g.json": data}, model="g.json")


def files() -> Iterator[Case]:
    rng = np.random.default_rng(0)
    valid = chain(["Relu"], [4, 8])
    yield onnx_case("files", "valid", valid)
    yield onnx_case("files", "empty", b"")
    for i in range(4):
        yield onnx_case("files", f"random{i}", rng.bytes(64 << i))
    for cut in (5, 20, len(valid) // 2, len(valid) - 3):
        yield onnx_case("files", f"truncated{cut}", valid[:cut])
    for i in range(4):
        flipped = bytearray(valid)
        for k in rng.integers(0, len(valid), 6):
            flipped[k] ^= 0xFF
        yield onnx_case("files", f"bitflip{i}", bytes(flipped))
    yield Case("files", "fifo", special="fifo")
    yield Case("files", "folder", special="folder")
    yield Case("files", "missing", {}, model="nothere.onnx")
    yield Case("files", "wrong-suffix", {"m.pt": valid}, model="m.pt")
    yield Case("files", "json-as-onnx", {"m.onnx": b'{"tensors": {}}'})
    yield Case("files", "onnx-as-json", {"g.json": valid}, model="g.json")
    yield onnx_case("files", "old-opset", chain(["Relu"], [4], opset=7))
    yield onnx_case("files", "no-graph", b"\x08\x07")
    yield Case("files", "zoo-unknown", model="zoo:\x1b[2Jnothing")
    yield Case("files", "zoo-markup", model="zoo:[/x]")


CLASSES: dict[str, Callable[[], Iterator[Case]]] = {
    "names": names,
    "attributes": attributes,
    "lying_value_info": lying_value_info,
    "dims": dims,
    "cycles": cycles,
    "big_graphs": big_graphs,
    "colliding_names": colliding_names,
    "dtypes": dtypes,
    "sequences": sequences,
    "external_data": external_data,
    "json_documents": json_documents,
    "files": files,
}


def cases() -> list[Case]:
    return [case for make in CLASSES.values() for case in make()]
