"""The Python client of the HTTP service: send a model, wait for its job, get the plan as a runnable module.

    import tunebank
    client = tunebank.Client("http://127.0.0.1:8000", api_key="tb_...")
    job = client.optimize("model.onnx")                    # or a torch module with example inputs, or an IR .json
    print(job.report)                                      # typed, per subgraph: source, choice, times vs eager
    fast = client.plan(job.id)                             # what tunebank.load gives: a PlanModule
    client.search(subgraph="3f2a...")                      # nearest stored subgraphs and their recipes
    client.stats()

Only ONNX bytes or an IR document cross the wire, never a pickle: a torch module is exported to the IR here, and its
weights stay here (``plan`` binds them). Requests that get 429 or a 5xx, or no answer, are retried with exponential
backoff (honouring ``Retry-After``); other errors raise :class:`ApiError` with the server's message. This module
never imports the service: it talks HTTP only.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tunebank.reports import Job, SearchResult, Stats

if TYPE_CHECKING:
    import torch

    from transforms.plan_runtime import PlanModule

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


class ApiError(Exception):
    """The service refused a request: ``status`` (HTTP), ``error`` (a short phrase), ``detail`` (what to fix)."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail


class Client:
    """A client of ``url`` authenticating with ``api_key`` (``Authorization: Bearer``; none on a loopback server
    that has no key yet). ``retries``: attempts after the first on 429, 5xx and lost connections; ``progress``:
    show a progress bar on stderr while waiting for a job; ``cache_dir``: where plans' kernels are compiled
    (default: the kernel cache under ``TUNEBANK_DATA_DIR``)."""

    def __init__(self, url: str = "http://127.0.0.1:8000", api_key: str | None = None, *, timeout: float = 120.0,
                 retries: int = 5, backoff_s: float = 0.5, progress: bool = True, cache_dir: str | Path | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.retries, self.backoff_s, self.progress = retries, backoff_s, progress
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._weights: dict[int, dict[str, torch.Tensor]] = {}  # job id -> the module's own weights (never sent)
        self._on_close: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        self._http.close()
        while self._on_close:
            self._on_close.pop()()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise ApiError(0, "unreachable", f"{self.url}: {type(e).__name__}: {e}") from None
                self._sleep(attempt, None)
                continue
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self._sleep(attempt, response.headers.get("Retry-After"))
                continue
            if response.status_code >= 400:
                raise _error(response)
            return response
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        wait = self.backoff_s * 2**attempt * (1 + random.random() / 4)
        if retry_after is not None and retry_after.strip().isdigit():
            wait = max(wait, float(retry_after))
        time.sleep(min(wait, MAX_BACKOFF_S))

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- jobs and plans ----------------------------------------------------------------------------------------

    def optimize(self, model: Any, example_inputs: Sequence[torch.Tensor] | None = None, *, wait: bool = True,
                 device_class: str | None = None, k: int = 5, margin: float = 0.05,
                 timeout_s: float | None = None) -> Job:
        """Send ``model`` (an ``.onnx`` or IR ``.json`` path, a zoo name, a ``Graph``, or a torch module with
        ``example_inputs``) to be optimized; the job, finished when ``wait``. The same model sent again for the same
        device returns the job already made."""
        data, filename, weights = _wire(model, example_inputs)
        form = {"k": str(k), "margin": str(margin), **({"device_class": device_class} if device_class else {})}
        answer = self._json("POST", "/v1/optimize", files={"model": (filename, data, "application/octet-stream")},
                            data=form)
        job_id = int(answer["job_id"])
        if weights is not None:
            self._weights[job_id] = weights
        return self.wait(job_id, timeout_s=timeout_s) if wait else self.job(job_id)

    def job(self, job_id: int) -> Job:
        return Job.from_json(self._json("GET", f"/v1/jobs/{int(job_id)}"))

    def jobs(self, *, limit: int = 20, offset: int = 0, status: str | None = None) -> list[Job]:
        """This key's jobs, newest first."""
        params: dict[str, Any] = {"limit": limit, "offset": offset, **({"status": status} if status else {})}
        return [Job.from_json(j) for j in self._json("GET", "/v1/jobs", params=params)["jobs"]]

    def wait(self, job_id: int, *, poll_s: float = 0.5, timeout_s: float | None = None) -> Job:
        """Poll job ``job_id`` until it finished (a progress bar on stderr with ``progress``); ``TimeoutError``
        after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        bar = _Bar(job_id) if self.progress else None
        try:
            while True:
                job = self.job(job_id)
                if bar is not None:
                    bar.update(job)
                if job.done:
                    return job
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {job_id} is still {job.status} after {timeout_s} s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()

    def download_plan(self, job_id: int, path: str | Path) -> Path:
        """Save the plan file (``.tbplan``) of a succeeded optimize job to ``path``. When this client sent the job
        a torch module (whose weights stayed here), the file gets those weights, so ``tunebank.load(path)`` runs it
        as it is."""
        path = self._fetch_plan(job_id, Path(path))
        weights = self._weights.get(int(job_id))
        if weights is not None:
            from safetensors.torch import save

            from transforms.plan import read_plan, save_plan

            plan, blob = read_plan(path)
            if blob is None:
                save_plan(plan, path, save({n: t.to("cpu").contiguous() for n, t in weights.items()}))
        return path

    def _fetch_plan(self, job_id: int, path: Path) -> Path:
        path.write_bytes(self._request("GET", f"/v1/jobs/{int(job_id)}/plan").content)
        return path

    def plan(self, job_id: int, *, params: Mapping[str, torch.Tensor] | None = None,
             device: str | None = None) -> PlanModule:
        """The plan of a succeeded optimize job as a runnable module, like ``tunebank.load``: bound to ``params``,
        else to the weights the plan file carries, else to the torch module's own weights this client sent the
        job for. Raises ``PlanError`` for a plan this machine cannot run, or one that fails verification."""
        from transforms.plan import PlanError, read_plan
        from transforms.plan_runtime import PlanModule

        with tempfile.TemporaryDirectory(prefix="tunebank-plan-") as folder:
            plan, blob = read_plan(self._fetch_plan(job_id, Path(folder) / f"job-{int(job_id)}.tbplan"))
        if params is None and blob is not None:
            params = _decode_weights(blob, f"job {job_id}'s plan")
        params = params if params is not None else self._weights.get(int(job_id))
        if params is None:
            raise PlanError(f"job {job_id}'s plan holds no weights (the model was sent as an IR document): "
                            "pass params={name: tensor}")
        return PlanModule(plan, params, cache_dir=self._cache_dir(), device=device)

    def _cache_dir(self) -> Path:
        if self.cache_dir is None:
            from tunebank.settings import Settings

            self.cache_dir = Settings().data_dir / "kernels"
        return self.cache_dir

    # -- the database ------------------------------------------------------------------------------------------

    def subgraph(self, ref: int | str) -> dict[str, Any]:
        """A stored subgraph by id or structural hash: IR, features, best recipe per device."""
        return self._json("GET", f"/v1/subgraphs/{ref}")

    def search(self, subgraph: int | str | None = None, *, ir: Any = None, device_class: str | None = None,
               k: int = 5) -> SearchResult:
        """The ``k`` nearest stored subgraphs of a stored ``subgraph`` (id or structural hash), or of each
        distinct subgraph of ``ir`` (a ``Graph``, a graph document, or a path to one)."""
        body: dict[str, Any] = {"k": k, **({"device_class": device_class} if device_class else {})}
        if subgraph is not None:
            body["subgraph"] = str(subgraph)
        if ir is not None:
            body["ir"] = _ir_document(ir)
        return SearchResult.from_json(self._json("POST", "/v1/search", json=body))

    def stats(self) -> Stats:
        return Stats.from_json(self._json("GET", "/v1/stats"))

    def ingest(self, measurements: Iterable[Mapping[str, Any]], *,
               devices: Iterable[Mapping[str, Any]] = ()) -> dict[str, int]:
        """Send measurements (subgraph hash, recipe, device, toolchain, median_s, ...); returns received, inserted
        and duplicates (measurements the server had already: sending twice is safe)."""
        body = {"measurements": [dict(m) for m in measurements], "devices": [dict(d) for d in devices]}
        return self._json("POST", "/v1/measurements", json=body)


def _error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        return ApiError(response.status_code, str(body.get("error", "error")), str(body.get("detail", "")))
    except (ValueError, AttributeError):
        return ApiError(response.status_code, response.reason_phrase or "error", response.text[:500])


def _wire(model: Any, example_inputs: Sequence[Any] | None) -> tuple[bytes, str, dict[str, Any] | None]:
    """What is sent for ``model`` (ONNX bytes or an IR document), its file name, and the weights kept here."""
    import torch

    from embed.ir import Graph

    if isinstance(model, Graph):
        return model.to_json().encode(), f"{model.name or 'model'}.json", None
    if isinstance(model, torch.nn.Module):
        from embed.importers import import_module

        if example_inputs is None:
            raise ValueError("a torch module needs example_inputs to be exported")
        graph = import_module(model, tuple(example_inputs), name=type(model).__name__)
        weights = {n: t.detach() for n, t in [*model.named_parameters(), *model.named_buffers()]}
        return graph.to_json().encode(), f"{type(model).__name__}.json", weights
    spec = str(model)
    if spec.lower().endswith((".onnx", ".json")) or Path(spec).is_file():
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"{spec}: no such model file")
        return (_onnx_bytes(path) if path.suffix.lower() == ".onnx" else path.read_bytes()), path.name, None
    from embed import zoo

    torch.manual_seed(0)  # the zoo's seeded weights, as the service's own zoo runs draw them
    module, inputs = zoo.build(spec.removeprefix("zoo:"), device="cpu")
    return _wire(module, inputs)


def _onnx_bytes(path: Path) -> bytes:
    """The ONNX file's bytes, with its external data (the weights in files beside it, as ``torch.onnx.export``
    writes them) read in: the server sees only what is sent."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    data = path.read_bytes()
    try:
        proto = onnx.load_model_from_string(data)
    except Exception:  # noqa: BLE001 (not ONNX: the server says what is wrong with it)
        return data
    if not any(uses_external_data(t) for t in proto.graph.initializer):
        return data
    onnx.load_external_data_for_model(proto, str(path.parent))
    return proto.SerializeToString()


def _ir_document(ir: Any) -> Any:
    import json

    from embed.ir import Graph

    if isinstance(ir, Graph):
        return json.loads(ir.to_json())
    if isinstance(ir, str | Path) and Path(ir).is_file():
        return json.loads(Path(ir).read_text())
    return ir


def _decode_weights(blob: bytes, what: str) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    from transforms.plan import PlanError

    try:
        return load(blob)
    except (SafetensorError, ValueError) as e:
        raise PlanError(f"{what}: its weights are unreadable ({e})") from None


class _Bar:
    """A one-line progress bar of a job on stderr (rich), shown only on a terminal."""

    def __init__(self, job_id: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.progress = Progress(TextColumn("job {task.fields[job]} {task.description}"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=console,
                                 transient=True, disable=not console.is_terminal)
        self.task = self.progress.add_task("queued", total=1.0, job=job_id)
        self.progress.start()

    def update(self, job: Job) -> None:
        self.progress.update(self.task, completed=job.progress, description=job.status)

    def close(self) -> None:
        self.progress.stop()
        sys.stderr.flush()
