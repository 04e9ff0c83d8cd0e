"""The closed op set of the graph IR.

Every node's ``op`` is one of the names below. Each op has a class (what the partitioner and the
static features care about), an arity and a typed attribute schema. Anything an importer cannot
map onto this set becomes an ``opaque`` node: it splits subgraphs and is reported as not tunable.

Op classes:
    pointwise   elementwise with numpy-style broadcasting (unary, binary, ternary)
    reduction   reduces one or more axes (reduce_*, softmax, log_softmax, layer_norm, rms_norm, nll_loss)
    contraction matmul (batched, broadcasting, optional transposed right operand)
    convolution conv2d and pooling windows
    sparse      spmm: CSR sparse x dense
    layout      transpose, reshape, concat, slice, expand, gather
    opaque      anything else
"""

from dataclasses import dataclass
from enum import StrEnum


class OpClass(StrEnum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    CONTRACTION = "contraction"
    CONVOLUTION = "convolution"
    SPARSE = "sparse"
    LAYOUT = "layout"
    OPAQUE = "opaque"


# Attribute value types an op may declare.
INT, FLOAT, BOOL, STR, INTS = "int", "float", "bool", "str", "ints"


@dataclass(frozen=True)
class OpSpec:
    """One op: its class, how many inputs it takes (min, max) and its attributes (name -> type)."""

    name: str
    op_class: OpClass
    arity: tuple[int, int]
    attrs: dict[str, str]
    required: frozenset[str] = frozenset()
    doc: str = ""


def _specs(*specs: OpSpec) -> dict[str, OpSpec]:
    return {s.name: s for s in specs}


_P, _R, _C, _V, _S, _L, _O = (
    OpClass.POINTWISE,
    OpClass.REDUCTION,
    OpClass.CONTRACTION,
    OpClass.CONVOLUTION,
    OpClass.SPARSE,
    OpClass.LAYOUT,
    OpClass.OPAQUE,
)
_AXES = {"axes": INTS, "keepdim": BOOL}
_AX = frozenset({"axes"})

UNARY = (
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "relu",
    "sigmoid",
    "tanh",
    "silu",
    "abs",
    "reciprocal",
    "erf",
    "cos",
    "sin",
)
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")

OPS: dict[str, OpSpec] = _specs(
    *(OpSpec(n, _P, (1, 1), {}, doc=f"elementwise {n}") for n in UNARY),
    OpSpec("gelu", _P, (1, 1), {"approximate": STR}, doc="GELU; approximate is 'none' (erf) or 'tanh'"),
    OpSpec("cast", _P, (1, 1), {"dtype": STR}, frozenset({"dtype"}), doc="convert to dtype"),
    OpSpec("identity", _P, (1, 1), {}, doc="copy"),
    *(OpSpec(n, _P, (2, 2), {}, doc=f"elementwise {n} with broadcasting") for n in BINARY),
    OpSpec("where", _P, (3, 3), {}, doc="where(cond, a, b) with broadcasting"),
    OpSpec(
        "batch_norm",
        _P,
        (5, 5),
        {"eps": FLOAT},
        frozenset({"eps"}),
        doc="inference batch norm over axis 1: (x, mean, var, weight, bias)",
    ),
    OpSpec("reduce_sum", _R, (1, 1), _AXES, _AX),
    OpSpec("reduce_mean", _R, (1, 1), _AXES, _AX),
    OpSpec("reduce_max", _R, (1, 1), _AXES, _AX),
    OpSpec("reduce_min", _R, (1, 1), _AXES, _AX),
    OpSpec("softmax", _R, (1, 1), {"axis": INT}, frozenset({"axis"})),
    OpSpec("log_softmax", _R, (1, 1), {"axis": INT}, frozenset({"axis"})),
    OpSpec(
        "layer_norm",
        _R,
        (1, 3),
        {"axes": INTS, "eps": FLOAT},
        frozenset({"axes", "eps"}),
        doc="(x, [weight, [bias]]) normalised over the trailing axes",
    ),
    OpSpec(
        "rms_norm",
        _R,
        (1, 2),
        {"axes": INTS, "eps": FLOAT},
        frozenset({"axes", "eps"}),
        doc="(x, [weight]) x / sqrt(mean(x^2) + eps) over the trailing axes",
    ),
    OpSpec(
        "nll_loss",
        _R,
        (2, 2),
        {"reduction": STR},
        frozenset({"reduction"}),
        doc="(log_probs [N, C], target [N] int) -> mean|sum|none of -log_probs[i, target[i]]",
    ),
    OpSpec("matmul", _C, (2, 2), {"transpose_b": BOOL}, doc="batched matmul with broadcasting of batch dims"),
    OpSpec(
        "conv2d",
        _V,
        (2, 3),
        {"stride": INTS, "padding": INTS, "dilation": INTS, "groups": INT},
        frozenset({"stride", "padding", "dilation", "groups"}),
        doc="NCHW conv: (x, weight, [bias])",
    ),
    OpSpec(
        "max_pool2d",
        _V,
        (1, 1),
        {"kernel": INTS, "stride": INTS, "padding": INTS},
        frozenset({"kernel", "stride", "padding"}),
    ),
    OpSpec(
        "avg_pool2d",
        _V,
        (1, 1),
        {"kernel": INTS, "stride": INTS, "padding": INTS},
        frozenset({"kernel", "stride", "padding"}),
    ),
    OpSpec(
        "spmm",
        _S,
        (4, 4),
        {"rows": INT},
        frozenset({"rows"}),
        doc="CSR sparse [rows, K] x dense [K, N]: (indptr, indices, values, dense)",
    ),
    OpSpec("transpose", _L, (1, 1), {"perm": INTS}, frozenset({"perm"})),
    OpSpec("reshape", _L, (1, 1), {"shape": INTS}, frozenset({"shape"})),
    OpSpec("expand", _L, (1, 1), {"shape": INTS}, frozenset({"shape"})),
    OpSpec("concat", _L, (1, 64), {"axis": INT}, frozenset({"axis"})),
    OpSpec(
        "slice",
        _L,
        (1, 1),
        {"axis": INT, "start": INT, "end": INT, "step": INT},
        frozenset({"axis", "start", "end", "step"}),
    ),
    OpSpec("gather", _L, (2, 2), {"axis": INT}, frozenset({"axis"}), doc="index_select along axis: (x, index 1-D int)"),
    OpSpec("opaque", _O, (0, 64), {"name": STR}, frozenset({"name"}), doc="an op outside this set"),
)


def op_class(op: str) -> OpClass:
    """The class of ``op``; unknown names are opaque."""
    spec = OPS.get(op)
    return spec.op_class if spec else OpClass.OPAQUE
