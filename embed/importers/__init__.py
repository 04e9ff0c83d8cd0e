"""Model importers: ONNX files, IR JSON documents, PyTorch modules and the built-in zoo -> ``Graph``.

    load_model("model.onnx")            # an ONNX file (opset 13+, static shapes), external data beside it
    load_model("graph.json")            # a graph document, or what ``tunebank inspect --json`` wrote
    load_model("zoo:gpt_decoder")       # a zoo model (see ``embed.zoo.names()``)
    import_module(module, (x,))         # a torch.nn.Module and example inputs
"""

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from embed.errors import ModelImportError
from embed.ir import Graph
from embed.registry import Registry

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_BYTES = 512 * 2**20

importers: Registry[Callable[..., Graph]] = Registry("importer")
importers.register_lazy("onnx", "embed.importers.onnx_importer:import_onnx")
importers.register_lazy("json", "embed.importers.ir_json:import_json")
importers.register_lazy("torch", "embed.importers.torch_importer:import_module")
importers.register_lazy("zoo", "embed.zoo:load")


def load_model(spec: str, *, max_bytes: int = DEFAULT_MAX_BYTES, dims: Mapping[str, int] | None = None) -> Graph:
    """Import ``spec``: a path to an ``.onnx`` or IR ``.json`` file, or ``zoo:NAME``.

    ``max_bytes`` caps the file size (of either kind); ``dims`` gives values to symbolic dimensions of an ONNX
    model. Raises ``ModelImportError`` (or ``InvalidGraphError``) with a one-line message.
    """
    if spec.startswith("zoo:"):
        return importers.get("zoo")(spec.removeprefix("zoo:"))
    if spec.lower().endswith(".onnx"):
        return importers.get("onnx")(spec, max_bytes=max_bytes, dims=dims)
    if spec.lower().endswith(".json"):
        return importers.get("json")(spec, max_bytes=max_bytes)
    raise ModelImportError(f"cannot import {spec[:200]!r}: expected a path to an .onnx or .json file, or zoo:NAME")


def import_module(module: "torch.nn.Module", example_inputs: tuple[Any, ...], name: str = "") -> Graph:
    """Import a PyTorch module through ``torch.export`` with the given example inputs (meta tensors work)."""
    return importers.get("torch")(module, example_inputs, name=name)
