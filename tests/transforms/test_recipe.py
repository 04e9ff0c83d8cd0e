import pytest
from hypothesis import given
from hypothesis import strategies as st

from transforms.recipe import MAX_CHARS, MAX_STEPS, Recipe, RecipeError, RecipeSyntaxError, Role, Step, format, parse

EXAMPLE = "fuse(all);tile(p0,256);vectorize(p0,4);reduce(r0,warp);rows_per_block(4);unroll(r0,4)"

idents = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: not (s[0] in "pr" and s[1:].isdigit()))
roles = st.builds(Role, st.sampled_from("pr"), st.integers(0, 9))
values = st.one_of(st.integers(-(10**9) + 1, 10**9 - 1), roles, idents)
steps = st.builds(
    lambda name, args, kwargs: Step(name, tuple(args), kwargs),
    idents,
    st.lists(values, max_size=4),
    st.dictionaries(idents, values, max_size=3),
)
recipes = st.builds(lambda s: Recipe(tuple(s)), st.lists(steps, max_size=8))


@given(recipes)
def test_parse_inverts_format(recipe):
    assert parse(format(recipe)) == recipe


@given(recipes)
def test_format_inverts_parse_on_canonical_strings(recipe):
    text = format(recipe)
    assert format(parse(text)) == text


def test_example_round_trips_and_has_the_expected_structure():
    recipe = parse(EXAMPLE)
    assert format(recipe) == EXAMPLE
    assert len(recipe) == 6
    assert recipe.steps[1] == Step("tile", (Role("p", 0), 256))
    assert recipe.steps[3].args == (Role("r", 0), "warp")


def test_recipes_are_hashable_frozen_and_equal_by_value():
    a, b = parse(EXAMPLE), parse(EXAMPLE)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.steps = ()  # type: ignore[misc]


def test_role_strings_normalize_and_keywords_sort():
    step = Step("reduce", ("r0",), {"strategy": "warp", "pass_": "online"})
    assert step == parse("reduce(r0,pass_=online,strategy=warp)").steps[0]
    assert str(step) == "reduce(r0,pass_=online,strategy=warp)"
    assert step.get("strategy") == "warp" and step.get("missing", 3) == 3


def test_whitespace_is_accepted_but_not_canonical():
    assert format(parse(" tile( p0 , 256 ) ; unroll(r0, 4)")) == "tile(p0,256);unroll(r0,4)"


def test_empty_text_is_the_empty_recipe():
    assert parse("") == Recipe() and format(Recipe()) == ""


@pytest.mark.parametrize(
    ("text", "column", "says"),
    [
        ("tile(p0,", 9, "expected a value"),
        ("tile(p0 256)", 9, "expected ','"),
        ("Tile(1)", 1, "unexpected character 'T'"),
        ("tile(01)", 6, "leading zero"),
        ("tile(p10)", 6, "one digit"),
        ("fuse(all);", 11, "expected a name"),
        ("a(x=1,2)", 7, "positional argument after a keyword"),
        ("a(x=1,x=2)", 7, "given twice"),
        ("a(1)b()", 5, "expected ';'"),
        ("a(1234567890)", 3, "more than 9 digits"),
        ("tile", 5, "expected '('"),
    ],
)
def test_malformed_text_reports_the_column(text, column, says):
    with pytest.raises(RecipeSyntaxError) as info:
        parse(text)
    assert info.value.column == column
    message = str(info.value)
    assert f"column {column}" in message and says in message and "\n" not in message


def test_length_and_step_bounds():
    with pytest.raises(RecipeSyntaxError, match="longer than"):
        parse("a(" + "1," * MAX_CHARS + "1)")
    with pytest.raises(RecipeSyntaxError, match=f"more than {MAX_STEPS} steps"):
        parse(";".join(["a()"] * (MAX_STEPS + 1)))
    assert len(parse(";".join(["a()"] * MAX_STEPS))) == MAX_STEPS


def test_invalid_steps_cannot_be_built():
    with pytest.raises(RecipeError, match="invalid step name"):
        Step("Tile")
    with pytest.raises(RecipeError, match="invalid parameter"):
        Step("tile", (1.5,))  # type: ignore[arg-type]
    with pytest.raises(RecipeError, match="invalid parameter"):
        Step("tile", (True,))
    with pytest.raises(RecipeError, match="invalid role"):
        Role("q", 0)
