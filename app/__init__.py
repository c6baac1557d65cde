"""llmslo.app: the Streamlit app over a store (``llmslo app --db STORE``; extra ``app``).

It is run, not imported: ``llmslo app`` serves ``streamlit_app.py`` on 127.0.0.1, whose pages (Overview,
Latency, Survivor bias, Anomalies, GPU, Rollouts, Data) compute every figure through ``llmslo.analysis``'s
public API over the rows selected in the sidebar (docs/app.md). The package has no public Python API.
"""

__all__: list[str] = []
