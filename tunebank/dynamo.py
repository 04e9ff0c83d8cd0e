"""``torch.compile(model, backend="tunebank")``: each graph TorchDynamo captures is optimized into a plan on this
machine and runs as its ``PlanModule``; a graph tunebank cannot import or run stays with PyTorch (a warning says
why). Registered through the ``torch_dynamo_backends`` entry point, so ``torch._dynamo.list_backends()`` shows it.
"""

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from embed.ir import Graph, TensorRole


def _weights_as_params(graph: Graph, names: set[str]) -> Graph:
    """``graph`` with the inputs in ``names`` marked as weights (Dynamo lifts parameters into graph inputs)."""
    tensors = {n: t.model_copy(update={"role": TensorRole.PARAM}) if n in names else t
               for n, t in graph.tensors.items()}
    return graph.model_copy(update={"tensors": tensors})


def tunebank_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                     mode: str | None = None) -> Callable[..., Any]:
    """The compiled callable of one captured graph. ``torch.compile(..., options={...})`` passes keyword arguments of
    ``tunebank.optimize`` (``backend``, ``k``, ``margin``...); ``mode`` is ignored."""
    from tunebank import api

    options = dict(options or {})
    try:
        if not all(isinstance(t, torch.Tensor) for t in example_inputs):
            raise ValueError("the graph takes non-tensor inputs (dynamic shapes)")
        graph = api.import_model(gm, example_inputs)
        if len(graph.inputs) != len(example_inputs):
            raise ValueError(f"the imported graph has {len(graph.inputs)} inputs, Dynamo passes {len(example_inputs)}")
        weights = {n: t for n, t in zip(graph.inputs, example_inputs, strict=True)
                   if isinstance(t, torch.nn.Parameter)}
        graph = _weights_as_params(graph, set(weights))
        positions = [i for i, n in enumerate(graph.inputs) if n not in weights]
        result = api.optimize(graph, [example_inputs[i] for i in positions], params=dict(weights), **options)
        module = result.module or api.bind(result.plan, dict(weights), settings=options.get("settings"))
    except Exception as e:  # any graph tunebank cannot take runs as PyTorch would run it
        warnings.warn(f"tunebank: this graph runs in eager PyTorch ({type(e).__name__}: {e})", stacklevel=2)
        return gm.forward

    def run(*args: Any) -> tuple[torch.Tensor, ...]:
        out = module(*(args[i] for i in positions))
        return out if isinstance(out, tuple) else (out,)

    return run
