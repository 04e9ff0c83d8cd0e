"""The model zoo: small parametric PyTorch modules, one per family, each with a grid of sizes.

    names()                                 # every grid member ("gpt_decoder-h768-s512-b4") and family alias
    build("gpt_decoder-h768-s512-b4")       # (module, example inputs), on the meta device by default
    load("gpt_decoder")                     # the Graph, through the PyTorch importer

A name is ``FAMILY-<k><size>-...`` with one size per grid key (sizes off the grid are accepted), or
just ``FAMILY`` for its default member.
"""

from embed.errors import ModelImportError
from embed.ir import Graph
from embed.zoo import conv, gcn, heads, mixer, transformer
from embed.zoo.family import FAMILIES, Built, Family

__all__ = ["Built", "Family", "build", "families", "load", "names"]
_MODULES = (conv, gcn, heads, mixer, transformer)  # importing them registers their families


def families() -> list[str]:
    return FAMILIES.names()


def names() -> list[str]:
    """Every model of every grid, then the family aliases."""
    return [m for f in families() for m in FAMILIES.get(f).members()] + families()


def _split(name: str) -> tuple[Family, str]:
    family, _, suffix = name.partition("-")
    if family not in FAMILIES:
        raise ModelImportError(f"unknown zoo model {name[:100]!r}; families: {', '.join(families())}")
    return FAMILIES.get(family), suffix


def build(name: str, *, device: str = "meta") -> Built:
    """The module (in eval mode) and example inputs of zoo model ``name``."""
    family, suffix = _split(name)
    return family.build(suffix, device)


def load(name: str) -> Graph:
    """Zoo model ``name`` as a graph (built on the meta device and imported with ``torch.export``)."""
    from embed.importers.torch_importer import import_module

    family, suffix = _split(name)
    module, inputs = family.build(suffix, "meta")
    return import_module(module, inputs, name=f"{family.name}-{suffix or family.default}")
