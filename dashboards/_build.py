"""Both dashboards at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmslo.dashboards._dashboard import Dashboard
from llmslo.dashboards._serving import serving_dashboard
from llmslo.dashboards._slo import slo_dashboard

if TYPE_CHECKING:
    from llmslo.rules import Model


def build_dashboards(model: Model | None = None) -> tuple[Dashboard, Dashboard]:
    """The serving and SLO dashboards, of a spec's ``model`` when given (see :func:`serving_dashboard`,
    :func:`slo_dashboard`)."""
    return serving_dashboard(model), slo_dashboard(model)
