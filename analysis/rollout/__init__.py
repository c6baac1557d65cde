"""Rolling updates, measured: update records in the store, version comparison during the overlap window,
and wait-budget advice for the drain (``llmslo rollout ...``, ``llmslo drain ...``)."""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.rollout", "duckdb", "numpy", "scipy")

# isort: split
# ---- update records (analysis/rollout/_records.py) ---------------------------------------------------

# isort: split
# ---- version comparison (analysis/rollout/_compare.py) -----------------------------------------------

# isort: split
# ---- wait-budget advice and drain-configuration check (analysis/rollout/_advice.py) ------------------

__all__: list[str] = []
