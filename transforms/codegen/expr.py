"""Expression printing shared by the C and CUDA generators: index arithmetic, loads, stores, pointwise math.

Every identifier in generated code is made here or by a generator: buffers are ``b0, b1, ...`` (argument
order, see ``transforms.codegen.signature``), loop variables are generated, math goes through ``k_*``
helpers defined in :data:`PRELUDE`. Numbers are printed from Python values; nothing from a graph document
(tensor or graph names) reaches the source text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from embed.ir import DType
from embed.loopnest import (
    Acc,
    Access,
    Affine,
    Buffer,
    Cast,
    Const,
    Expr,
    FloorDiv,
    Indirect,
    Load,
    LoopNest,
    Mod,
    index_range,
)

Env = Mapping[str, str]  # dim name -> C expression of its value

#: The math helpers every kernel defines, for compute type ``T`` and qualifier ``Q`` (``static inline`` or
#: ``__device__ static inline``). ``F`` is the float suffix of libm names ("f" for float, "" for double).
PRELUDE = """
typedef long long idx_t;
Q idx_t k_idiv(idx_t a, idx_t b) { idx_t q = a / b; return (a % b != 0 && a < 0) ? q - 1 : q; }
Q idx_t k_imod(idx_t a, idx_t b) { idx_t r = a % b; return r < 0 ? r + b : r; }
Q float k_bf2f(unsigned short h) { union { unsigned int u; float f; } v; v.u = (unsigned int)h << 16; return v.f; }
Q unsigned short k_f2bf(float f) {
  union { unsigned int u; float f; } v; v.f = f;
  if (f != f) return 0x7FC0;
  return (unsigned short)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
Q T k_relu(T x) { return x > (T)0 ? x : (T)0; }
Q T k_sigmoid(T x) { return (T)1 / ((T)1 + expF(-x)); }
Q T k_silu(T x) { return x / ((T)1 + expF(-x)); }
Q T k_gelu(T x) { return (T)0.5 * x * ((T)1 + erfF(x * (T)0.70710678118654752440)); }
Q T k_gelu_tanh(T x) { return (T)0.5 * x * ((T)1 + tanhF((T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x))); }
Q T k_max(T a, T b) { return a > b ? a : b; }
Q T k_min(T a, T b) { return a < b ? a : b; }
"""

_UNARY = {
    "neg": "(-{0})", "exp": "expF({0})", "log": "logF({0})", "sqrt": "sqrtF({0})", "rsqrt": "((T)1 / sqrtF({0}))",
    "relu": "k_relu({0})", "sigmoid": "k_sigmoid({0})", "tanh": "tanhF({0})", "silu": "k_silu({0})",
    "abs": "fabsF({0})", "reciprocal": "((T)1 / {0})", "erf": "erfF({0})", "cos": "cosF({0})", "sin": "sinF({0})",
    "gelu": "k_gelu({0})", "gelu_tanh": "k_gelu_tanh({0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "pow": "powF({0}, {1})",
    "maximum": "k_max({0}, {1})", "minimum": "k_min({0}, {1})",
}


def prelude(ctype: str, qualifier: str) -> str:
    """:data:`PRELUDE` for compute type ``ctype`` with functions declared ``qualifier``."""
    return _typed(PRELUDE.replace("Q ", qualifier + " "), ctype)


def _typed(text: str, ctype: str) -> str:
    """Resolve the placeholders: ``T`` (a whole word) is ``ctype``, ``xF(`` is the libm name of ``x``."""
    return re.sub(r"\bT\b", ctype, text).replace("F(", "f(" if ctype == "float" else "(")


def literal(value: float, ctype: str) -> str:
    if math.isnan(value):
        return f"(({ctype})NAN)"
    if math.isinf(value):
        return f"(({ctype})INFINITY)" if value > 0 else f"(-({ctype})INFINITY)"
    text = repr(float(value))
    return f"{text}f" if ctype == "float" else text


#: C storage type of each buffer dtype (bf16 travels as raw bits; bool as one byte).
STORAGE_C = {
    DType.FLOAT64: "double", DType.FLOAT32: "float", DType.FLOAT16: "HALF", DType.BFLOAT16: "unsigned short",
    DType.INT64: "long long", DType.INT32: "int", DType.BOOL: "unsigned char",
}


@dataclass
class Printer:
    """Prints expressions of one program; ``names`` maps buffer names to argument names."""

    buffers: Mapping[str, Buffer]
    names: Mapping[str, str]
    ctype: str
    half_load: str = "(float)({0})"
    half_store: str = "(HALF)({0})"

    def index(self, expr: Affine, env: Env, extents: Mapping[str, int]) -> str:
        parts = [] if expr.const == 0 and expr.terms else [str(expr.const)]
        for atom, coef in expr.terms:
            text = self._atom(atom, env, extents)
            parts.append(text if coef == 1 else f"{coef}LL * {text}")
        return "(" + " + ".join(parts) + ")"

    def _atom(self, atom: str | FloorDiv | Mod | Indirect, env: Env, extents: Mapping[str, int]) -> str:
        if isinstance(atom, str):
            return env[atom]
        if isinstance(atom, Indirect):
            return f"((idx_t){self.names[atom.tensor]}[{self.offset(atom.tensor, atom.index, env, extents)}])"
        arg = self.index(atom.arg, env, extents)
        r = index_range(atom.arg, extents)
        nonneg = r is not None and r[0] >= 0
        if isinstance(atom, FloorDiv):
            return f"({arg} / {atom.divisor})" if nonneg else f"k_idiv({arg}, {atom.divisor})"
        return f"({arg} % {atom.modulus})" if nonneg else f"k_imod({arg}, {atom.modulus})"

    def offset(self, tensor: str, index: tuple[Affine, ...], env: Env, extents: Mapping[str, int]) -> str:
        shape = self.buffers[tensor].shape
        terms, stride = [], 1
        for e, n in reversed(list(zip(index, shape, strict=True))):
            if n != 1 or e.terms or e.const:
                text = self.index(e, env, extents)
                terms.append(text if stride == 1 else f"{text} * {stride}LL")
            stride *= n
        return " + ".join(reversed(terms)) or "0"

    def ref(self, access: Access, env: Env, extents: Mapping[str, int]) -> str:
        """The C lvalue of ``access``: the buffer's generated name indexed by its row-major offset."""
        return f"{self.names[access.tensor]}[{self.offset(access.tensor, access.index, env, extents)}]"

    def load(self, access: Access, env: Env, extents: Mapping[str, int]) -> str:
        buf = self.buffers[access.tensor]
        ref = self.ref(access, env, extents)
        if buf.dtype == DType.FLOAT16:
            value = self.half_load.format(ref)
        elif buf.dtype == DType.BFLOAT16:
            value = f"k_bf2f({ref})"
        else:
            value = f"(({self.ctype}){ref})"
        if access.fill is None:
            return value
        checks = []
        for e, n in zip(access.index, buf.shape, strict=True):
            r = index_range(e, extents)
            if r is None or r[0] < 0 or r[1] >= n:
                i = self.index(e, env, extents)
                checks.append(f"{i} >= 0 && {i} < {n}")
        if not checks:
            return value
        return f"(({' && '.join(checks)}) ? {value} : {literal(access.fill, self.ctype)})"

    def store(self, access: Access, env: Env, extents: Mapping[str, int], value: str) -> str:
        buf = self.buffers[access.tensor]
        ref = self.ref(access, env, extents)
        if buf.dtype == DType.FLOAT16:
            value = self.half_store.format(value)
        elif buf.dtype == DType.BFLOAT16:
            value = f"k_f2bf((float)({value}))"
        elif buf.dtype == DType.BOOL:
            value = f"(unsigned char)(({value}) != 0)"
        elif not buf.dtype.is_float:
            value = f"({STORAGE_C[buf.dtype]})({value})"
        return f"{ref} = {value};"

    def expr(self, expr: Expr, env: Env, extents: Mapping[str, int], acc: str | None = None) -> str:
        if isinstance(expr, Acc):
            assert acc is not None, "Acc outside an epilogue"
            return acc
        if isinstance(expr, Load):
            return self.load(expr.access, env, extents)
        if isinstance(expr, Const):
            return literal(expr.value, self.ctype)
        if isinstance(expr, Cast):
            inner = self.expr(expr.arg, env, extents, acc)
            if expr.dtype.is_float:
                return inner
            if expr.dtype == DType.BOOL:
                return f"(({self.ctype})(({inner}) != 0))"
            return f"(({self.ctype})(long long)({inner}))"
        args = [self.expr(a, env, extents, acc) for a in expr.args]
        if expr.op == "where":
            return f"(({args[0]}) != 0 ? {args[1]} : {args[2]})"
        template = _UNARY.get(expr.op) or _BINARY.get(expr.op)
        if template is None:
            raise ValueError(f"no code for pointwise op {expr.op!r}")
        return _typed(template, self.ctype).format(*args)


def extents(nest: LoopNest) -> dict[str, int]:
    """Extents of the nest's dense (non-ragged) dims, for index range analysis."""
    return {d.name: d.extent for d in nest.dims if d.ragged is None}


def combine(combiner: str, acc: str, value: str) -> str:
    """The statement that folds ``value`` into ``acc`` for a combiner (sum, max, min)."""
    if combiner == "sum":
        return f"{acc} += {value};"
    return f"{acc} = k_{combiner}({acc}, {value});"
