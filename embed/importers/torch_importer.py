"""PyTorch importer: ``torch.nn.Module`` + example inputs -> ``torch.export`` -> ``Graph``.

Modules and inputs may live on the ``meta`` device (nothing is allocated). Parameters and buffers
become PARAM tensors named by their module path (``encoder.q.weight``), as the ONNX exporter names
its initializers; lifted constants of at most 64 elements become CONST tensors. ATen ops are mapped
by ``torch_ops``; any other op becomes an ``opaque`` node.
"""

import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from embed.errors import EmbedError, ModelImportError
from embed.importers.lowering import Lowering, one_line
from embed.importers.torch_node import TorchNode, TValue, dtype_of, static_shape
from embed.importers.torch_ops import CONVERTERS
from embed.ir import Graph


def import_module(module: torch.nn.Module, example_inputs: tuple[Any, ...], *, name: str = "") -> Graph:
    """Export ``module`` with ``torch.export.export(strict=False)`` and import the program."""
    if not isinstance(module, torch.nn.Module):
        raise ModelImportError(f"expected a torch.nn.Module, got {type(module).__name__}")
    try:
        program = torch.export.export(module, tuple(example_inputs), strict=False)
    except Exception as exc:  # the exporter raises many types; the user gets one line
        raise ModelImportError(f"torch.export failed for {type(module).__name__}: {one_line(exc)}") from None
    return import_program(program, name=name or type(module).__name__)


def import_program(program: ExportedProgram, *, name: str = "") -> Graph:
    """Import an ``ExportedProgram`` (training or core ATen IR)."""
    lw = Lowering(name)
    env: dict[str, TValue] = {}
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs if hasattr(spec.arg, "name")}
    outputs: list[str] = []
    for node in program.graph_module.graph.nodes:
        try:
            if node.op == "placeholder":
                env[node.name] = _placeholder(lw, program, node, specs.get(node.name))
            elif node.op == "call_function":
                env[node.name] = _call(lw, env, node)
            elif node.op == "output":
                outputs = [_output(lw, env, v) for v in node.args[0] if v is not None]
        except EmbedError as exc:
            raise type(exc)(f"node {node.name!r} ({node.target}): {exc}") from None
        except Exception as exc:  # report which node, never a traceback
            raise ModelImportError(f"node {node.name!r} ({node.target}): {one_line(exc)}") from None
    return lw.build(list(dict.fromkeys(o for o in outputs if o)))


def _placeholder(lw: Lowering, program: ExportedProgram, node: torch.fx.Node, spec: Any) -> TValue:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return val  # a specialised Python scalar input
    shape, dtype = static_shape(val, node.name), dtype_of(val.dtype, node.name)
    kind = spec.kind if spec is not None else InputKind.USER_INPUT
    if kind == InputKind.USER_INPUT:
        return lw.builder.input(lw.fresh_name(node.name), shape, dtype)
    target = str(spec.target or node.name)
    if kind == InputKind.CONSTANT_TENSOR:
        value = program.constants.get(target)
        if isinstance(value, torch.Tensor) and value.device.type != "meta" and value.numel() <= 64:
            return lw.const(value.detach().reshape(-1).double().tolist(), dtype, shape)
    return lw.builder.param(lw.fresh_name(target), shape, dtype)


def _call(lw: Lowering, env: dict[str, TValue], node: torch.fx.Node) -> TValue:
    if node.target is operator.getitem:
        source, index = node.args
        return env[source.name][index]  # type: ignore[index, union-attr]
    n = TorchNode(lw, env, node)
    converter = CONVERTERS.get(n.key)
    result = converter(n) if converter is not None else None
    return n.as_opaque() if result is None else result


def _output(lw: Lowering, env: dict[str, TValue], value: Any) -> str:
    if not isinstance(value, torch.fx.Node):
        raise ModelImportError(f"the module returns a {type(value).__name__}, not a tensor")
    result = env[value.name]
    if not isinstance(result, str):
        raise ModelImportError(f"output {value.name!r} is not a tensor the importer could map")
    return result
