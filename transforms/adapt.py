"""Make a recipe legal for another program: keep legal steps, clamp or substitute the others, drop what
does not apply, and say what changed.

    recipe, changes = adapt(parse("tile(p2,64);reduce(warp)"), program, "cpu")
    # changes: ["tile(p2,64): dropped (no choice for it here)", "reduce(warp) -> reduce(simd)"]
"""

from __future__ import annotations

from embed.loopnest import LoopProgram
from embed.registry import UnknownNameError
from transforms.recipe import Recipe, Step
from transforms.transformation import transformations


def adapt(recipe: Recipe, program: LoopProgram, backend: str = "cpu") -> tuple[Recipe, list[str]]:
    """``(legal recipe, changes)``: each step replaced by its transformation's nearest legal step for
    ``program`` on ``backend``; unknown or inapplicable steps are dropped; a later step for the same
    choice overrides an earlier one."""
    changes: list[str] = []
    kept: dict[tuple[str, object], Step] = {}
    for step in recipe:
        try:
            transformation = transformations.get(step.name)
        except UnknownNameError:
            changes.append(f"{step}: dropped (unknown transformation)")
            continue
        legal = transformation.nearest(step, program, backend)
        if legal is None:
            changes.append(f"{step}: dropped (does not apply here)")
            continue
        if legal != step:
            changes.append(f"{step} -> {legal}")
        key = (legal.name, legal.args[0] if legal.name == "tile" else None)
        if key in kept:
            changes.append(f"{kept.pop(key)}: replaced by the later {legal}")
        kept[key] = legal
    return Recipe(tuple(kept.values())), changes
