"""Recipes: ordered transformation steps with a canonical string form that round-trips.

    >>> r = parse("fuse(all);tile(p0,256);reduce(r0,warp);unroll(r0,4)")
    >>> format(r)
    'fuse(all);tile(p0,256);reduce(r0,warp);unroll(r0,4)'

Grammar (whitespace between tokens is accepted on input, never written)::

    recipe  := "" | step (";" step)*
    step    := ident "(" [arg ("," arg)*] ")"        positional args come before keyword args
    arg     := value | ident "=" value
    value   := int | role | ident
    ident   := [a-z][a-z0-9_]*   (at most 32 characters)
    role    := [pr][0-9]         (p = parallel, r = reduction dimension, numbered from the innermost)
    int     := 0 | -?[1-9][0-9]* (at most 9 digits)

The canonical form writes keyword args sorted by key. A recipe holds at most 64 steps, 16 args per
step, and 4096 characters.
"""

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

MAX_CHARS = 4096
MAX_STEPS = 64
MAX_ARGS = 16
MAX_IDENT = 32
MAX_INT_DIGITS = 9

_IDENT = re.compile(r"[a-z][a-z0-9_]*")
_ROLE_LIKE = re.compile(r"[pr][0-9]+")
_TOKEN = re.compile(r"(?P<ws>[ \t]+)|(?P<int>-?[0-9]+)|(?P<name>[a-z][a-z0-9_]*)|(?P<punct>[();,=])")


class RecipeError(ValueError):
    """A recipe or step was built with invalid parts (bad identifier, too long, duplicate keyword)."""


class RecipeSyntaxError(RecipeError):
    """Recipe text does not follow the grammar; ``column`` is 1-based."""

    def __init__(self, message: str, text: str, column: int) -> None:
        self.column = column
        snippet = text if len(text) <= 60 else text[:60] + "..."
        super().__init__(f"recipe syntax error at column {column}: {message} (in {snippet!r})")


@dataclass(frozen=True, order=True)
class Role:
    """A dimension named by role: ``p0`` = innermost parallel dimension, ``r0`` = innermost reduction."""

    kind: str
    index: int

    def __post_init__(self) -> None:
        if self.kind not in ("p", "r") or not 0 <= self.index <= 9:
            raise RecipeError(f"invalid role {self.kind}{self.index}: use p0-p9 or r0-r9")

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"


Param = int | str | Role


def _check_ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.fullmatch(name) or len(name) > MAX_IDENT:
        raise RecipeError(f"invalid {what} {name!r}: use [a-z][a-z0-9_]*, at most {MAX_IDENT} characters")
    return name


def _param(value: object) -> Param:
    """Normalize a parameter: role-shaped strings become Roles; everything else is checked."""
    if isinstance(value, Role):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if len(str(abs(value))) > MAX_INT_DIGITS:
            raise RecipeError(f"integer {value} has more than {MAX_INT_DIGITS} digits")
        return value
    if isinstance(value, str) and _ROLE_LIKE.fullmatch(value):
        if len(value) != 2:
            raise RecipeError(f"invalid role {value!r}: a role index is one digit (p0-p9, r0-r9)")
        return Role(value[0], int(value[1]))
    if isinstance(value, str):
        return _check_ident(value, "identifier")
    raise RecipeError(f"invalid parameter {value!r}: use an int, a role (p0, r1) or an identifier")


@dataclass(frozen=True)
class Step:
    """One transformation with its parameters, e.g. ``tile(p0,256)`` or ``reduce(r0,mode=warp)``.

    ``kwargs`` may be given as a mapping; it is stored as a tuple of (key, value) sorted by key.
    Strings shaped like roles (``"p0"``) are stored as :class:`Role`.
    """

    name: str
    args: tuple[Param, ...] = ()
    kwargs: tuple[tuple[str, Param], ...] = field(default=())

    def __post_init__(self) -> None:
        _check_ident(self.name, "step name")
        args = tuple(_param(a) for a in self.args)
        pairs = self.kwargs.items() if isinstance(self.kwargs, Mapping) else self.kwargs
        kwargs = tuple(sorted((_check_ident(k, "keyword"), _param(v)) for k, v in pairs))
        keys = [k for k, _ in kwargs]
        if len(set(keys)) != len(keys):
            raise RecipeError(f"step {self.name!r} repeats a keyword: {', '.join(keys)}")
        if len(args) + len(kwargs) > MAX_ARGS:
            raise RecipeError(f"step {self.name!r} has more than {MAX_ARGS} parameters")
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)

    def get(self, key: str, default: Param | None = None) -> Param | None:
        """The value of keyword ``key``, or ``default``."""
        return dict(self.kwargs).get(key, default)

    def __str__(self) -> str:
        params = [str(a) for a in self.args] + [f"{k}={v}" for k, v in self.kwargs]
        return f"{self.name}({','.join(params)})"


@dataclass(frozen=True)
class Recipe:
    """An ordered, hashable tuple of steps; ``str(recipe)`` is its canonical form."""

    steps: tuple[Step, ...] = ()

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not all(isinstance(s, Step) for s in steps):
            raise RecipeError("a recipe holds Step objects only")
        if len(steps) > MAX_STEPS:
            raise RecipeError(f"recipe has {len(steps)} steps; at most {MAX_STEPS} are allowed")
        object.__setattr__(self, "steps", steps)
        if len(str(self)) > MAX_CHARS:
            raise RecipeError(f"recipe is longer than {MAX_CHARS} characters")

    def __str__(self) -> str:
        return ";".join(str(s) for s in self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def format(recipe: Recipe) -> str:
    """The canonical string of ``recipe``; ``parse(format(r)) == r``."""
    return str(recipe)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, column)
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                self.fail(f"unexpected character {text[pos]!r}", pos + 1)
            if m.lastgroup != "ws":
                self.tokens.append((m.lastgroup or "", m.group(), pos + 1))
            pos = m.end()
        self.i = 0

    def fail(self, message: str, column: int) -> NoReturn:
        raise RecipeSyntaxError(message, self.text, column)

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "end of text", len(self.text) + 1)

    def take(self, kind: str, value: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token[0] != kind or (value is not None and token[1] != value):
            want = repr(value) if value else {"name": "a name", "int": "an integer"}.get(kind, kind)
            self.fail(f"expected {want}, found {token[1]!r}", token[2])
        self.i += 1
        return token

    def value(self) -> Param:
        kind, text, column = self.peek()
        if kind not in ("int", "name"):
            self.fail(f"expected a value, found {text!r}", column)
        self.i += 1
        if kind == "int" and (text.lstrip("-").startswith("0") and text != "0"):
            self.fail(f"integer {text} has a leading zero or a negative zero", column)
        try:
            return _param(int(text) if kind == "int" else text)
        except RecipeError as e:
            self.fail(str(e), column)

    def step(self) -> Step:
        _, name, column = self.take("name")
        self.take("punct", "(")
        args: list[Param] = []
        kwargs: dict[str, Param] = {}
        while self.peek()[1] != ")":
            if args or kwargs:
                self.take("punct", ",")
            kind, text, col = self.peek()
            if kind == "name" and self.i + 1 < len(self.tokens) and self.tokens[self.i + 1][1] == "=":
                self.i += 2
                if text in kwargs:
                    self.fail(f"keyword {text!r} given twice", col)
                kwargs[text] = self.value()
            elif kwargs:
                self.fail("positional argument after a keyword argument", col)
            else:
                args.append(self.value())
        self.take("punct", ")")
        try:
            return Step(name, tuple(args), kwargs)
        except RecipeError as e:
            self.fail(str(e), column)

    def recipe(self) -> Recipe:
        steps: list[Step] = []
        if self.tokens:
            steps.append(self.step())
            while self.peek()[0] != "end":
                _, _, column = self.take("punct", ";")
                if len(steps) == MAX_STEPS:
                    self.fail(f"more than {MAX_STEPS} steps", column)
                steps.append(self.step())
        return Recipe(tuple(steps))


def parse(text: str) -> Recipe:
    """Parse recipe text; raise :class:`RecipeSyntaxError` (with the column) on malformed input."""
    if len(text) > MAX_CHARS:
        raise RecipeSyntaxError(f"recipe is longer than {MAX_CHARS} characters", text, MAX_CHARS + 1)
    return _Parser(text).recipe()
