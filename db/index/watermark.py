"""The watermark stored beside an index file: what it was built from (last embedding id, row count, config)
and a SHA-256 of the index file, so that a missing, stale or corrupt file is noticed on open."""

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = 1


@dataclass(frozen=True)
class Watermark:
    last_id: int
    count: int
    dim: int
    factory: str
    metric: str
    sha256: str

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps({"format": FORMAT, **asdict(self)}, indent=1).encode())

    @classmethod
    def load(cls, path: Path) -> "Watermark | None":
        """The watermark at ``path``; ``None`` when it is unreadable or of another format."""
        try:
            data = json.loads(path.read_bytes())
            if data.pop("format") != FORMAT:
                return None
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it over ``path``: readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
