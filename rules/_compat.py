"""PyYAML, with an install hint instead of a bare traceback when it is missing."""

from __future__ import annotations

try:
    import yaml
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError("llmslo.rules needs PyYAML: pip install 'llmslo[rules]'", name="yaml") from exc

__all__ = ["yaml"]
