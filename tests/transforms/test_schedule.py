"""Grouping (fuse) legality and recipe application."""

import pytest

from embed.builder import GraphBuilder
from embed.lower import lower
from tests.transforms.kernels import single
from transforms.recipe import Role, parse
from transforms.schedule import ScheduleError, plan_groups
from transforms.transformation import apply_recipe


def _softmax_program():
    b = GraphBuilder("s")
    x = b.input("x", (8, 16), "float32")
    y = b.node("mul", [x, b.const(0.5, "float32")], (8, 16), "float32")
    return lower(b.build([b.node("softmax", [y], (8, 16), "float32", name="out", axis=-1)]))


def test_softmax_fuses_into_one_row_loop() -> None:
    program = _softmax_program()
    assert [n.op for n in program.nests] == ["mul", "softmax", "softmax", "softmax"]
    assert [(g.nests, g.depth) for g in plan_groups(program, "none")] == [((0,), 2), ((1,), 1), ((2,), 1), ((3,), 2)]
    (group,) = plan_groups(program, "all")
    assert (group.nests, group.depth, group.rows) == ((0, 1, 2, 3), 1, ("p1",))


def test_epilogue_fuses_at_full_depth() -> None:
    b = GraphBuilder("mm")
    x, w, bias = b.input("x", (4, 8), "float32"), b.param("w", (8, 6), "float32"), b.param("b", (6,), "float32")
    y = b.node("matmul", [x, w], (4, 6), "float32")
    program = lower(b.build([b.node("add", [y, bias], (4, 6), "float32", name="out")]))
    assert [(g.nests, g.depth) for g in plan_groups(program, "all")] == [((0, 1), 2)]
    assert [(g.nests, g.depth) for g in plan_groups(program, "outer")] == [((0, 1), 1)]


def test_transpose_reader_is_not_fused_across_rows() -> None:
    b = GraphBuilder("t")
    x = b.input("x", (6, 6), "float32")
    y = b.node("relu", [x], (6, 6), "float32")
    t = b.node("transpose", [y], (6, 6), "float32", perm=[1, 0])
    program = lower(b.build([b.node("neg", [t], (6, 6), "float32", name="out")]))
    groups = plan_groups(program, "all")
    assert [g.nests for g in groups] == [(0,), (1, 2)]  # the transpose reads y across rows: a new group


def test_recipe_sets_knobs_and_rejects_bad_steps() -> None:
    program = lower(single("relu", [("x", (4, 8), "float32")], (4, 8)))
    recipe = parse("fuse(all);parallel(2);tile(p0,8);tile(p0,4);reorder(p0,p1);vectorize(8);unroll(2)")
    s = apply_recipe(recipe, program)
    assert (s.fuse, s.parallel, s.tiles, s.order, s.vector, s.unroll) == (
        "all", 2, ((Role("p", 0), 4),), (Role("p", 0), Role("p", 1)), 8, 2)
    assert s.row_order(s.groups[0]) == ("p0", "p1")
    bad_steps = ("fuse(most)", "tile(r0,4)", "tile(p0,0)", "parallel(9)", "reduce(lanes,3)", "nosuch(1)",
                 "reorder(p0,p0)")
    for bad in bad_steps:
        with pytest.raises(ScheduleError):
            apply_recipe(parse(bad), program)
