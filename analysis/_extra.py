"""The install hint of the ``analysis`` extra, checked by each subpackage for what it needs."""

from __future__ import annotations

import importlib.util

__all__ = ["require"]


def require(package: str, *modules: str) -> None:
    """Raise :class:`ModuleNotFoundError` with an install hint unless every module in ``modules`` is
    importable (checked without importing it). ``package`` names the subpackage that needs them."""
    for name in modules:
        if importlib.util.find_spec(name) is None:  # pragma: no cover - exercised only without the extra
            raise ModuleNotFoundError(
                f"{package} needs the 'analysis' extra ({name} is missing): pip install 'llmslo[analysis]'",
                name=name,
            )
