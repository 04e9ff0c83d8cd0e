"""Running a plan inside PyTorch: ``PlanModule(plan, params)`` is an ``nn.Module`` whose forward runs the model's
subgraphs in order, each eagerly or as its tuned kernel, on the caller's tensors.

* Kernels launch on the tensors themselves (zero copy): the cpu backend's shared library gets their data
  pointers; the cuda backend's kernels (CuPy) and vendor GEMMs get CuPy views of them
  (``__cuda_array_interface__``) and run on PyTorch's current stream. Inputs a kernel reads are made contiguous
  first (a no-op unless an eager view left them strided); outputs and scratch are allocated per call, scratch
  uninitialized (no memset launch): validation hands every kernel poisoned scratch, so none reads what it did not
  write.
* A layout step folded into a kernel step (``transforms.plan``) runs nothing: that kernel reads or writes through
  the layout's index map. Scratch for a temporary the folded program no longer touches is one element.
* An attention step runs PyTorch's fused scaled dot-product attention on the query, key, value (and mask) of its
  three subgraphs (``transforms.attention``), causal without reading the mask where the bound weights hold a causal
  one; its score and softmax steps run nothing.
* On cuda, with static shapes (always, in tunebank's IR), the whole forward is captured as a CUDA graph and
  replayed: eager ops and kernels alike, with no Python or launch overhead. A graph per input address set reads
  the caller's tensors where they lie, and its outputs are handed out without a copy while the caller holds no
  earlier ones; otherwise inputs are copied in and outputs cloned out (``transforms.graph_replays``). A forward
  that cannot be captured runs uncaptured, and so does a plan whose ``cuda_graph`` is off (optimize turns it off
  where the graph does not beat launching the steps one by one).

Every plan is verified (``transforms.plan.verify``) before anything of it runs.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from embed.eager import TORCH_DTYPES, EagerProgram
from embed.ir import Graph, TensorRole
from embed.loopnest import LoopProgram
from embed.lower import lower
from embed.partition import partition_nodes
from embed.subgraph import Subgraph
from transforms import attention
from transforms.build import Source, build
from transforms.codegen import Kernel
from transforms.codegen.kernel import compute_dtype
from transforms.codegen.signature import signature
from transforms.graph_replays import GraphReplays
from transforms.plan import Parts, Plan, PlanError, verify
from transforms.run import Buffer
from transforms.views import kernel_program
from transforms.worker import c_scalar, cpu_functions, cuda_functions

Env = dict[str, torch.Tensor]
StepFn = Callable[[Env], None]
_SCRATCH = {"float32": torch.float32, "float64": torch.float64}


def _eager_step(subgraph: Subgraph, device: torch.device) -> StepFn:
    program = EagerProgram(subgraph.graph, device)
    names = list(zip(subgraph.graph.inputs, subgraph.source_inputs, strict=True))
    outs = list(zip(subgraph.graph.outputs, subgraph.source_outputs, strict=True))

    def run(env: Env) -> None:
        results = program({inner: env[outer] for inner, outer in names})
        for inner, outer in outs:
            env[outer] = results[inner]

    return run


class _Arguments:
    """Where each kernel argument comes from: a model tensor read or written by name, or scratch."""

    def __init__(self, subgraph: Subgraph, *, folded: bool = False) -> None:
        program = lower(subgraph.graph)
        sig = signature(program, compute_dtype(program))
        used = _touched(kernel_program(program, subgraph.kind, fold=folded))
        outer = dict(zip(subgraph.graph.inputs, subgraph.source_inputs, strict=True))
        outer |= dict(zip(subgraph.graph.outputs, subgraph.source_outputs, strict=True))
        by_arg = {arg: buffer for buffer, arg in sig.names.items()}
        self.inputs: dict[str, str] = {}  # argument -> model tensor it reads
        self.outputs: dict[str, tuple[str, tuple[int, ...], torch.dtype]] = {}
        self.scratch: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for arg in sig.args:
            buffer = by_arg[arg.name]
            if arg.kind == "input":
                self.inputs[arg.name] = outer[buffer]
            elif arg.kind == "output":
                tensor = subgraph.graph.tensors[buffer]
                self.outputs[arg.name] = (outer[buffer], tensor.shape, TORCH_DTYPES[tensor.dtype])
            else:
                self.scratch[arg.name] = (arg.shape if buffer in used else (1,), _SCRATCH[arg.dtype])

    def bind(self, env: Env, device: torch.device) -> dict[str, torch.Tensor]:
        """Tensors for every argument: inputs from ``env`` (contiguous), new outputs (also put in ``env``) and
        uninitialized scratch (validation poisons it: no kernel reads scratch it has not written)."""
        args = {a: env[name].contiguous() for a, name in self.inputs.items()}
        for a, (name, shape, dtype) in self.outputs.items():
            args[a] = env[name] = torch.empty(shape, dtype=dtype, device=device)
        for a, (shape, dtype) in self.scratch.items():
            args[a] = torch.empty(shape, dtype=dtype, device=device)
        return args


def _touched(program: LoopProgram) -> set[str]:
    return {t for n in program.nests for t in (n.statement.write.tensor, *(a.tensor for a in n.loads()))}


def _folded_step(env: Env) -> None:
    """A step that another runs (a layout step as a kernel's index maps, an attention's score or softmax step):
    nothing to do here."""


def _attention_step(graph: Graph, parts: Parts, n: int, params: Mapping[str, torch.Tensor]) -> StepFn:
    """The attention whose output matmul is step ``n``; ``is_causal`` where its mask is a weight holding a causal
    mask (checked on the weights bound, not those optimize saw)."""
    found = attention.match(graph, parts, n)
    assert found is not None  # verify() checked it
    is_causal = found.mask in params and attention.causal(params[found.mask])

    def run(env: Env) -> None:
        attention.run(found, env, is_causal=is_causal)

    return run


def _cpu_step(kernel: Kernel, artifact: str, arguments: _Arguments, device: torch.device) -> StepFn:
    calls = list(zip(cpu_functions(artifact, kernel.launches), kernel.launches, strict=True))

    def run(env: Env) -> None:
        tensors = arguments.bind(env, device)
        for function, launch in calls:
            function(*(ctypes.c_void_p(tensors[a.name].data_ptr()) if isinstance(a, Buffer) else c_scalar(a)
                       for a in launch.args))

    return run


def _cupy_view(tensor: torch.Tensor) -> Any:
    import cupy

    if tensor.dtype == torch.bfloat16:  # CuPy has no bfloat16: the kernel sees the same 16 bits
        tensor = tensor.view(torch.int16)
    return cupy.asarray(tensor)


def _cuda_step(kernel: Kernel, artifact: str, arguments: _Arguments, device: torch.device) -> StepFn:
    import cupy
    import numpy as np

    calls = list(zip(cuda_functions(artifact, kernel.launches), kernel.launches, strict=True))

    def run(env: Env) -> None:
        tensors = arguments.bind(env, device)
        views = {a: _cupy_view(t) for a, t in tensors.items()}
        stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(device))
        for function, launch in calls:
            args = tuple(views[a.name] if isinstance(a, Buffer) else np.dtype(a.dtype).type(a.value)
                         for a in launch.args)
            function(launch.grid, launch.block, args, shared_mem=launch.shared_bytes, stream=stream)

    return run


def compile_kernels(kernels: Sequence[Kernel | None], backend: str, cache_dir: Path) -> list[str | None]:
    """The compiled artifact of each kernel (None where there is none), built in parallel and cached; PlanError
    when one fails to compile here."""
    arch = ""
    if backend == "cuda":
        from transforms.compilers import cuda

        arch = cuda.device_arch()
    todo = [k for k in kernels if k is not None]
    built = iter(build([Source(k.code, backend, arch=arch) for k in todo], cache_dir=cache_dir))
    artifacts: list[str | None] = []
    for kernel in kernels:
        if kernel is None:
            artifacts.append(None)
            continue
        result = next(built)
        if not result.ok:
            raise PlanError(f"a kernel of the plan failed to compile here: {result.error_kind}: "
                            f"{(result.error or '').splitlines()[0] if result.error else ''}")
        artifacts.append(result.artifact)
    return artifacts


class PlanModule(torch.nn.Module):
    """A plan as a module: ``forward(*inputs)`` takes the model's inputs (in graph order) and returns its output
    (a tuple when the model has several). ``params`` maps every weight of the graph to its tensor.
    ``eager_model``: the user's own module, which an all-eager plan without a CUDA graph (the plan that says "run
    the model as it is") calls instead of interpreting the graph op by op."""

    def __init__(self, plan: Plan, params: Mapping[str, torch.Tensor], *, cache_dir: Path,
                 device: str | torch.device | None = None, cuda_graph: bool = True,
                 eager_model: Callable[..., Any] | None = None) -> None:
        super().__init__()
        backend = plan.target.backend
        if backend == "cuda" and not torch.cuda.is_available():
            raise PlanError("this plan is for the cuda backend and PyTorch sees no GPU here")
        if backend not in ("cpu", "cuda"):
            raise PlanError(f"unknown plan backend {backend!r}")
        self.plan = plan
        self.device = torch.device(device or ("cuda" if backend == "cuda" else "cpu"))
        graph = plan.graph
        self.input_names = [n for n in graph.inputs if graph.tensors[n].role == TensorRole.INPUT]
        missing = [n for n in graph.inputs if graph.tensors[n].role == TensorRole.PARAM and n not in params]
        if missing:
            raise PlanError(f"{len(missing)} weights of the model are not given, e.g. {missing[0]!r}")
        self.params = {n: params[n].to(self.device) for n in graph.inputs if n not in self.input_names}
        subgraphs, kernels = verify(plan)
        for subgraph, kernel in zip(subgraphs, kernels, strict=True):
            if kernel is None and not subgraph.tunable:
                _check_runs_eagerly(subgraph)
        artifacts = compile_kernels(kernels, backend, cache_dir)
        make = _cuda_step if backend == "cuda" else _cpu_step
        parts = partition_nodes(graph) if any(step.impl == "attention" for step in plan.steps) else []
        self.steps: list[StepFn] = [
            _folded_step if step.impl == "folded" else _attention_step(graph, parts, n, self.params)
            if step.impl == "attention" else _eager_step(s, self.device) if k is None
            else make(k, a, _Arguments(s, folded=bool(step.folded)), self.device)
            for n, (s, k, a, step) in enumerate(zip(subgraphs, kernels, artifacts, plan.steps, strict=True))
        ]
        self.use_cuda_graph = cuda_graph and plan.cuda_graph and self.device.type == "cuda"
        self.eager_model = eager_model if not plan.tuned and not self.use_cuda_graph else None
        self.graphs: GraphReplays | None = None

    def run(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """One pass over the steps, uncaptured: the model's outputs in graph order."""
        env: Env = dict(self.params)
        env.update(zip(self.input_names, inputs, strict=True))
        for step in self.steps:
            step(env)
        return [env[name] for name in self.plan.graph.outputs]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.eager_model is not None:
            return self.eager_model(*inputs)
        inputs = tuple(self._checked(inputs))
        with torch.no_grad():
            outputs = self._replay(inputs) if self.use_cuda_graph else self.run(*inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _checked(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        graph = self.plan.graph
        if len(inputs) != len(self.input_names):
            raise PlanError(f"the model takes {len(self.input_names)} inputs, got {len(inputs)}")
        out = []
        for name, value in zip(self.input_names, inputs, strict=True):
            spec = graph.tensors[name]
            if tuple(value.shape) != spec.shape:
                raise PlanError(f"input {name!r} has shape {list(value.shape)}; the plan was made for "
                                f"{list(spec.shape)}")
            out.append(value.to(self.device, TORCH_DTYPES[spec.dtype]))
        return out

    def _replay(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.graphs is None:
            self.graphs = GraphReplays(lambda values: self.run(*values), self.device, warm_up=self._warm_up)
        try:
            return self.graphs(inputs)
        except Exception as e:  # an op that cannot be captured: run without the graph from now on
            warnings.warn(f"tunebank: the plan of {self.plan.graph.name!r} runs without a CUDA graph "
                          f"({type(e).__name__}: {e})", stacklevel=3)  # named: Python shows a repeated text once
            self.use_cuda_graph, self.graphs = False, None
            torch.cuda.synchronize(self.device)
            return self.run(*inputs)

    def _warm_up(self, inputs: Sequence[torch.Tensor]) -> None:
        """Two uncaptured runs on a side stream: lazy module loads, cuBLAS handles, allocator pools."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run(*inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)


def _check_runs_eagerly(subgraph: Subgraph) -> None:
    opaque = [n.attrs.get("name") for n in subgraph.graph.nodes if n.op == "opaque"]
    if opaque:
        raise PlanError(f"the model holds op {str(opaque[0])[:80]!r}, outside tunebank's op set: its plan can be "
                        "reported but not run")
