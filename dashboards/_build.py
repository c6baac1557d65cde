"""Both dashboards at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmslo.dashboards._dashboard import Dashboard
from llmslo.dashboards._engine import engine_dashboard
from llmslo.dashboards._serving import serving_dashboard
from llmslo.dashboards._slo import slo_dashboard

if TYPE_CHECKING:
    from llmslo.engines import EngineProfile
    from llmslo.rules import Model


def build_dashboards(model: Model | None = None, engine: EngineProfile | None = None) -> tuple[Dashboard, Dashboard]:
    """The serving and SLO dashboards, of a spec's ``model`` when given (see :func:`serving_dashboard`,
    :func:`slo_dashboard`). Over an inference engine's own series when ``engine`` is given or the model was
    built for one: the engine's serving dashboard (:func:`engine_dashboard`) and the SLO dashboard of its rules."""
    if engine is None and model is not None:
        engine = model.engine
    if engine is not None:
        return engine_dashboard(engine, model), slo_dashboard(model, engine)
    return serving_dashboard(model), slo_dashboard(model)
