"""A model's own weights by graph name, and weights as safetensors bytes (what a plan file carries; never a pickle).

    params = model_weights("model.onnx", graph)      # ONNX initializers; zoo: seeded random init; a module: its own
    blob = encode_weights(params); params = decode_weights(blob)
"""

from collections.abc import Mapping
from pathlib import Path

import torch

from embed.ir import Graph, TensorRole
from transforms.plan import PlanError

ModelSpec = str | Path | Graph | torch.nn.Module


def model_weights(model: ModelSpec, graph: Graph) -> dict[str, torch.Tensor] | None:
    """The model's weights by graph name, when it has them: a module's parameters and buffers, a zoo model built
    with seeded random weights, an ONNX file's initializers; None for an IR document or a bare graph."""
    if isinstance(model, torch.nn.Module):
        return named_tensors(model)
    spec = str(model) if not isinstance(model, Graph) else ""
    if spec.lower().endswith(".onnx"):
        return _onnx_weights(Path(spec), graph)
    if spec and not spec.lower().endswith(".json"):
        from embed import zoo

        torch.manual_seed(0)
        module, _ = zoo.build(spec.removeprefix("zoo:"), device="cpu")
        return named_tensors(module)
    return None


def named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach() for n, t in [*module.named_parameters(), *module.named_buffers()]}


def _onnx_weights(path: Path, graph: Graph) -> dict[str, torch.Tensor] | None:
    import onnx
    from onnx import numpy_helper

    wanted = {n for n in graph.inputs if graph.tensors[n].role == TensorRole.PARAM}
    proto = onnx.load(str(path), load_external_data=True)
    found = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in proto.graph.initializer
             if i.name in wanted}
    return found if set(found) == wanted else None


def encode_weights(params: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({n: t.detach().to("cpu").contiguous() for n, t in params.items()})


def decode_weights(blob: bytes, what: str) -> dict[str, torch.Tensor]:
    """The tensors in safetensors ``blob``; PlanError naming ``what`` when it is not readable."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(blob)
    except (SafetensorError, ValueError) as e:
        raise PlanError(f"{what}: its weights are unreadable ({e})") from None
