"""Index expressions, strides and role assignment of embed.loopnest."""

from embed.loopnest import (
    Access,
    Affine,
    Combiner,
    Dim,
    DimKind,
    FloorDiv,
    Indirect,
    Load,
    Mod,
    Statement,
    floordiv,
    index_range,
    index_stride,
    make_nest,
    mod,
    without_splits,
)

P, R = DimKind.PARALLEL, DimKind.REDUCTION
i, j, k = Affine.of("i"), Affine.of("j"), Affine.of("k")


def test_affine_arithmetic_and_str() -> None:
    e = i * 4 + j + 3
    assert e == Affine((("i", 4), ("j", 1)), 3)
    assert str(e) == "i*4 + j + 3"
    assert str(e + i * -4) == "j + 3"
    assert str(j + -2) == "j - 2"
    assert str(Affine()) == "0"
    assert e.dims() == frozenset({"i", "j"})


def test_index_range() -> None:
    assert index_range(i * 4 + j + -1, {"i": 3, "j": 4}) == (-1, 10)
    assert index_range(i * -2, {"i": 5}) == (-8, 0)
    assert index_range(Affine.of(Indirect("t", (i,))), {"i": 5}) is None


def test_floordiv_and_mod_simplify_even_splits() -> None:
    extents = {"i": 3, "j": 4}
    flat = i * 4 + j  # [3, 4] flattened
    assert floordiv(flat, 4, extents) == i
    assert mod(flat, 4, extents) == j
    assert mod(i, 3, extents) == i
    merged = floordiv(Affine.of("k"), 4, {"k": 12})
    assert merged == Affine.of(FloorDiv(k, 4))
    assert mod(Affine.of("k"), 4, {"k": 12}) == Affine.of(Mod(k, 4))
    # [6, 4] read as [4, 6]: nothing divides evenly
    extents = {"i": 4, "j": 6}
    assert mod(floordiv(i * 6 + j, 4, extents), 6, extents) == Affine.of(FloorDiv(i * 6 + j, 4))
    assert mod(i * 6 + j, 4, extents) == Affine.of(Mod(i * 2 + j, 4))


def test_index_stride() -> None:
    assert index_stride(i * 4 + j, "i") == 4
    assert index_stride(Affine.of(FloorDiv(k, 4)), "k") == 0.25
    assert index_stride(Affine.of(Indirect("idx", (j,))), "j") is None
    assert index_stride(Affine.of(Indirect("idx", (j,))), "i") == 0
    assert Access("x", (i, j)).stride("i", (3, 5)) == 5
    assert Access("x", (j, i)).stride("i", (3, 5)) == 1


def test_make_nest_assigns_roles_by_stride() -> None:
    # out[a, b] = sum_c x[a, c] * y[c, b]
    dims = [Dim("a", 8, P), Dim("c", 16, R), Dim("b", 4, P)]
    a, b, c = Affine.of("a"), Affine.of("b"), Affine.of("c")
    body = Load(Access("x", (a, c)))
    st = Statement(Access("out", (a, b)), body, Combiner.SUM)
    nest = make_nest("matmul", dims, st, {"out": (8, 4), "x": (8, 16)})
    assert [(d.name, d.extent) for d in nest.dims] == [("p1", 8), ("p0", 4), ("r0", 16)]
    assert nest.statement.write == Access("out", (Affine.of("p1"), Affine.of("p0")))
    assert nest.statement.body == Load(Access("x", (Affine.of("p1"), Affine.of("r0"))))
    assert nest.iterations == 8 * 4 * 16 and nest.parallel_iterations == 32
    text = str(nest)
    assert "for p1 in [0, 8):" in text and "acc += x[p1, r0]" in text and "out[p1, p0] = acc" in text


def test_transposed_write_makes_the_output_contiguous_dim_p0() -> None:
    dims = [Dim("a", 3, P), Dim("b", 5, P)]
    a, b = Affine.of("a"), Affine.of("b")
    nest = make_nest("transpose", dims, Statement(Access("out", (b, a)), Load(Access("x", (a, b)))),
                     {"out": (5, 3), "x": (3, 5)})
    assert nest.dim("p0").extent == 3 and nest.dim("p1").extent == 5


def test_statement_loads_include_indirect_index_reads() -> None:
    gathered = Access("x", (Affine.of(Indirect("idx", (i,))),))
    st = Statement(Access("out", (i,)), Load(gathered))
    assert [a.tensor for a in st.loads()] == ["x", "idx"]


def _value(expr: Affine, env: dict[str, int]) -> int:
    """``expr`` at integer dims ``env``, computed independently of embed.loopnest (Python's // and %)."""
    total = expr.const
    for atom, coef in expr.terms:
        if isinstance(atom, str):
            total += coef * env[atom]
        elif isinstance(atom, FloorDiv):
            total += coef * (_value(atom.arg, env) // atom.divisor)
        else:
            total += coef * (_value(atom.arg, env) % atom.modulus)
    return total


def test_digits_of_an_index_merged_again_leave_the_index() -> None:
    a = i * 6 + j + 1  # any affine argument, with a constant
    merged = Affine.of(FloorDiv(a, 4)) * 12 + Affine.of(Mod(a, 4)) * 3 + 5  # 3 * (4 * (a // 4) + a % 4) + 5
    kept = Affine.of(FloorDiv(a, 4)) * 8 + Affine.of(Mod(a, 4))  # 8 != 4 * 1: no digits of one number
    # i's digits in bases 3 and 4, as a reshape's flattening writes them
    digits = Affine.of(FloorDiv(i, 12)) * 12 + Affine.of(Mod(Affine.of(FloorDiv(i, 3)), 4)) * 3 + Affine.of(Mod(i, 3))
    assert without_splits(merged) == a * 3 + 5 and without_splits(digits) == i
    assert any(isinstance(atom, FloorDiv) for atom, _ in without_splits(kept).terms)  # 8 * (a // 4) stays
    for iv in range(-7, 30):  # equal at every point, negative arguments included
        for jv in range(-3, 9):
            env = {"i": iv, "j": jv}
            assert _value(without_splits(merged), env) == _value(merged, env) == 3 * (iv * 6 + jv + 1) + 5
            for expr in (digits, kept):
                assert _value(without_splits(expr), env) == _value(expr, env)
