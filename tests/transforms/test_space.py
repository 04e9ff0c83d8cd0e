"""Recipe spaces per subgraph kind, default recipes, and adapt."""

import random

import pytest

from embed.builder import GraphBuilder
from embed.lower import lower
from tests.transforms.kernels import single
from transforms.adapt import adapt
from transforms.recipe import Recipe, parse
from transforms.space import RecipeSpace, default_recipe
from transforms.transformation import apply_recipe


def _layer_norm():
    b = GraphBuilder("ln")
    x, w = b.input("x", (16, 64), "float32"), b.param("w", (64,), "float32")
    return lower(b.build([b.node("layer_norm", [x, w], (16, 64), "float32", name="out", axes=[-1], eps=1e-5)]))


PROGRAMS = {
    "pointwise": lambda: lower(single("gelu", [("x", (32, 64), "float32")], (32, 64))),
    "layout": lambda: lower(single("transpose", [("x", (32, 64), "float32")], (64, 32), perm=[1, 0])),
    "reduction": _layer_norm,
    "contraction": lambda: lower(single("matmul", [("a", (32, 48), "float32"), ("b", (48, 64), "float32")], (32, 64))),
}


@pytest.mark.parametrize("kind", sorted(PROGRAMS))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_spaces_are_large_and_hold_their_default(kind: str, backend: str) -> None:
    program = PROGRAMS[kind]()
    space = RecipeSpace(program, backend)
    minimum = {"cpu": 100 if kind in ("pointwise", "layout") else 1000, "cuda": 20}[backend]
    assert space.size() >= minimum
    default = default_recipe(program, backend)
    assert all(any(s in options for options in space.dims) for s in default)
    rng = random.Random(0)
    samples = {space.sample(rng) for _ in range(50)}
    assert len(samples) > min(40, space.size() // 2)
    for recipe in samples:
        apply_recipe(recipe, program)  # every sample is a legal recipe


def test_adapt_clamps_drops_and_substitutes() -> None:
    program = PROGRAMS["reduction"]()
    recipe, changes = adapt(parse("tile(p3,4);tile(p1,5);reduce(warp);threads(128);nosuch(1);unroll(3)"), program)
    assert str(recipe) == "tile(p1,4);reduce(serial);unroll(4)"
    assert changes == [
        "tile(p3,4): dropped (does not apply here)", "tile(p1,5) -> tile(p1,4)", "reduce(warp) -> reduce(serial)",
        "threads(128): dropped (does not apply here)", "nosuch(1): dropped (unknown transformation)",
        "unroll(3) -> unroll(4)",
    ]
    legal = default_recipe(program)
    assert adapt(legal, program) == (legal, [])



def test_adapt_keeps_the_later_of_two_steps_for_one_choice() -> None:
    program = PROGRAMS["reduction"]()
    recipe, changes = adapt(parse("unroll(2);tile(p1,4);tile(p0,8);unroll(8);tile(p1,16)"), program)
    assert str(recipe) == "tile(p0,8);unroll(8);tile(p1,16)"  # tiles of p0 and p1 are two choices, unroll one
    assert changes == ["unroll(2): replaced by the later unroll(8)", "tile(p1,4): replaced by the later tile(p1,16)"]


def test_mutate_brings_foreign_recipes_into_the_space() -> None:
    program = PROGRAMS["contraction"]()
    space = RecipeSpace(program)
    child = space.mutate(parse("tile(p0,999);threads(64)"), random.Random(1))
    assert isinstance(child, Recipe) and len(child) == len(space.dims)
    assert all(step in options for step, options in zip(child, space.dims, strict=True))


def test_cuda_defaults_follow_the_rows() -> None:
    def threads(program) -> str:  # type: ignore[no-untyped-def]
        return next(str(s) for s in default_recipe(program, "cuda") if s.name == "threads")

    wide = lower(single("softmax", [("x", (4, 32000), "float16")], (4, 32000), "float16", axis=-1))
    b = GraphBuilder("bias_gelu")
    x, bias = b.input("x", (8, 3072), "float16"), b.param("bias", (3072,), "float16")
    s = b.node("add", [x, bias], (8, 3072), "float16")
    gelu = lower(b.build([b.node("gelu", [s], (8, 3072), "float16", name="out", approximate="none")]))
    assert threads(wide) == "threads(512)" and threads(gelu) == "threads(128)"  # long rows; pointwise rows
    assert threads(PROGRAMS["reduction"]()) == threads(PROGRAMS["layout"]()) == "threads(256)"
    assert "unroll(4)" in str(default_recipe(wide, "cuda")) and "unroll(1)" in str(default_recipe(wide, "cpu"))


def test_variants_over_the_knobs_a_recipe_does_not_set() -> None:
    program = lower(single("softmax", [("x", (64, 768), "float16")], (64, 768), "float16", axis=-1))
    space = RecipeSpace(program, "cuda")
    full = space.default
    assert space.unset_knobs(full) == set()
    older = Recipe(tuple(s for s in full.steps if s.name not in ("cache_hint", "persist")))
    assert space.unset_knobs(older) == {"cache_hint", "persist"}
    variants = space.variants(older, {"cache_hint"})
    assert variants == [space.legal(parse(str(full).replace("cache_hint(none)", "cache_hint(stream)")))]
    both = space.variants(older, {"cache_hint", "persist"})
    changed = [next(b for a, b in zip(space.legal(older).steps, v.steps, strict=True)
                    if a != b) for v in both]
    assert sorted(map(str, changed[:2])) == ["cache_hint(stream)", "persist(2)"]  # each knob's first other value
    assert [str(s) for s in changed[2:]] == ["persist(4)", "persist(8)"]


def test_one_program_keeps_a_space_per_backend() -> None:
    # choices are kept with the program (LoopProgram.memoized): asking for one backend's first must not give the
    # other backend its space, in either order
    for first, second in (("cpu", "cuda"), ("cuda", "cpu")):
        program = _layer_norm()
        spaces = {b: RecipeSpace(program, b).size() for b in (first, second)}
        assert spaces == {b: RecipeSpace(_layer_norm(), b).size() for b in (first, second)}
        assert spaces["cpu"] != spaces["cuda"]
        kept = {b: str(adapt(parse("threads(128)"), program, b)[0]) for b in (first, second)}
        assert kept == {"cpu": "", "cuda": "threads(128)"}  # a cuda row kernel's step, dropped on the cpu
