"""Strict JSON for reports: non-finite floats become null, never ``Infinity`` or ``NaN``."""

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every non-finite float as None, in nested dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def strict_json(value: Any, indent: int | None = 1) -> str:
    """``value`` as JSON that every parser reads: non-finite floats as null, unknown objects as null."""
    return json.dumps(finite(value), default=lambda v: None, allow_nan=False, indent=indent)
