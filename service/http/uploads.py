"""Models a client sends: ONNX bytes or an IR document, checked before a job is queued. Nothing a client sends is
executed or unpickled: ONNX is parsed as protobuf and IR as JSON by ``embed.importers``, within the model limits.

Each upload is kept as ``uploads/SHA256/model.onnx`` (or ``model.json``), alone in its folder, so external data an
ONNX file names can only be a file of that folder, and the same bytes sent twice are stored once."""

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from embed.errors import EmbedError, ModelImportError
from embed.importers import load_model
from embed.ir import Graph
from service.http.config import ServerConfig
from service.http.errors import BadRequest, PayloadTooLarge, Unprocessable

Format = Literal["onnx", "ir"]


@dataclass(frozen=True)
class Upload:
    path: Path
    digest: str  # sha256 of the bytes sent
    format: Format
    graph: Graph


def sniff(data: bytes, filename: str, declared: str | None) -> Format:
    """The format a client named, else the file name's extension, else the first byte (``{``: an IR document)."""
    if declared:
        if declared not in ("onnx", "ir"):
            raise Unprocessable(f"format {declared[:20]!r}: expected 'onnx' or 'ir'")
        return declared  # type: ignore[return-value]
    name = filename.lower()
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".json"):
        return "ir"
    return "ir" if data.lstrip()[:1] == b"{" else "onnx"


def accept_model(data: bytes, filename: str, declared: str | None, config: ServerConfig) -> Upload:
    """Store and import a model upload; ``BadRequest`` for bytes that are no model, ``Unprocessable`` for a model
    tunebank cannot take, ``PayloadTooLarge`` for one over the limits."""
    if len(data) > config.max_model_bytes:
        raise PayloadTooLarge(f"the model is {len(data)} bytes, over the limit of {config.max_model_bytes} "
                              "(TUNEBANK_MAX_MODEL_BYTES)")
    if not data.strip():
        raise BadRequest("the model file is empty")
    fmt = sniff(data, filename, declared)
    digest = hashlib.sha256(data).hexdigest()
    path = config.uploads_dir / digest / ("model.onnx" if fmt == "onnx" else "model.json")
    _store(path, data)
    try:
        graph = load_model(str(path), max_bytes=config.max_model_bytes)
    except ModelImportError as e:
        raise BadRequest(f"not a readable {'ONNX model' if fmt == 'onnx' else 'IR document'}: {_line(e)}") from None
    except EmbedError as e:
        raise Unprocessable(f"the model cannot be optimized: {_line(e)}") from None
    except (MemoryError, RecursionError) as e:
        raise Unprocessable(f"the model is too large or nested too deeply to import ({type(e).__name__})") from None
    if len(graph.nodes) > config.max_nodes:
        raise PayloadTooLarge(f"the model has {len(graph.nodes)} nodes, over the limit of {config.max_nodes} "
                              "(TUNEBANK_MAX_NODES)")
    for name, tensor in graph.tensors.items():
        if tensor.numel > config.max_tensor_elements:
            raise Unprocessable(f"tensor {name[:80]!r} has {tensor.numel} elements, over the limit of "
                                f"{config.max_tensor_elements} (TUNEBANK_MAX_TENSOR_ELEMENTS)")
    return Upload(path, digest, fmt, graph)


def _store(path: Path, data: bytes) -> None:
    if path.is_file() and path.stat().st_size == len(data):
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:500] if text else type(error).__name__
