"""Zoo families: a parametric module factory with a grid of sizes, registered by name."""

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from embed.errors import ModelImportError
from embed.registry import Registry

Built = tuple[nn.Module, tuple[Tensor, ...]]


def _fmt(value: float) -> str:
    return str(value)


def _parse(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


@dataclass(frozen=True)
class Family:
    """``factory(**sizes, device=...)`` builds (module, example inputs); ``grid`` lists the sizes the zoo names."""

    name: str
    factory: Callable[..., Built]
    grid: dict[str, tuple[Any, ...]]
    default: str

    def members(self) -> list[str]:
        keys = list(self.grid)
        return [self.name + "".join(f"-{k}{_fmt(v)}" for k, v in zip(keys, combo, strict=True))
                for combo in itertools.product(*self.grid.values())]

    def sizes(self, suffix: str) -> dict[str, int | float]:
        """``"h768-s512-b4"`` -> ``{"h": 768, "s": 512, "b": 4}``; every key of the grid must be given once."""
        parts = [p for p in suffix.split("-") if p]
        try:
            sizes = {p[0]: _parse(p[1:]) for p in parts}
        except (ValueError, IndexError):
            sizes = {}
        if sorted(sizes) != sorted(self.grid) or len(parts) != len(self.grid) or any(v <= 0 for v in sizes.values()):
            example = self.members()[0]
            raise ModelImportError(f"bad sizes {suffix!r} for zoo family {self.name!r}; expected e.g. {example!r}")
        return sizes

    def build(self, suffix: str, device: str) -> Built:
        sizes = self.sizes(suffix or self.default)
        try:
            with torch.device(device):
                module, inputs = self.factory(**sizes, device=device)
        except Exception as exc:  # sizes the family cannot take (e.g. hidden not a multiple of the head size)
            raise ModelImportError(f"cannot build {self.name}-{suffix}: {exc}") from None
        return module.eval(), inputs


FAMILIES: Registry[Family] = Registry("zoo family")


Factory = Callable[..., Built]


def family(name: str, *, default: str, **grid: tuple[Any, ...]) -> Callable[[Factory], Factory]:
    """Register a factory as the zoo family ``name`` with the size grid ``grid`` (``default`` names one member)."""
    def register(factory: Factory) -> Factory:
        FAMILIES.register(name, Family(name, factory, dict(grid), default))
        return factory
    return register
