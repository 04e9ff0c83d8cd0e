"""The Python API in embedded mode: optimize a model on this machine into a plan, run it, save it, load it.

    import tunebank
    fast = tunebank.compile(model, (x,))            # an nn.Module running the plan; fast.plan.report holds the report
    result = tunebank.optimize("model.onnx")         # Optimized: .plan, .report, .module
    tunebank.save(result, "model.tbplan")
    fast = tunebank.load("model.tbplan")             # refuses a corrupt, tampered or foreign plan

Settings (``TUNEBANK_*``, ``tunebank.settings.Settings``) say where the database, index, encoders and kernel cache
live; the device is this machine's GPU when CuPy sees one, else its cpu.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from db.index import IndexConfig
from db.index.vector_index import Metric
from db.migrate import upgrade
from db.session import Database
from embed.importers import import_module, load_model
from embed.ir import Graph
from service.embeddings import EncoderStore
from service.optimize import Context, OptimizeConfig, Optimized, Progress, worker_loads
from service.optimize import optimize as optimize_graph
from service.weights import ModelSpec, decode_weights, encode_weights, model_weights, named_tensors
from transforms.backends import resolve_backend
from transforms.plan import Plan, PlanError, read_plan, save_plan
from transforms.plan_runtime import PlanModule
from transforms.run import Worker
from tunebank.settings import Settings


def context(settings: Settings | None = None, *, backend: str = "auto") -> Context:
    """The embedded context: the settings' database (its schema created or upgraded), this machine's device on
    ``backend``, and the stores under the data dir."""
    from service.devices import detect_device, toolchain

    settings = settings or Settings()
    backend = resolve_backend(backend)
    database = Database(settings.resolved_database_url)
    upgrade(database.engine)
    index = IndexConfig(settings.index_factory, Metric(settings.index_metric), settings.index_search_params)
    return Context(database, detect_device(backend), toolchain(backend), backend, settings.data_dir / "kernels",
                   settings.index_dir, index, EncoderStore(settings.data_dir / "encoders"))


def import_model(model: ModelSpec, example_inputs: Sequence[torch.Tensor] | None = None, *,
                 max_bytes: int | None = None) -> Graph:
    """A graph from a zoo name (``zoo:NAME`` or ``NAME``), an ``.onnx`` or IR ``.json`` file, a ``Graph``, or a
    module with example inputs."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ValueError("a torch module needs example_inputs to be imported")
        return import_module(model, tuple(example_inputs))
    spec = str(model)
    limit = {"max_bytes": max_bytes} if max_bytes is not None else {}
    return load_model(spec if spec.startswith("zoo:") or spec.lower().endswith((".onnx", ".json"))
                      else f"zoo:{spec}", **limit)


def optimize(model: ModelSpec, example_inputs: Sequence[torch.Tensor] | None = None, *, backend: str = "auto",
             k: int = 5, margin: float = 0.05, time_model: bool = True, settings: Settings | None = None,
             progress: Progress | None = None, reference: Callable[..., object] | None = None,
             params: dict[str, torch.Tensor] | None = None, **options: Any) -> Optimized:
    """Optimize ``model`` on this machine: see ``service.optimize``. ``params``: the weights by graph name (by
    default the model's own, :func:`model_weights`); ``options``: other ``OptimizeConfig`` fields."""
    config = OptimizeConfig(k=k, margin=margin, time_model=time_model, **options)
    backend = resolve_backend(backend)
    with Worker() as worker:
        # the worker starts while the model is captured and the database opened
        worker.warm(worker_loads(backend))
        graph = import_model(model, example_inputs)
        params = params if params is not None else model_weights(model, graph)
        ctx = context(settings, backend=backend)
        device = torch.device("cuda" if ctx.backend == "cuda" else "cpu")
        inputs = [t.to(device) for t in example_inputs] if example_inputs is not None else None
        if params is not None:
            params = {n: t.to(device) for n, t in params.items()}
        try:
            return optimize_graph(graph, ctx, worker=worker, config=config, params=params, inputs=inputs,
                                  reference=reference, progress=progress, name=_name(model, graph))
        finally:
            ctx.database.dispose()


def _name(model: ModelSpec, graph: Graph) -> str:
    if isinstance(model, torch.nn.Module):
        return type(model).__name__
    return graph.name if isinstance(model, Graph) else str(model)


def compile(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], **options: Any) -> PlanModule:  # noqa: A001
    """``module`` optimized into a plan and bound to its own weights: an ``nn.Module`` with the same inputs and
    outputs (``.plan.report`` says what was chosen and the times against the module itself)."""
    result = optimize(module, example_inputs, reference=module, **options)
    return result.module or bind(result.plan, named_tensors(module), settings=options.get("settings"))


def bind(plan: Plan, params: dict[str, torch.Tensor], *, device: str | None = None,
         settings: Settings | None = None) -> PlanModule:
    """``plan`` as a runnable module over the weights ``params`` (kernels compiled into the settings' cache)."""
    settings = settings or Settings()
    return PlanModule(plan, params, cache_dir=settings.data_dir / "kernels", device=device)


def save(result: Optimized | PlanModule, path: str | Path) -> Path:
    """Write the plan (with the weights it is bound to, as safetensors) to ``path``."""
    return save_plan(result.plan, path, encode_weights(result.params) if result.params is not None else None)


def load(path: str | Path, *, params: dict[str, torch.Tensor] | None = None, device: str | None = None,
         settings: Settings | None = None) -> PlanModule:
    """The plan in file ``path`` as a runnable module, with its saved weights (or ``params``). Raises
    ``PlanError`` (one line) for a corrupt, tampered or foreign plan, or one for a backend this machine lacks."""
    plan, weights = read_plan(path)
    if params is None:
        if weights is None:
            raise PlanError(f"{Path(path).name} holds no weights; pass params={{name: tensor}}")
        params = decode_weights(weights, Path(path).name)
    return bind(plan, params, device=device, settings=settings)


__all__ = ["Optimized", "Plan", "PlanError", "PlanModule", "bind", "compile", "context", "import_model", "load",
           "optimize", "save"]
