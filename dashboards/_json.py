"""Dashboard data -> JSON text, byte for byte the same for the same input."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final


class _JsonNull:
    """A ``null`` that is meant: :func:`render_json` drops ``None`` values, and writes this one as ``null``."""

    _instance: _JsonNull | None = None

    def __new__(cls) -> _JsonNull:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "JSON_NULL"


JSON_NULL: Final = _JsonNull()
"""Written as ``null``. Grafana needs one: the first threshold step, whose value is minus infinity."""


def strip_nulls(value: Any) -> Any:
    """``value`` without ``None`` (dict entries and list items), with :data:`JSON_NULL` turned into ``None``."""
    if value is JSON_NULL:
        return None
    if isinstance(value, Mapping):
        return {str(k): strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [strip_nulls(v) for v in value if v is not None]
    return value


def render_json(data: Mapping[str, Any]) -> str:
    """Deterministic JSON text: nulls stripped (:func:`strip_nulls`), keys sorted, two-space indent, UTF-8
    characters kept, one trailing newline."""
    return json.dumps(strip_nulls(data), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
