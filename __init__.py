"""llmslo: observability and SLO analytics for LLM inference serving.

Subpackages:
- ``llmslo.telemetry``: imported into servers (request-summary contract; standard library only).
- ``llmslo.analysis``: request-summary store (DuckDB) and latency, goodput and survivor-bias analysis.
- ``llmslo.rules``, ``llmslo.dashboards``, ``llmslo.app``: rule generation, dashboards, web app.
- ``llmslo.cli``: the ``llmslo`` command.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
