"""Fitted state (named numpy arrays) in a file tunebank writes and reads back without pickle: an ``.npz`` with a
JSON header that names its format. Encoders and cost models are stored so."""

import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

HEADER = "__header__"


def state_digest(prefix: str, state: Mapping[str, np.ndarray]) -> str:
    """A 12-character digest of ``prefix`` and every array of ``state`` (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256(prefix.encode())
    for key, value in sorted(state.items()):
        array = np.ascontiguousarray(value)
        digest.update(f"|{key}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:12]


def save_arrays(path: Path, header: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> Path:
    """Write ``header`` (JSON, with a ``format``) and ``state`` to ``path``; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **{HEADER: np.frombuffer(json.dumps(dict(header)).encode(), dtype=np.uint8)}, **state)
    path.write_bytes(buffer.getvalue())
    return path


def load_arrays(path: Path, fmt: str, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, state) of a file ``save_arrays`` wrote in format ``fmt``; ``ValueError`` naming ``what`` (e.g.
    "encoder file") when it cannot be read or is of another format."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data[HEADER]).decode())
            state = {k: data[k] for k in data.files if k != HEADER}
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot read {what} {path}: {e}") from None
    if header.get("format") != fmt:
        raise ValueError(f"{path} is not a {fmt} file")
    return header, state
