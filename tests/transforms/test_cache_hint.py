"""``cache_hint(stream)``: evict-first loads and stores of a row kernel's data larger than one row."""

from pathlib import Path

import pytest

from embed.lower import lower
from tests.gpu import needs_gpu
from tests.transforms.test_persist import BASE, _norm, _softmax
from transforms.build import Source, build
from transforms.codegen import generate
from transforms.recipe import parse
from transforms.schedule import ScheduleError
from transforms.space import RecipeSpace, default_recipe
from transforms.steps.cache_hint import HINTS
from transforms.transformation import apply_recipe


def test_cache_hint_is_offered_for_row_groups_and_off_by_default() -> None:
    program = lower(_norm("layer_norm", (64, 768)))
    assert [s.args[0] for g in RecipeSpace(program, "cuda").dims for s in g if s.name == "cache_hint"] == list(HINTS)
    assert "cache_hint(none)" in str(default_recipe(program, "cuda"))
    assert generate(apply_recipe(parse(f"{BASE};cache_hint(none)"), program), "cuda") == \
        generate(apply_recipe(parse(BASE), program), "cuda")
    with pytest.raises(ScheduleError):
        apply_recipe(parse("cache_hint(always)"), program)


def test_streaming_hints_skip_row_sized_parameters_and_shared_rows() -> None:
    program = lower(_norm("layer_norm", (64, 768)))
    code = generate(apply_recipe(parse(f"{BASE};cache_hint(stream)"), program), "cuda").code
    x, w, b, out = "b0", "b1", "b2", "b3"
    assert code.count(f"__ldcs((const uint4*)((const char*)({x} ") == 3  # 768 halves: 3 chunks of 8 per lane
    assert f"({w} +" in code and f"__ldcs((const uint4*)((const char*)({w} " not in code and \
        f"__ldcs((const uint4*)((const char*)({b} " not in code
    assert code.count(f"__stcs((uint4*)((char*)({out} ") == 3
    persistent = generate(apply_recipe(parse(f"{BASE};persist(2);cache_hint(stream)"), program), "cuda").code
    assert f"= __ldcs((const uint4*)((const char*)({x} " in persistent  # the prefetched next row
    shared = generate(apply_recipe(parse("fuse(all);threads(512);reduce(block);row_mode(shared);vectorize(8);"
                                         "cache_hint(stream)"), lower(_softmax((4, 32000)))), "cuda").code
    assert "__stcs((uint4*)((char*)((k_smem" not in shared and "__ldcs" in shared


def test_streaming_kernels_compile(tmp_path: Path) -> None:
    recipes = [f"{BASE};cache_hint(stream)", f"{BASE};persist(2);cache_hint(stream)",
               "fuse(all);threads(512);reduce(block);row_mode(shared);vectorize(8);cache_hint(stream)"]
    sources = [Source(generate(apply_recipe(parse(r), lower(_norm("layer_norm", (64, 4096), "bfloat16"))),
                               "cuda").code, "cuda") for r in recipes]
    assert [r.error[:300] for r in build(sources, cache_dir=tmp_path) if not r.ok] == []


@needs_gpu
@pytest.mark.parametrize("graph", ["layernorm", "softmax_wide"])
def test_streaming_kernels_validate_on_the_gpu(tmp_path: Path, graph: str) -> None:
    from tests.transforms.kernels import measure

    g = {"layernorm": _norm("layer_norm", (2111, 776), residual=True), "softmax_wide": _softmax((48, 32000))}[graph]
    recipes = [f"{BASE};cache_hint(stream)", f"{BASE};persist(2);cache_hint(stream)",
               "fuse(all);threads(512);reduce(block);row_mode(shared);vectorize(8);cache_hint(stream)"]
    results = measure(g, recipes, tmp_path, backend="cuda")
    assert [(r, x.error[:200]) for r, x in zip(recipes, results, strict=True) if not x.ok] == []
